"""Effective settings of a run, and where each came from.

One order everywhere: a command-line flag, else the project file (cpuaccel.yaml or an
Accelerate config), else the inventory (a ``cpuaccel_<name>`` variable of the head
node), else the default. ``run`` uses the values; ``config show`` prints them with their
sources, so that "why did it run 2 per node?" has an answer.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cpuaccel.config.project import ProjectConfig
from cpuaccel.errors import InventoryError
from cpuaccel.inventory.host import DEFAULT_PYTHON, DEFAULT_WORKDIR, Host
from cpuaccel.inventory.hostfile import SLOTS_VAR
from cpuaccel.inventory.inventory import DEFAULT_FILE, ENV_VAR, Inventory

FLAG, PROJECT, INVENTORY, ENVIRONMENT, DEFAULT = (
    "flag",
    "project file",
    "inventory",
    "environment",
    "default",
)
DEFAULT_MASTER_PORT = 29500
DEFAULT_CCL_WORKERS = 1
# Run settings: their flag, and the inventory variables that may set them (head node's).
RUN_SETTINGS: dict[str, tuple[str, tuple[str, ...]]] = {
    "nodes": ("--nodes", ()),
    "ppn": ("--ppn", ("cpuaccel_ppn", SLOTS_VAR)),
    "launcher": ("--launcher", ("cpuaccel_launcher",)),
    "master_port": ("--master-port", ("cpuaccel_master_port",)),
    "mixed_precision": ("--mixed-precision", ("cpuaccel_mixed_precision",)),
    "ccl_workers": ("-e cpuaccel_ccl_workers", ("cpuaccel_ccl_workers",)),
}


@dataclass(frozen=True)
class Setting:
    name: str
    value: Any
    source: str  # FLAG, PROJECT, INVENTORY, ENVIRONMENT or DEFAULT
    where: str | None = None  # "--ppn", "cpuaccel.yaml:4", "inventory.yaml:12"

    def to_json(self) -> dict[str, Any]:
        return {"value": self.value, "source": self.source, "where": self.where}


@dataclass(frozen=True)
class InventoryChoice:
    path: str | None  # None: this machine alone
    setting: Setting


def choose_inventory(flag: str | None, project: ProjectConfig | None) -> InventoryChoice:
    """-i, else the project file's inventory (or Accelerate's hostfile), else
    $CPUACCEL_INVENTORY, else ./inventory.yaml, else this machine alone."""
    if flag:
        return InventoryChoice(flag, Setting("inventory", flag, FLAG, "-i"))
    if project is not None:
        if project.get("inventory"):
            if project.inventory_error is not None:
                raise project.inventory_error
            path = str(project.get("inventory"))
            where = project.where("inventory")
            return InventoryChoice(path, Setting("inventory", path, PROJECT, where))
        if project.local_only:
            where = f"{project.path} (distributed_type 'NO')"
            return InventoryChoice(None, Setting("inventory", "localhost", PROJECT, where))
    from_env = os.environ.get(ENV_VAR)
    if from_env:
        return InventoryChoice(from_env, Setting("inventory", from_env, ENVIRONMENT, f"${ENV_VAR}"))
    if Path(DEFAULT_FILE).is_file():
        return InventoryChoice(DEFAULT_FILE, Setting("inventory", DEFAULT_FILE, DEFAULT, "./"))
    return InventoryChoice(None, Setting("inventory", "localhost", DEFAULT, "no inventory file"))


def project_vars(project: ProjectConfig | None) -> dict[str, Any]:
    """Host variables the project file sets, applied over the inventory (and under -e)."""
    if project is None or project.get("ccl_workers") is None:
        return {}
    return {"cpuaccel_ccl_workers": project.get("ccl_workers")}


def order_hosts(hosts: Sequence[Host], head: Setting) -> list[Host]:
    """The head node first: mpirun runs there and rank 0 with it."""
    if head.value is None:
        return list(hosts)
    wanted = str(head.value)
    found = next((h for h in hosts if wanted in (h.name, h.address)), None)
    if found is None:
        raise InventoryError(
            f"head {wanted!r} is not among the selected hosts ({', '.join(h.name for h in hosts)})",
            source=(head.where or "").rsplit(":", 1)[0] or None,
            line=_line(head.where),
            hint="name a host of the inventory (its name or ansible_host), or widen --limit",
        )
    return [found, *(h for h in hosts if h is not found)]


def _line(where: str | None) -> int | None:
    tail = (where or "").rsplit(":", 1)[-1]
    return int(tail) if tail.isdigit() else None


def resolve(
    flags: Mapping[str, Any],
    project: ProjectConfig | None,
    inventory: Inventory,
    hosts: Sequence[Host],
    extra_vars: Mapping[str, Any] | None = None,
) -> dict[str, Setting]:
    """Every run setting with its source. ``flags`` holds the command line's values,
    None where a flag was not given; ``hosts`` are the selected hosts."""
    found: dict[str, Setting] = {}
    extra = extra_vars or {}
    head = _head(project)
    found["head"] = head
    ordered = order_hosts(hosts, head) if hosts else []
    head_host = ordered[0] if ordered else None
    for name, (flag, variables) in RUN_SETTINGS.items():
        found[name] = _one(name, flag, variables, flags, project, inventory, head_host, extra)
    nodes = found["nodes"]
    too_many = nodes.value is not None and hosts and int(nodes.value) > len(hosts)
    if too_many and project is not None and nodes.source == PROJECT:
        raise project.error(
            "nodes",
            f"{nodes.value} nodes, but {len(hosts)} host(s) are selected "
            f"({', '.join(h.name for h in hosts)})",
            "add hosts to the inventory (or hostfile), or lower it",
        )
    chosen = ordered[: int(nodes.value)] if nodes.value else ordered
    inv_where = inventory.source or "this machine"
    found["hosts"] = Setting("hosts", [h.name for h in chosen], INVENTORY, inv_where)
    if head_host is not None:
        for name, var, default in (
            ("python", "cpuaccel_python", DEFAULT_PYTHON),
            ("workdir", "cpuaccel_workdir", DEFAULT_WORKDIR),
        ):
            found[name] = _from_inventory(name, var, inventory, head_host, default, extra)
    found["env"] = _env(flags, project, inventory, head_host)
    found["exclude"] = _exclude(flags, project)
    return found


def _head(project: ProjectConfig | None) -> Setting:
    if project is not None and project.get("head"):
        return Setting("head", project.get("head"), PROJECT, project.where("head"))
    return Setting("head", None, DEFAULT, "the first selected host")


def _one(
    name: str,
    flag: str,
    variables: tuple[str, ...],
    flags: Mapping[str, Any],
    project: ProjectConfig | None,
    inventory: Inventory,
    head: Host | None,
    extra: Mapping[str, Any],
) -> Setting:
    if flags.get(name) is not None:
        return Setting(name, flags[name], FLAG, flag)
    for var in variables:
        if var in extra:
            return Setting(name, extra[var], FLAG, f"-e {var}")
    if project is not None and project.get(name) is not None:
        return Setting(name, project.get(name), PROJECT, project.where(name))
    if head is not None:
        for var in variables:
            if head.vars.get(var) is not None:
                origin = inventory.origin(head.name, var)
                where = str(origin) if origin and origin.source else var
                return Setting(name, head.vars[var], INVENTORY, f"{where} ({var})")
    return Setting(name, _DEFAULTS[name], DEFAULT, _DEFAULT_NOTES[name])


_DEFAULTS: dict[str, Any] = {
    "nodes": None,
    "ppn": None,
    "launcher": "auto",
    "master_port": DEFAULT_MASTER_PORT,
    "mixed_precision": None,
    "ccl_workers": DEFAULT_CCL_WORKERS,
}
_DEFAULT_NOTES = {
    "nodes": "every selected host",
    "ppn": "sockets per node, from the nodes' facts",
    "launcher": "picked from the head node's MPI",
    "master_port": None,
    "mixed_precision": "the script's own choice",
    "ccl_workers": "used with the ccl backend",
}


def _from_inventory(
    name: str, var: str, inventory: Inventory, head: Host, default: str, extra: Mapping[str, Any]
) -> Setting:
    if var in extra:
        return Setting(name, extra[var], FLAG, f"-e {var}")
    if head.vars.get(var) is not None:
        origin = inventory.origin(head.name, var)
        where = str(origin) if origin and origin.source else None
        return Setting(name, head.vars[var], INVENTORY if where else DEFAULT, where)
    return Setting(name, default, DEFAULT)


def _env(
    flags: Mapping[str, Any],
    project: ProjectConfig | None,
    inventory: Inventory,
    head: Host | None,
) -> Setting:
    """The variables cpuaccel itself does not compute, merged in precedence order;
    ``where`` says which source each variable came from."""
    merged: dict[str, str] = {}
    sources: dict[str, str] = {}
    inv_env = (head.vars.get("cpuaccel_env") if head else None) or {}
    for key, value in dict(inv_env).items():
        merged[str(key)], sources[str(key)] = str(value), INVENTORY
    for key, value in ((project.get("env") if project else None) or {}).items():
        merged[key], sources[key] = value, PROJECT
    for key, value in (flags.get("env") or {}).items():
        merged[key], sources[key] = value, FLAG
    kinds = set(sources.values())
    source = next((s for s in (FLAG, PROJECT, INVENTORY) if s in kinds), DEFAULT)
    where = ", ".join(f"{k}: {v}" for k, v in sources.items()) or None
    return Setting("env", merged, source, where)


def _exclude(flags: Mapping[str, Any], project: ProjectConfig | None) -> Setting:
    given = list(flags.get("exclude") or ())
    from_project = list((project.get("exclude") if project else None) or [])
    if given:
        return Setting("exclude", [*from_project, *given], FLAG, "--exclude")
    if from_project:
        where = project.where("exclude") if project else None
        return Setting("exclude", from_project, PROJECT, where)
    return Setting("exclude", [], DEFAULT)


def run_env(settings: Mapping[str, Setting]) -> dict[str, str]:
    """What the ranks get from these settings, on top of what the plan computes."""
    env = dict(settings["env"].value)
    precision = settings["mixed_precision"].value
    if precision is not None:
        # Accelerate scripts read ACCELERATE_MIXED_PRECISION; cpuaccel scripts can read
        # CPUACCEL_MIXED_PRECISION and pass it to cpuaccel.init().
        env.setdefault("ACCELERATE_MIXED_PRECISION", str(precision))
        env.setdefault("CPUACCEL_MIXED_PRECISION", str(precision))
    return env
