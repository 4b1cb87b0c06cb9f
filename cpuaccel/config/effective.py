"""Effective settings of a run, and where each came from: ``resolve``.

The line a value follows from the command line to the remote command, e.g. ``--ppn 4``:

1. ``cli/run.py`` parses the flags into a mapping (``{"ppn": 4}``; None where not given);
2. ``resolve`` (here) settles every setting once, in one order: a command-line flag
   (``-e cpuaccel_<name>`` counts as one), else the project file (cpuaccel.yaml or an
   Accelerate config), else the inventory (a ``cpuaccel_<name>`` variable of the head
   node), else the default. It checks each value where it was read, so that a bad one
   is an error naming its file and line, and it orders (head first) and chooses the
   hosts. The result is one frozen ``LaunchSettings`` (``settings.ppn`` is
   ``Setting("ppn", 4, "flag", "--ppn")``);
3. ``launch.plan.build_plan(settings, script, facts)`` decides the job from the settings
   and the nodes' facts alone (``plan.ppn``, the world size, threads per rank);
4. ``RunPlan.command()`` is the mpirun argv (``-ppn 4``, ``jobs/launchers.py``);
   ``jobs/launch.py`` has it rendered into launch.sh and starts that on the head node.

``config show`` prints the same settings with their sources, so that "why did it run 2
per node?" has an answer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from cpuaccel.config.chosen_hosts import choose, head_setting, order_hosts
from cpuaccel.config.project import LAUNCHERS, ProjectConfig
from cpuaccel.config.settings import (
    ALLOCATOR_CHOICES,
    DEFAULT,
    DEFAULT_CCL_WORKERS,
    DEFAULT_MASTER_PORT,
    DEFAULT_RESTART_DELAY,
    FLAG,
    INVENTORY,
    PROJECT,
    LaunchSettings,
    SecretEnv,
    Setting,
)
from cpuaccel.errors import CpuaccelError, InventoryError, UsageError
from cpuaccel.inventory import variables
from cpuaccel.inventory.host import Host
from cpuaccel.inventory.inventory import Inventory
from cpuaccel.rank_settings import KNOWN_BACKENDS

__all__ = ["DEFAULT_MASTER_PORT", "LaunchSettings", "Setting", "resolve"]


# ---------------------------------------------------------------- checks of one value
# The declared types of inventory/variables.py: each turns what a file or -e said into
# the setting's type, or raises ValueError (BadValue) with the complaint; the caller adds
# where the value was written.
_whole = variables.whole
_one_of = variables.choice
_mapping = variables.env_mapping
_text = variables.text


def _same(value: Any) -> Any:
    return value


# ---------------------------------------------------------------- reading the sources


class _Sources:
    """The places a setting may come from, in precedence order, for one run."""

    def __init__(
        self,
        flags: Mapping[str, Any],
        project: ProjectConfig | None,
        inventory: Inventory,
        head: Host,
        extra: Mapping[str, Any],
    ) -> None:
        self.flags, self.project, self.inventory = flags, project, inventory
        self.head, self.extra = head, extra

    def pick(
        self,
        name: str,
        flag: str | None,
        variables: tuple[str, ...],
        check: Callable[[Any], Any],
        default: Any = None,
        note: str | None = None,
    ) -> Setting[Any]:
        """The first source that sets it: the flag, -e, the project file, the inventory."""
        if flag is not None and self.flags.get(name) is not None:
            return Setting(name, self.flags[name], FLAG, self.flag_name(name, flag))
        for var in variables:
            if var in self.extra:
                return self._checked(name, var, self.extra[var], FLAG, f"-e {var}", check)
        if self.project is not None and self.project.get(name) is not None:
            # The project file's values were checked when it was read.
            return Setting(name, self.project.get(name), PROJECT, self.project.where(name))
        for setting in self.variables(name, variables, check):
            return setting
        return Setting(name, default, DEFAULT, note)

    def flag_name(self, name: str, flag: str) -> str:
        """The flag as typed: --nproc_per_node sets ppn as --ppn does, and is named so."""
        return str((self.flags.get("flag_names") or {}).get(name, flag))

    def variables(
        self, name: str, variables: tuple[str, ...], check: Callable[[Any], Any]
    ) -> Iterator[Setting[Any]]:
        """The head node's variables that set it (-e included, as it is merged in)."""
        for var in variables:
            value = self.head.vars.get(var)
            if value is None:
                continue
            if var in self.extra:
                yield self._checked(name, var, value, FLAG, f"-e {var}", check)
                continue
            origin = self.inventory.origin(self.head.name, var)
            where = str(origin) if origin and origin.source else var
            yield self._checked(name, var, value, INVENTORY, f"{where} ({var})", check)

    def _checked(
        self, name: str, var: str, value: Any, source: str, where: str, check: Callable[[Any], Any]
    ) -> Setting[Any]:
        try:
            return Setting(name, check(value), source, where)
        except ValueError as exc:
            raise self._error(var, str(exc)) from None

    def _error(self, var: str, message: str) -> CpuaccelError:
        hint = f"fix {var} in the inventory (or its -e)"
        if var in self.extra:
            return UsageError(f"-e {var}: {var} {message}", hint=f"fix -e {var}")
        origin = self.inventory.origin(self.head.name, var)
        if origin is None or origin.source is None:
            return InventoryError(f"{var} {message}", hint=hint)
        return InventoryError(f"{var} {message}", source=origin.source, line=origin.line, hint=hint)


# ---------------------------------------------------------------- resolve

_Spec = tuple[str | None, tuple[str, ...], Callable[[Any], Any], Any, str | None]
# Settings read the same way. name: (its flag, the head node's variables that may set
# it, the check of a variable's value, the default, a note on the default). The project
# file sets those of its keys (config/project.py) that it names, under the flags.
SPECS: dict[str, _Spec] = {
    "nodes": ("--nodes", (), _same, None, "every selected host"),
    # --nodes MIN:MAX's MIN (cli/options.py); None: no node may be left out.
    "min_nodes": ("--nodes", (), _same, None, "every chosen node"),
    "ppn": (
        "--ppn", ("cpuaccel_ppn", variables.SLOTS_VAR), _whole(1), None,
        "sockets per node, from the nodes' facts",
    ),
    "launcher": (
        "--launcher", ("cpuaccel_launcher",), _one_of(LAUNCHERS), "auto",
        "picked from the head node's MPI",
    ),
    "master_port": (
        "--master-port", ("cpuaccel_master_port",), _whole(1, 65535), DEFAULT_MASTER_PORT, None,
    ),
    "mixed_precision": (
        "--mixed-precision", ("cpuaccel_mixed_precision",), variables.precision, "auto",
        "bf16 if every node has AMX-BF16 or AVX512-BF16, else fp32",
    ),
    "ccl_workers": (
        "-e cpuaccel_ccl_workers", ("cpuaccel_ccl_workers",), _whole(0), DEFAULT_CCL_WORKERS,
        "used with the ccl backend",
    ),
    "mpirun": (None, ("cpuaccel_mpirun",), _text, None, "the head node's, from its facts"),
    "fi_provider": (None, ("cpuaccel_fi_provider",), _text, None, None),
    "allocator": (None, ("cpuaccel_allocator",), _one_of(ALLOCATOR_CHOICES), "auto", None),
    "templates": (None, ("cpuaccel_templates",), _text, None, "cpuaccel's own templates/"),
    # Split and checked where written: the flag in cli/run.py, the file in project.py.
    "launcher_args": ("--launcher-args", (), _same, (), None),
    # Checked where written: the flags by click, the file in project.py.
    "hang_timeout": ("--hang-timeout", (), _same, None, "off"),
    "max_restarts": ("--max-restarts", (), _same, 0, "a failed job is not restarted"),
    "restart_delay": ("--restart-delay", (), _same, DEFAULT_RESTART_DELAY, None),
}  # fmt: skip


def resolve(
    flags: Mapping[str, Any],
    project: ProjectConfig | None,
    inventory: Inventory,
    hosts: Sequence[Host],
    extra_vars: Mapping[str, Any] | None = None,
) -> LaunchSettings:
    """Every run setting with its source, and the chosen hosts. ``flags`` holds the
    command line's values, None where a flag was not given; ``hosts`` are the selected
    hosts (-i, --limit); ``extra_vars`` what -e set."""
    if not hosts:
        raise UsageError("no hosts selected", hint="check -i and --limit")
    head = head_setting(flags, project)
    ordered = order_hosts(hosts, head)
    src = _Sources(flags, project, inventory, ordered[0], extra_vars or {})
    got = {name: src.pick(name, *spec) for name, spec in SPECS.items()}
    if isinstance(got["nodes"].value, str):  # the project file's "MIN:MAX"
        low, high = got["nodes"].value.split(":")
        got["min_nodes"] = dataclasses.replace(got["nodes"], name="min_nodes", value=int(low))
        got["nodes"] = dataclasses.replace(got["nodes"], value=int(high))
    chosen = choose(ordered, got["nodes"], project)
    got["ppn"] = _per_node(src, got["ppn"], len(chosen))
    if got["launcher"].value == "auto":
        # An explicit "auto" (flag or project file) still lets the inventory name one.
        named = src.variables("launcher", ("cpuaccel_launcher",), _one_of(LAUNCHERS))
        got["launcher"] = next(named, got["launcher"])
    env, env_sources = _env(flags, project, src)
    where = inventory.source or "this machine"
    return LaunchSettings(
        head=head,
        nodes=got["nodes"],
        min_nodes=got["min_nodes"],
        ppn=got["ppn"],
        launcher=got["launcher"],
        master_port=got["master_port"],
        mixed_precision=got["mixed_precision"],
        ccl_workers=got["ccl_workers"],
        hosts=Setting("hosts", [h.name for h in chosen], INVENTORY, where),
        python=_host_value(src, chosen, "python", ("cpuaccel_python", "cpuaccel_venv")),
        workdir=_host_value(src, chosen, "workdir", ("cpuaccel_workdir",)),
        env=env,
        exclude=_exclude(flags, project),
        mpirun=got["mpirun"],
        backend=_backend(src, env, env_sources),
        fi_provider=got["fi_provider"],
        secret_env=_secret_env(src),
        allocator=got["allocator"],
        templates=got["templates"],
        launcher_args=got["launcher_args"],
        hang_timeout=got["hang_timeout"],
        max_restarts=got["max_restarts"],
        restart_delay=got["restart_delay"],
        chosen=tuple(chosen),
    )


def _per_node(src: _Sources, ppn: Setting[int | None], nodes: int) -> Setting[int | None]:
    """--num_processes N (Accelerate's total over all machines): N / nodes per node, the
    nodes being --nodes (or its file) else every selected host."""
    total = src.flags.get("num_processes")
    if total is None:
        return ppn
    flag = src.flag_name("num_processes", "--num_processes")
    if total % nodes:
        raise UsageError(
            f"{flag} {total} cannot be split evenly over {nodes} node(s)",
            hint=f"give a multiple of {nodes}, or choose the nodes with --nodes",
        )
    per_node = total // nodes
    if ppn.source == FLAG and ppn.value is not None and ppn.value != per_node:
        raise UsageError(
            f"{flag} {total} is {per_node} per node on {nodes} node(s), but {ppn.where} "
            f"says {ppn.value}",
            hint=f"give either {flag} or {ppn.where}",
        )
    return Setting("ppn", per_node, FLAG, f"{flag} {total} / {nodes} node(s)")


def _host_value(
    src: _Sources, chosen: Sequence[Host], name: str, variables: tuple[str, ...]
) -> Setting[str]:
    """cpuaccel_python or cpuaccel_workdir: the head's (as Host reads it, a venv included),
    the same on every chosen node, since rank.sh runs everywhere."""
    values = {h.name: getattr(h, name) for h in chosen}
    if len(set(values.values())) > 1:
        listing = ", ".join(f"{k}={v}" for k, v in values.items())
        raise UsageError(
            f"{variables[0]} differs between the chosen nodes ({listing})",
            hint=f"set {variables[0]} once for all of them (in all: vars), "
            "as rank.sh runs everywhere",
        )
    value = str(values[src.head.name])
    for var in variables:
        if var in src.extra:
            return Setting(name, value, FLAG, f"-e {var}")
        if src.head.vars.get(var) is not None:
            origin = src.inventory.origin(src.head.name, var)
            if not (origin and origin.source):
                return Setting(name, value, DEFAULT)  # set by cpuaccel (this machine's python)
            suffix = "" if var == variables[0] else f" ({var})"
            return Setting(name, value, INVENTORY, f"{origin}{suffix}")
    return Setting(name, value, DEFAULT)  # Host's default (DEFAULT_PYTHON, DEFAULT_WORKDIR)


def _env(
    flags: Mapping[str, Any], project: ProjectConfig | None, src: _Sources
) -> tuple[Setting[dict[str, str]], dict[str, str]]:
    """The variables cpuaccel itself does not compute, merged in precedence order;
    ``where`` says which source each variable came from (also returned by name)."""
    merged: dict[str, str] = {}
    sources: dict[str, str] = {}
    inventory = next(src.variables("env", ("cpuaccel_env",), _mapping), None)
    for key, value in (inventory.value if inventory else {}).items():
        merged[key], sources[key] = value, INVENTORY
    for key, value in ((project.get("env") if project else None) or {}).items():
        merged[key], sources[key] = value, PROJECT
    for key, value in (flags.get("env") or {}).items():
        merged[key], sources[key] = value, FLAG
    kinds = set(sources.values())
    source = next((s for s in (FLAG, PROJECT, INVENTORY) if s in kinds), DEFAULT)
    where = ", ".join(f"{k}: {v}" for k, v in sources.items()) or None
    return Setting("env", merged, source, where), sources


def _exclude(flags: Mapping[str, Any], project: ProjectConfig | None) -> Setting[list[str]]:
    given = list(flags.get("exclude") or ())
    from_project = list((project.get("exclude") if project else None) or [])
    if given:
        from cpuaccel.sync.ignore import check_excludes

        check_excludes(given)
        return Setting("exclude", [*from_project, *given], FLAG, "--exclude")
    if from_project:
        where = project.where("exclude") if project else None
        return Setting("exclude", from_project, PROJECT, where)
    return Setting("exclude", [], DEFAULT)


def _backend(
    src: _Sources, env: Setting[dict[str, str]], env_sources: Mapping[str, str]
) -> Setting[str | None]:
    """CPUACCEL_BACKEND set in the env (any source), else cpuaccel_backend."""
    if env.value.get("CPUACCEL_BACKEND"):
        value = env.value["CPUACCEL_BACKEND"]
        return Setting("backend", value, env_sources["CPUACCEL_BACKEND"], "env CPUACCEL_BACKEND")
    note = "ccl when the head node has oneccl_bindings_for_pytorch"
    return src.pick(
        "backend", None, ("cpuaccel_backend",), _one_of(KNOWN_BACKENDS, fold=True), None, note
    )


def _secret_env(src: _Sources) -> Setting[SecretEnv]:
    """cpuaccel_secret_env, under the credentials passed by name (--env HF_TOKEN)."""
    found = next(src.variables("secret_env", ("cpuaccel_secret_env",), _mapping), None)
    given = dict(src.flags.get("secret_env") or {})
    if given:
        merged = {**(found.value if found else {}), **given}
        where = ", ".join(f"--env {name}" for name in given)
        return Setting("secret_env", SecretEnv(merged), FLAG, where)
    if found is None:
        return Setting("secret_env", SecretEnv(), DEFAULT)
    return Setting("secret_env", SecretEnv(found.value), found.source, found.where)
