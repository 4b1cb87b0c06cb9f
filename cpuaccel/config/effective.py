"""Effective settings of a run, and where each came from: ``resolve``.

The line a value follows from the command line to the remote command, e.g. ``--ppn 4``:

1. ``cli/options.py`` collects the flags of the settings table (config/settings.py) into
   one mapping (``{"ppn": 4}``; None where not given);
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

from cpuaccel.config.project import ProjectConfig
from cpuaccel.config.settings import (
    BY_NAME,
    DEFAULT,
    DEFAULT_MASTER_PORT,
    FLAG,
    INVENTORY,
    PROJECT,
    TABLE,
    Entry,
    LaunchSettings,
    SecretEnv,
    Setting,
)
from cpuaccel.errors import CpuaccelError, InventoryError, UsageError
from cpuaccel.inventory.host import Host
from cpuaccel.inventory.inventory import Inventory
from cpuaccel.rank_settings import host_env_problem

__all__ = ["DEFAULT_MASTER_PORT", "LaunchSettings", "Setting", "resolve"]


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

    def pick(self, entry: Entry) -> Setting[Any]:
        """The first source that sets it: the flag, -e, the project file, the inventory,
        else the table's default."""
        name = entry.name
        if self.flags.get(name) is not None:
            return Setting(name, self.flags[name], FLAG, self.flag_name(entry))
        for var in entry.variables:
            if var in self.extra:
                return self._checked(entry, var, self.extra[var], FLAG, f"-e {var}")
        key = entry.key
        if key is not None and self.project is not None and self.project.get(key) is not None:
            # The project file's values were checked when it was read.
            return Setting(name, self.project.get(key), PROJECT, self.project.where(key))
        for setting in self.variables(entry):
            return setting
        return entry.default_setting()

    def flag_name(self, entry: Entry) -> str:
        """The flag as typed: --nproc_per_node sets ppn as --ppn does, and is named so."""
        typed = (self.flags.get("flag_names") or {}).get(entry.name)
        return str(typed or (entry.flag.spelling if entry.flag else f"--{entry.name}"))

    def variables(self, entry: Entry) -> Iterator[Setting[Any]]:
        """The head node's variables that set it (-e included, as it is merged in)."""
        for var in entry.variables:
            value = self.head.vars.get(var)
            if value is None:
                continue
            if var in self.extra:
                yield self._checked(entry, var, value, FLAG, f"-e {var}")
                continue
            origin = self.inventory.origin(self.head.name, var)
            where = str(origin) if origin and origin.source else var
            yield self._checked(entry, var, value, INVENTORY, f"{where} ({var})")

    def _checked(self, entry: Entry, var: str, value: Any, source: str, where: str) -> Setting[Any]:
        try:
            return Setting(entry.name, entry.kind.check(value), source, where)
        except ValueError as exc:
            raise self._error(var, str(exc), getattr(exc, "hint", None)) from None

    def _error(self, var: str, message: str, fix: str | None = None) -> CpuaccelError:
        hint = fix or f"fix {var} in the inventory (or its -e)"
        if var in self.extra:
            return UsageError(f"-e {var}: {var} {message}", hint=fix or f"fix -e {var}")
        origin = self.inventory.origin(self.head.name, var)
        if origin is None or origin.source is None:
            return InventoryError(f"{var} {message}", hint=hint)
        return InventoryError(f"{var} {message}", source=origin.source, line=origin.line, hint=hint)


# ---------------------------------------------------------------- resolve

# The settings settled by rules of their own (below); every other field of the table is
# picked the same way: a flag, -e, the project file, the inventory, the default.
_OWN_RULES = frozenset(
    {"head", "hosts", "python", "workdir", "env", "host_env", "exclude", "backend", "secret_env"}
)
_PICKED = tuple(e for e in TABLE if e.field and e.name not in _OWN_RULES)


def resolve(
    flags: Mapping[str, Any],
    project: ProjectConfig | None,
    inventory: Inventory,
    hosts: Sequence[Host],
    extra_vars: Mapping[str, Any] | None = None,
    hostnames: Callable[[], Mapping[str, Sequence[str]]] | None = None,
) -> LaunchSettings:
    """Every run setting with its source, and the chosen hosts. ``flags`` holds the
    command line's values by setting name, None where a flag was not given (and
    ``flag_names``: the spelling each was typed with); ``hosts`` are the selected hosts
    (-i, --limit); ``extra_vars`` what -e set; ``hostnames`` the nodes' own hostnames
    earlier runs recorded, by which the head may be named too."""
    if not hosts:
        raise UsageError("no hosts selected", hint="check -i and --limit")
    head = head_setting(flags, project)
    ordered = order_hosts(hosts, head, hostnames)
    src = _Sources(flags, project, inventory, ordered[0], extra_vars or {})
    got: dict[str, Setting[Any]] = {entry.name: src.pick(entry) for entry in _PICKED}
    if isinstance(got["nodes"].value, str):  # the project file's "MIN:MAX"
        low, high = got["nodes"].value.split(":")
        got["min_nodes"] = dataclasses.replace(got["nodes"], name="min_nodes", value=int(low))
        got["nodes"] = dataclasses.replace(got["nodes"], value=int(high))
    chosen = choose(ordered, got["nodes"], project)
    got["ppn"] = _per_node(src, got["ppn"], len(chosen))
    if got["launcher"].value == "auto":
        # An explicit "auto" (flag or project file) still lets the inventory name one.
        got["launcher"] = next(src.variables(BY_NAME["launcher"]), got["launcher"])
    env, env_sources, host_env = _env(flags, project, src, chosen)
    where = inventory.source or "this machine"
    return LaunchSettings(
        **got,
        head=head,
        hosts=Setting("hosts", [h.name for h in chosen], INVENTORY, where),
        python=_host_value(src, chosen, BY_NAME["python"]),
        workdir=_host_value(src, chosen, BY_NAME["workdir"]),
        env=env,
        host_env=host_env,
        exclude=_exclude(flags, project),
        backend=_backend(src, env, env_sources),
        secret_env=_secret_env(src),
        chosen=tuple(chosen),
    )


def _per_node(src: _Sources, ppn: Setting[int | None], nodes: int) -> Setting[int | None]:
    """--num_processes N (Accelerate's total over all machines): N / nodes per node, the
    nodes being --nodes (or its file) else every selected host."""
    total = src.flags.get("num_processes")
    if total is None:
        return ppn
    flag = src.flag_name(BY_NAME["num_processes"])
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


def _host_value(src: _Sources, chosen: Sequence[Host], entry: Entry) -> Setting[str]:
    """cpuaccel_python or cpuaccel_workdir: the head's (as Host reads it, a venv included),
    the same on every chosen node, since rank.sh runs everywhere."""
    name, variables = entry.name, entry.variables
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
    flags: Mapping[str, Any], project: ProjectConfig | None, src: _Sources, chosen: Sequence[Host]
) -> tuple[Setting[dict[str, str]], dict[str, str], Setting[dict[str, dict[str, str]]]]:
    """The variables cpuaccel itself does not compute, merged in precedence order;
    ``where`` says which source each variable came from (also returned by name). Then
    what only some hosts' ranks get: their cpuaccel_env where the chosen hosts differ."""
    merged: dict[str, str] = {}
    sources: dict[str, str] = {}
    inventory = next(src.variables(BY_NAME["env"]), None)
    above = {**((project.get("env") if project else None) or {}), **(flags.get("env") or {})}
    common, own = _host_envs(src, chosen, inventory.value if inventory else {}, set(above))
    for key, value in common.items():
        merged[key], sources[key] = value, INVENTORY
    for key, value in ((project.get("env") if project else None) or {}).items():
        merged[key], sources[key] = value, PROJECT
    for key, value in (flags.get("env") or {}).items():
        merged[key], sources[key] = value, FLAG
    kinds = set(sources.values())
    source = next((s for s in (FLAG, PROJECT, INVENTORY) if s in kinds), DEFAULT)
    where = ", ".join(f"{k}: {v}" for k, v in sources.items()) or None
    host_env: Setting[dict[str, dict[str, str]]] = BY_NAME["host_env"].default_setting()
    if own:
        shown = ", ".join(f"{h}: {' '.join(own[h])}" for h in own)
        host_env = Setting("host_env", own, INVENTORY, shown)
    return Setting("env", merged, source, where), sources, host_env


def _host_envs(
    src: _Sources, chosen: Sequence[Host], head_env: Mapping[str, str], above: set[str]
) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """Each chosen host's cpuaccel_env, as Ansible gives it (a host's own mapping
    replaces its groups'), split into what every host has alike and what each host has
    of its own. A name the project file or --env sets is theirs on every host. A name
    that cannot differ between hosts (rank_settings.host_env_problem) and does is an
    error naming the host and where its cpuaccel_env was written."""
    envs = {src.head.name: dict(head_env)}
    for host in chosen[1:]:
        envs[host.name] = _checked_env(src, host)
    names = {key for env in envs.values() for key in env if key not in above}
    alike = {key for key in names if len({env.get(key) for env in envs.values()}) == 1}
    for key in sorted(names - alike):
        why = host_env_problem(key)
        if why is not None:
            raise _differs(src, chosen, envs, key, why)
    common = {key: head_env[key] for key in head_env if key in alike}
    own = {
        name: {key: value for key, value in env.items() if key in names - alike}
        for name, env in envs.items()
    }
    return common, {name: env for name, env in own.items() if env}


def _checked_env(src: _Sources, host: Host) -> dict[str, str]:
    """``host``'s cpuaccel_env, checked as the head's is."""
    value = host.vars.get("cpuaccel_env")
    if value is None:
        return {}
    try:
        checked: dict[str, str] = BY_NAME["env"].kind.check(value)
    except ValueError as exc:
        hint = getattr(exc, "hint", None)
        raise _host_error(src, host.name, f"cpuaccel_env {exc}", hint) from None
    return checked


def _differs(
    src: _Sources,
    chosen: Sequence[Host],
    envs: Mapping[str, Mapping[str, str]],
    key: str,
    why: str,
) -> CpuaccelError:
    """The error for ``key``, which some host's cpuaccel_env sets otherwise than the
    head's: that host, both values, the reason it cannot differ."""
    head = src.head.name
    other = next(h.name for h in chosen[1:] if envs[h.name].get(key) != envs[head].get(key))
    said = {name: envs[name].get(key) for name in (other, head)}
    shown = ", ".join(
        f"{name} {key}={value}" if value is not None else f"{name} none"
        for name, value in said.items()
    )
    return _host_error(
        src,
        other,
        f"cpuaccel_env {key} differs between hosts ({shown}): {why}",
        f"give {key} one value for every host (in all: vars, the project file's env or "
        "--env); a host's own cpuaccel_env replaces its groups' whole",
    )


def _host_error(src: _Sources, host: str, message: str, hint: str | None) -> CpuaccelError:
    """An InventoryError about ``host``'s cpuaccel_env, at the file:line it was written."""
    hint = hint or "fix cpuaccel_env in the inventory"
    origin = src.inventory.origin(host, "cpuaccel_env")
    if origin is None or origin.source is None:
        return InventoryError(f"{host}: {message}", hint=hint)
    return InventoryError(f"{host}: {message}", source=origin.source, line=origin.line, hint=hint)


def _exclude(flags: Mapping[str, Any], project: ProjectConfig | None) -> Setting[list[str]]:
    given = list(flags.get("exclude") or ())
    from_project = list((project.get("exclude") if project else None) or [])
    if given:
        from cpuaccel.projectsync.ignore import check_excludes

        check_excludes(given)
        return Setting("exclude", [*from_project, *given], FLAG, "--exclude")
    if from_project:
        where = project.where("exclude") if project else None
        return Setting("exclude", from_project, PROJECT, where)
    return BY_NAME["exclude"].default_setting()


def _backend(
    src: _Sources, env: Setting[dict[str, str]], env_sources: Mapping[str, str]
) -> Setting[str | None]:
    """CPUACCEL_BACKEND set in the env (any source), else cpuaccel_backend."""
    entry = BY_NAME["backend"]
    for var in entry.env:
        if env.value.get(var):
            return Setting("backend", env.value[var], env_sources[var], f"env {var}")
    return src.pick(entry)


def _secret_env(src: _Sources) -> Setting[SecretEnv]:
    """cpuaccel_secret_env, under the credentials passed by name (--env HF_TOKEN)."""
    found = next(src.variables(BY_NAME["secret_env"]), None)
    given = dict(src.flags.get("secret_env") or {})
    if given:
        merged = {**(found.value if found else {}), **given}
        where = ", ".join(f"--env {name}" for name in given)
        return Setting("secret_env", SecretEnv(merged), FLAG, where)
    if found is None:
        return Setting("secret_env", SecretEnv(), DEFAULT)
    return Setting("secret_env", SecretEnv(found.value), found.source, found.where)


# ---------------------------------------------------------------- the chosen hosts
# Which hosts a run uses: the head node (``--master_addr``, the project file's ``head``)
# first, then the first ``--nodes`` of the selected hosts.
#
# Part of ``config.effective.resolve``; apart so that choosing hosts, with its errors
# naming where a number or a name was written, reads on its own.
def order_hosts(
    hosts: Sequence[Host],
    head: Setting[str | None],
    hostnames: Callable[[], Mapping[str, Sequence[str]]] | None = None,
) -> list[Host]:
    """The head node first: mpirun runs there and rank 0 with it. The head is named by
    its inventory name, its address, or (``hostnames``: what earlier runs recorded) the
    node's own hostname."""
    if head.value is None:
        return list(hosts)
    wanted = str(head.value)
    found = next((h for h in hosts if wanted in (h.name, h.address)), None)
    if found is None and hostnames is not None:
        named = hostnames().get(wanted, ())
        found = next((h for h in hosts if h.name in named), None)
    if found is None and head.source == FLAG:
        raise UsageError(
            f"{head.where} {wanted}: not among the selected hosts "
            f"({', '.join(h.name for h in hosts)})",
            hint="name a host of the inventory (its name or ansible_host), or widen --limit",
        )
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


def head_setting(flags: Mapping[str, Any], project: ProjectConfig | None) -> Setting[str | None]:
    """--master_addr (any of its spellings), else the project file's head, else none:
    the first selected host."""
    entry = BY_NAME["head"]
    if flags.get("head") is not None:
        where = (flags.get("flag_names") or {}).get("head")
        spelling = entry.flag.spelling if entry.flag else "--master_addr"
        return Setting("head", str(flags["head"]), FLAG, str(where or spelling))
    if project is not None and project.get("head"):
        return Setting("head", project.get("head"), PROJECT, project.where("head"))
    return entry.default_setting()


def choose(
    ordered: list[Host], nodes: Setting[int | None], project: ProjectConfig | None
) -> list[Host]:
    """The first ``nodes`` of the hosts, head first; more than there are is an error
    naming where the number was written."""
    if nodes.value is None:
        return ordered
    if nodes.value > len(ordered):
        if ordered[0].slurm_job is not None and nodes.source == FLAG:  # an allocation's nodes
            from cpuaccel.slurm import allocation  # only an allocation's nodes need it

            job = f"Slurm job {ordered[0].slurm_job}"
            raise allocation.too_few(job, nodes.value, [h.name for h in ordered])
        names = ", ".join(h.name for h in ordered)
        message = f"{nodes.value} nodes, but {len(ordered)} host(s) are selected ({names})"
        if project is not None and nodes.source == PROJECT:
            raise project.error(
                "nodes", message, "add hosts to the inventory (or hostfile), or lower it"
            )
        raise UsageError(
            f"{nodes.where or '--nodes'} {nodes.value}, but {len(ordered)} host(s) are "
            f"selected ({names})",
            hint="lower --nodes, or add hosts to the inventory / widen --limit",
        )
    return ordered[: nodes.value]
