"""The settings of a run: one frozen object, every value with its source.

``config.effective.resolve`` builds it; ``launch.plan.build_plan`` reads it (and no
inventory variable); ``config show`` prints it. Keeping the types here, apart from the
precedence rules, lets both sides import them without importing each other.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from cpuaccel.inventory import variables
from cpuaccel.inventory.host import Host

FLAG, PROJECT, INVENTORY, ENVIRONMENT, DEFAULT = (
    "flag",
    "project file",
    "inventory",
    "environment",
    "default",
)
DEFAULT_MASTER_PORT = 29500
DEFAULT_CCL_WORKERS = 1
DEFAULT_RESTART_DELAY = 3.0  # seconds between a failed attempt's end and the next's preflight
# cpuaccel_allocator: "auto" preloads whichever of them the node has (launch.plan).
ALLOCATOR_CHOICES = variables.ALLOCATOR_CHOICES  # declared with the inventory variable

T = TypeVar("T")


@dataclass(frozen=True)
class Setting(Generic[T]):
    name: str
    value: T
    source: str  # FLAG, PROJECT, INVENTORY, ENVIRONMENT or DEFAULT
    where: str | None = None  # "--ppn", "cpuaccel.yaml:4", "inventory.yaml:12"

    def to_json(self) -> dict[str, Any]:
        value: Any = self.value
        if isinstance(value, SecretEnv):
            value = value.names()  # never the values, wherever a setting is printed
        return {"value": value, "source": self.source, "where": self.where}


class SecretEnv(Mapping[str, str]):
    """``cpuaccel_secret_env``: variables that go only to a 0600 file on the nodes.

    Its repr names the variables and hides the values, so that a setting printed in a
    log, an error or a debugger does not leak them.
    """

    def __init__(self, values: Mapping[str, str] | None = None) -> None:
        self._values = dict(values or {})

    def __getitem__(self, key: str) -> str:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def names(self) -> list[str]:
        return list(self._values)

    def __repr__(self) -> str:
        return f"SecretEnv({', '.join(self._values)}; values hidden)"


# What `config show` prints, in its order. The launch details below them (mpirun,
# backend, ...) are left out so that its output stays what it was before they moved here.
SHOWN = (
    "head",
    "nodes",
    "ppn",
    "launcher",
    "master_port",
    "mixed_precision",
    "ccl_workers",
    "hosts",
    "python",
    "workdir",
    "env",
    "exclude",
    "min_nodes",
    "max_restarts",
    "restart_delay",
    "hang_timeout",
)


@dataclass(frozen=True)
class LaunchSettings:
    """Everything ``run`` was told, settled once: a flag, else the project file, else the
    inventory (the head node's ``cpuaccel_<name>``), else the default."""

    head: Setting[str | None]
    nodes: Setting[int | None]
    ppn: Setting[int | None]  # None: sockets per node, from the facts
    launcher: Setting[str]  # "auto": picked from the head node's facts
    master_port: Setting[int]
    mixed_precision: Setting[str | None]
    ccl_workers: Setting[int]
    hosts: Setting[list[str]]  # the chosen hosts' names, head first
    python: Setting[str]
    workdir: Setting[str]
    env: Setting[dict[str, str]]  # what the user sets in every rank
    exclude: Setting[list[str]]  # sync's patterns
    mpirun: Setting[str | None]  # None: from the facts, else the launcher's default
    backend: Setting[str | None]  # None: ccl when the head node has oneCCL's bindings
    fi_provider: Setting[str | None]
    secret_env: Setting[SecretEnv]
    allocator: Setting[str]  # one of ALLOCATOR_CHOICES
    templates: Setting[str | None]  # a folder of the user's own run templates
    # --launcher-args / launcher_args: words appended to the mpirun line, checked.
    launcher_args: Setting[tuple[str, ...]] = Setting("launcher_args", (), DEFAULT)
    # --hang-timeout / hang_timeout: seconds without progress of any rank that end the
    # job as hung (jobs/hang.py); None: no hang detection.
    hang_timeout: Setting[float | None] = Setting("hang_timeout", None, DEFAULT, "off")
    # --max-restarts / --restart-delay: attempts after a failure (jobs/attempts.py).
    max_restarts: Setting[int] = Setting("max_restarts", 0, DEFAULT)
    restart_delay: Setting[float] = Setting("restart_delay", DEFAULT_RESTART_DELAY, DEFAULT)
    # --nodes MIN:MAX's MIN: restarts (and the first preflight) leave out failing nodes
    # while at least this many remain (jobs/elastic.py). None: none is left out.
    min_nodes: Setting[int | None] = Setting("min_nodes", None, DEFAULT)
    # The chosen hosts themselves, in the same order as ``hosts``: rank 0 and mpirun
    # run on the first.
    chosen: tuple[Host, ...] = ()

    @property
    def head_host(self) -> Host:
        return self.chosen[0]

    def shown(self) -> dict[str, Setting[Any]]:
        """The rows of ``config show``, by name."""
        return {name: getattr(self, name) for name in SHOWN}
