"""The project file, ``cpuaccel.yaml``: run and sync defaults for one project.

It sits beside the training code (``run`` and ``sync`` read it from the current folder,
or from ``--config FILE``), and command-line flags override it. Every mistake is an
error naming the file and line, an unknown key included, because a misspelt key that
is silently ignored is a setting the user believes in and does not get.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cpuaccel.config import launcher_args
from cpuaccel.config.yamlfile import Field, parse_mapping
from cpuaccel.errors import InventoryError, ProjectFileError
from cpuaccel.inventory import variables
from cpuaccel.inventory.slurm_source import PREFIX as SLURM_PREFIX

PROJECT_FILE = "cpuaccel.yaml"
LAUNCHERS = variables.LAUNCHER_CHOICES  # the same words as cpuaccel_launcher
PRECISIONS = ("auto", "bf16", "no")  # fp32 is read as "no"
MAX_RESTARTS = 1000  # a bound, so that a typo (30000) is caught; the flag checks the same
MAX_RESTART_DELAY = 3600
# The key written in the file -> what it means, for --help-like hints and `config show`.
KEYS: dict[str, str] = {
    "inventory": "the inventory (or MPI hostfile), relative to this file",
    "limit": "host pattern selecting hosts (like --limit)",
    "head": "the host that runs rank 0 and mpirun (default: the first host)",
    "nodes": 'how many hosts (N, or "MIN:MAX": see run --nodes)',
    "ppn": "ranks per node",
    "launcher": "auto, impi, mpich or openmpi",
    "master_port": "the rendezvous port on the head node",
    "mixed_precision": "auto, bf16 or no (fp32)",
    "ccl_workers": "oneCCL worker threads per rank (CCL_WORKER_COUNT)",
    "env": "variables set in every rank (a mapping)",
    "exclude": "sync: patterns left out (a list, gitignore syntax)",
    "launcher_args": "extra mpirun options, e.g. '-genv I_MPI_DEBUG 5' (like --launcher-args)",
    "hang_timeout": "seconds without progress of any rank that end the job (like --hang-timeout)",
    "max_restarts": "attempts after a failed one (like --max-restarts), e.g. 3",
    "restart_delay": "seconds to wait before a restart (like --restart-delay), e.g. 3",
    "slurm": "cpuaccel submit's defaults: partition, time, account, sbatch_args, templates",
    "allocator": "auto, none, tcmalloc or jemalloc: preloaded in every rank (cpuaccel tune)",
}


@dataclass
class ProjectConfig:
    """Settings read from a project file (or converted from Accelerate's), each with
    the line it was written on."""

    path: str
    kind: str = "cpuaccel"  # or "accelerate"
    values: dict[str, Any] = field(default_factory=dict)
    lines: dict[str, int] = field(default_factory=dict)
    # The name a setting had in the file, when it differs (Accelerate's field names).
    names: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    # Accelerate's single-machine config: this machine alone, whatever ./inventory.yaml says.
    local_only: bool = False
    # Hosts of the hostfile an Accelerate config names, when it could be read.
    hosts: list[str] = field(default_factory=list)
    # Raised only if the inventory it names is needed (no -i flag): a missing hostfile
    # must not stop `cpuaccel run --config default_config.yaml -i other`.
    inventory_error: InventoryError | None = None

    def get(self, key: str) -> Any:
        return self.values.get(key)

    def where(self, key: str) -> str:
        line = self.lines.get(key)
        return f"{self.path}:{line}" if line is not None else self.path

    def field_name(self, key: str) -> str:
        return self.names.get(key, key)

    def error(self, key: str, message: str, hint: str) -> ProjectFileError:
        return ProjectFileError(
            f"{self.field_name(key)}: {message}",
            source=self.path,
            line=self.lines.get(key),
            hint=hint,
        )

    def set(self, key: str, value: Any, line: int | None, name: str | None = None) -> None:
        self.values[key] = value
        if line is not None:
            self.lines[key] = line
        if name is not None and name != key:
            self.names[key] = name


def _int(low: int, high: int | None = None) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"must be a whole number, got {value!r}")
        if value < low or (high is not None and value > high):
            upper = f" to {high}" if high is not None else " or more"
            raise ValueError(f"must be {low}{upper}, got {value}")
        return value

    return check


def _nodes(value: Any) -> Any:
    """N, or "MIN:MAX" (run --nodes MIN:MAX, issue 15 item 2), kept as written."""
    if isinstance(value, str) and ":" in value:
        low, high = value.split(":", 1)
        if not (low.strip().isdigit() and high.strip().isdigit()):
            raise ValueError(f"must be N or MIN:MAX (whole numbers), got {value!r}")
        first, last = int(low), int(high)
        if not 1 <= first <= last:
            raise ValueError(f"must be MIN:MAX with 1 <= MIN <= MAX, got {value!r}")
        return last if first == last else f"{first}:{last}"
    return _int(1)(value)


def _seconds(low: float, high: float | None = None) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"must be a number of seconds, got {value!r}")
        if high is not None and not low <= value <= high:  # NaN too
            raise ValueError(f"must be {low:g} to {high:g} seconds, got {value}")
        if not value >= low:
            raise ValueError(f"must be at least {low:g} s, got {value}")
        return float(value)

    return check


def _text(value: Any) -> Any:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"must be a non-empty string, got {value!r}")
    return value


def _choice(options: tuple[str, ...]) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        text = str(value).strip().lower()
        if text == "fp32" and "no" in options:
            text = "no"
        if text not in options:
            raise ValueError(f"is {value!r}; use one of {', '.join(options)}")
        return text

    return check


def _env(value: Any) -> Any:
    # The same rules as the inventory's cpuaccel_env: a name a shell accepts.
    return variables.env_mapping(value)


def _patterns(value: Any) -> Any:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ValueError("must be a list of patterns, e.g. [data/, '*.bin']")
    from cpuaccel.sync.ignore import pattern_error  # pathspec: only for a file that has some

    for pattern in value:
        said = pattern_error(pattern)
        if said is not None:
            raise ValueError(f"holds {pattern!r}, not a gitignore pattern ({said})")
    return list(value)


def _slurm_block(value: Any) -> dict[str, Any]:
    """slurm/batch.check_block, loaded only for a project file with a ``slurm:`` block:
    off the start-up of every other command (issue 17)."""
    from cpuaccel.slurm import batch

    return batch.check_block(value)


CHECKS: dict[str, Callable[[Any], Any]] = {
    "inventory": _text,
    "limit": _text,
    "head": _text,
    "nodes": _nodes,
    "ppn": _int(1),
    "launcher": _choice(LAUNCHERS),
    "master_port": _int(1, 65535),
    "mixed_precision": _choice(PRECISIONS),
    "ccl_workers": _int(0, 64),
    "env": _env,
    "exclude": _patterns,
    "launcher_args": launcher_args.split,
    "hang_timeout": _seconds(1),
    "max_restarts": _int(0, MAX_RESTARTS),
    "restart_delay": _seconds(0, MAX_RESTART_DELAY),
    "slurm": _slurm_block,
    "allocator": _choice(variables.ALLOCATOR_CHOICES),
}


def parse_project(text: str, source: str) -> ProjectConfig:
    config = ProjectConfig(source)
    for key, item in parse_mapping(text, source, "project file").items():
        if key not in CHECKS:
            import difflib  # only for the hint on a bad key: off every command's start-up

            close = difflib.get_close_matches(key, list(CHECKS), n=1)
            hint = f"did you mean '{close[0]}'?" if close else "remove it"
            raise ProjectFileError(
                f"unknown key {key!r} in the project file",
                source=source,
                line=item.line,
                hint=f"{hint} (known keys: {', '.join(CHECKS)})",
            )
        config.set(key, _checked(key, item, source), item.line)
    inventory = config.get("inventory")
    base = os.path.dirname(source)
    names_no_file = "," in inventory or inventory.startswith(SLURM_PREFIX) if inventory else False
    if inventory and not (names_no_file and not os.path.exists(os.path.join(base, inventory))):
        # Relative to the file, so that `--config other/cpuaccel.yaml` finds its own (a
        # comma list of hosts, "node1,node2,", or a Slurm partition, "slurm:batch",
        # names no file).
        config.values["inventory"] = os.path.join(base, os.path.expanduser(inventory))
    slurm = config.get("slurm")
    if slurm and slurm.get("templates"):  # relative to the file, as the inventory is
        slurm["templates"] = os.path.join(base, os.path.expanduser(slurm["templates"]))
    return config


def _checked(key: str, item: Field, source: str) -> Any:
    try:
        return CHECKS[key](item.value)
    except ValueError as exc:
        line = item.line
        bad = getattr(exc, "key", None)  # a bad key of a mapping: name its own line
        if bad is not None and item.children and bad in item.children:
            line = item.children[bad].line
        raise ProjectFileError(
            f"{key} {exc}", source=source, line=line, hint=f"{key}: {KEYS[key]}"
        ) from None


def is_accelerate(fields: dict[str, Field]) -> bool:
    return "distributed_type" in fields or "compute_environment" in fields
