"""Accelerate's ``default_config.yaml`` (what ``accelerate config`` writes) as run settings.

Users of the Accelerate guide already hold this file and a hostfile; cpuaccel takes them
as they are. Each field is either mapped (nodes, ppn, head, port, precision, CCL workers,
hosts), accepted because its value changes nothing for cpuaccel, or named in a warning:
never silently dropped. A file that contradicts itself is an error naming the field.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from cpuaccel.config.project import Field, ProjectConfig
from cpuaccel.config.settings import DEFAULT_MASTER_PORT, MASTER_PORTS
from cpuaccel.errors import InventoryError, ProjectFileError
from cpuaccel.inventory import hostfile

CPU_TYPES = ("MULTI_CPU", "NO")
# Fields whose value, when it is the one `accelerate config` writes by default for CPU
# training, means nothing to cpuaccel; any other value is named in a warning.
NEUTRAL: dict[str, Any] = {
    "machine_rank": 0,
    "main_training_function": "main",
    "downcast_bf16": "no",
    "rdzv_backend": "static",
    "same_network": True,
    "tpu_env": [],
    "tpu_use_cluster": False,
    "tpu_use_sudo": False,
    "debug": False,
    "enable_cpu_affinity": False,
    "ipex": False,
    "gpu_ids": "all",
    "tpu_name": None,
    "tpu_zone": None,
    "commands": None,
    "command_file": None,
    "dynamo_config": {},
}
WHY: dict[str, str] = {
    "machine_rank": "cpuaccel starts every rank from this machine, so no machine has a rank",
    "same_network": "cpuaccel reaches every node by its inventory address",
    "enable_cpu_affinity": "cpuaccel pins ranks to cores itself (I_MPI_PIN_DOMAIN)",
    "rdzv_backend": "MPI starts the ranks; the rendezvous is MASTER_ADDR:MASTER_PORT",
    "dynamo_config": "torch.compile is the script's own choice",
}
_MPIRUN_KEYS = ("mpirun_hostfile", "mpirun_ccl")
_NO_SETTING = "cpuaccel has no such setting"


def _number(fields: dict[str, Field], name: str, source: str, low: int = 1) -> int | None:
    item = fields.get(name)
    if item is None:
        return None
    value = item.value
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ProjectFileError(
            f"{name}: {item.value!r} is not a whole number of {low} or more",
            source=source,
            line=item.line,
            hint=f"write e.g. {name}: {max(low, 1)}",
        )
    return value


# How the steps below report: a warning line (name, line, message), or the error to raise.
Warn = Callable[[str, int | None, str], None]
Fail = Callable[[str, str, str], ProjectFileError]


def from_accelerate(fields: dict[str, Field], source: str) -> ProjectConfig:
    config = ProjectConfig(source, kind="accelerate")

    def fail(name: str, message: str, hint: str) -> ProjectFileError:
        line = fields[name].line if name in fields else None
        return ProjectFileError(f"{name}: {message}", source=source, line=line, hint=hint)

    def warn(name: str, line: int | None, message: str) -> None:
        where = f"{source}:{line}" if line is not None else source
        config.warnings.append(f"{where}: {name}: {message}")

    distributed = _distributed_type(fields, fail)
    _world(fields, source, config, distributed, fail)
    _settings(fields, source, config, distributed, warn, fail)
    _mpirun(fields, source, config, warn)
    if distributed == "MULTI_CPU":
        _head(fields, source, config, warn)
    _warn_unmapped(fields, warn)
    return config


def _distributed_type(fields: dict[str, Field], fail: Fail) -> str:
    """The checked distributed_type ("MULTI_CPU" or "NO"), on this machine's own hosts."""
    env = fields.get("compute_environment")
    if env is not None and env.value != "LOCAL_MACHINE":
        raise fail(
            "compute_environment",
            f"{env.value!r}: cpuaccel launches on your own machines",
            "use compute_environment: LOCAL_MACHINE (accelerate config: 'This machine')",
        )
    kind = fields.get("distributed_type")
    distributed = str(kind.value) if kind is not None else "NO"
    if distributed not in CPU_TYPES:
        raise fail(
            "distributed_type",
            f"{distributed!r} is not CPU training",
            "use distributed_type: MULTI_CPU (several processes or machines) or 'NO'",
        )
    return distributed


def _world(
    fields: dict[str, Field], source: str, config: ProjectConfig, distributed: str, fail: Fail
) -> None:
    """nodes and ppn, from num_machines and num_processes (the total over all machines)."""
    machines = _number(fields, "num_machines", source) or 1
    processes = _number(fields, "num_processes", source) or 1
    if distributed == "NO":
        if machines != 1:
            raise fail(
                "num_machines",
                f"{machines} machines, but distributed_type 'NO' is one machine",
                "set distributed_type: MULTI_CPU, or num_machines: 1",
            )
        config.local_only = True
    elif processes % machines:
        raise fail(
            "num_processes",
            f"{processes} processes cannot be split evenly over num_machines {machines}",
            "make num_processes a multiple of num_machines "
            f"(e.g. {machines * max(1, processes // machines)})",
        )
    config.set("nodes", machines, _line(fields, "num_machines"), "num_machines")
    config.set("ppn", processes // machines, _line(fields, "num_processes"), "num_processes")


def _settings(
    fields: dict[str, Field],
    source: str,
    config: ProjectConfig,
    distributed: str,
    warn: Warn,
    fail: Fail,
) -> None:
    """use_cpu, mixed_precision, main_process_port and num_cpu_threads_per_process."""
    use_cpu = fields.get("use_cpu")
    if use_cpu is not None and use_cpu.value is not True and distributed == "NO":
        warn("use_cpu", use_cpu.line, f"{use_cpu.value!r}: cpuaccel trains on CPUs only")

    precision = fields.get("mixed_precision")
    if precision is not None:
        value = str(precision.value).lower()
        if value not in ("no", "bf16"):
            raise fail(
                "mixed_precision",
                f"{precision.value!r} is not supported on CPUs",
                "use mixed_precision: bf16 (AMX / AVX512-BF16) or 'no'",
            )
        config.set("mixed_precision", value, precision.line, "mixed_precision")

    port = _number(fields, "main_process_port", source, low=MASTER_PORTS.low)
    if port is not None:
        if MASTER_PORTS.high is not None and port > MASTER_PORTS.high:
            raise fail(
                "main_process_port",
                f"{port} is not a port",
                f"use {MASTER_PORTS.low} to {MASTER_PORTS.high}, e.g. {DEFAULT_MASTER_PORT}",
            )
        config.set("master_port", port, fields["main_process_port"].line, "main_process_port")

    threads = _number(fields, "num_cpu_threads_per_process", source)
    if threads is not None:
        line = fields["num_cpu_threads_per_process"].line
        config.set("env", {"OMP_NUM_THREADS": str(threads)}, line, "num_cpu_threads_per_process")


# IPEX asked for (ipex: true, ipex_config: {ipex: true}): what it asks is done anyway.
_IPEX = (
    "needs no setting: the runtime applies IPEX on every rank where "
    "intel_extension_for_pytorch is installed and matches torch (init(ipex=False) turns "
    "it off)"
)


def _asks_ipex(value: Any) -> bool:
    """Whether ``ipex:`` or ``ipex_config:`` (a mapping of switches) asks for IPEX."""
    if isinstance(value, dict):
        return any(_asks_ipex(v) for v in value.values())
    return value is True or str(value).lower() in ("true", "yes")


def _warn_unmapped(fields: dict[str, Field], warn: Warn) -> None:
    """Never drop a field silently: name each one whose value cpuaccel does not honour."""
    for name, item in fields.items():
        if name in ("ipex", "ipex_config"):
            if _asks_ipex(item.value):
                warn(name, item.line, f"{_short(item.value)} {_IPEX}")
            continue  # false: accelerate config's default answer, as in NEUTRAL
        if name in NEUTRAL:
            if item.value != NEUTRAL[name] and item.value not in (None, "", [], {}):
                reason = WHY.get(name, _NO_SETTING)
                warn(name, item.line, f"{item.value!r} is not honoured: {reason}")
        elif name not in _MAPPED:
            warn(name, item.line, f"{_short(item.value)} is not honoured: {_NO_SETTING}")


_MAPPED = {
    "compute_environment",
    "distributed_type",
    "num_machines",
    "num_processes",
    "use_cpu",
    "mixed_precision",
    "main_process_port",
    "main_process_ip",
    "num_cpu_threads_per_process",
    "mpirun_config",
}


def _line(fields: dict[str, Field], name: str) -> int | None:
    return fields[name].line if name in fields else None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _mpirun(fields: dict[str, Field], source: str, config: ProjectConfig, warn: Any) -> None:
    item = fields.get("mpirun_config")
    if item is None or item.value in (None, {}):
        return
    if item.children is None:
        raise ProjectFileError(
            "mpirun_config: must be a mapping (mpirun_hostfile:, mpirun_ccl:)",
            source=source,
            line=item.line,
            hint="indent mpirun_hostfile: and mpirun_ccl: under mpirun_config:",
        )
    sub = item.children
    for name, child in sub.items():
        if name not in _MPIRUN_KEYS:
            warn(f"mpirun_config.{name}", child.line, f"is not honoured: {_NO_SETTING}")
    ccl = _number(sub, "mpirun_ccl", source, low=0) if "mpirun_ccl" in sub else None
    if ccl is not None:
        config.set("ccl_workers", ccl, sub["mpirun_ccl"].line, "mpirun_config.mpirun_ccl")
    if "mpirun_hostfile" in sub:
        _hostfile(sub["mpirun_hostfile"], source, config, warn)


def _hostfile(item: Field, source: str, config: ProjectConfig, warn: Any) -> None:
    name = "mpirun_config.mpirun_hostfile"
    written = str(item.value or "")
    if not written:
        return
    path = os.path.expanduser(written)
    beside = os.path.join(os.path.dirname(source), os.path.basename(path))
    if not os.path.isfile(path) and os.path.isfile(beside):
        # The guide's file names /home/user/hostfile; a user who copied both files into
        # the project has the hostfile next to the config.
        warn(name, item.line, f"{written} not found; using {beside} beside the config file")
        path = beside
    config.set("inventory", path, item.line, name)
    if not os.path.lexists(path):  # there but not a file: read_hostfile names what it is
        config.inventory_error = InventoryError(
            f"{name}: hostfile {written} not found (nor {beside})",
            source=source,
            line=item.line,
            hint="write the hostfile's path there, put the hostfile beside the config, "
            "or pass -i HOSTFILE",
        )
        return
    try:
        entries = hostfile.read_hostfile(path)
    except InventoryError as exc:
        config.inventory_error = exc  # raised when this hostfile is used (no -i)
        return
    nodes = int(config.get("nodes") or 1)
    if len(entries) < nodes:
        raise ProjectFileError(
            f"num_machines is {nodes}, but {name} ({path}) lists {len(entries)} host(s): "
            + ", ".join(e.name for e in entries),
            source=source,
            line=config.lines.get("nodes"),
            hint="add the missing hosts to the hostfile (one per line), or lower num_machines",
        )
    ppn = config.get("ppn")
    for entry in entries[:nodes]:
        if entry.slots is not None and entry.slots != ppn:
            warn(
                name,
                item.line,
                f"{entry.name} has {entry.slots} slots in {path}, but num_processes / "
                f"num_machines is {ppn}: cpuaccel runs {ppn} per node",
            )
            break
    config.hosts = [e.name for e in entries]


def _head(fields: dict[str, Field], source: str, config: ProjectConfig, warn: Any) -> None:
    item = fields.get("main_process_ip")
    if item is None or not item.value:
        return
    address = str(item.value)
    if config.hosts and address not in config.hosts:
        warn(
            "main_process_ip",
            item.line,
            f"{address} is not in the hostfile: the main node is its first host, "
            f"{config.hosts[0]} (MASTER_ADDR is that host)",
        )
        return
    config.set("head", address, item.line, "main_process_ip")
