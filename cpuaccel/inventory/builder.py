"""Merging an inventory's variables, whatever file the hosts and groups came from.

A source (the Ansible YAML reader, a plain MPI hostfile, the implicit localhost) fills
an :class:`InventoryBuilder` with drafts of groups and hosts, each variable with the
place it was written; :meth:`InventoryBuilder.build` merges them with Ansible's
precedence and checks the values every host ends up with, blaming the line that wrote a
bad one. Ansible's order (its default VARIABLE_PRECEDENCE, lib/ansible/vars/manager.py),
lowest first: the inventory file's group vars (all < parent group < child group), then
group_vars/all beside the inventory, beside the playbook, then group_vars/<group> (by
group depth) beside the inventory, beside the playbook, then the inventory file's host
vars, host_vars/<host> beside the inventory, beside the playbook, and -e last.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any, NamedTuple

from cpuaccel.errors import InventoryError
from cpuaccel.inventory.host import Host, ssh_options
from cpuaccel.inventory.variables import (
    VARIABLES,
    Declared,
    hint_for,
    user_name_problem,
)

CONNECTIONS = ("ssh", "local", "paramiko", "smart", "slurm")  # slurm: connectors/srun.py
PORT_VARS = ("ansible_port", "ansible_ssh_port")
SSH_ARGS_VARS = ("ansible_ssh_common_args", "ansible_ssh_extra_args")
EXTRA_VARS_SOURCE = "-e"
# OpenSSH's words for StrictHostKeyChecking (readconf.c).
STRICT_WORDS = ("yes", "no", "ask", "accept-new", "off", "true", "false")
# Variables whose values are secrets: messages name them, never show their values.
SECRET_VARS = frozenset(
    {
        "cpuaccel_secret_env",
        "ansible_password",
        "ansible_ssh_pass",
        "ansible_become_password",
        "ansible_become_pass",
        "ansible_sudo_pass",
    }
)


class Origin(NamedTuple):
    """Where a variable was written: the file (or "-e") and the line, when known."""

    source: str | None
    line: int | None

    def __str__(self) -> str:
        return f"{self.source}:{self.line}" if self.line is not None else str(self.source)


@dataclass(frozen=True)
class Group:
    """A group as written: its direct hosts, child group names and own variables."""

    name: str
    hosts: tuple[str, ...] = ()
    children: tuple[str, ...] = ()
    vars: Mapping[str, Any] = field(default_factory=dict)
    line: int | None = None
    depth: int = 0
    priority: int = 1


@dataclass
class GroupDraft:
    name: str
    line: int | None
    hosts: list[str] = field(default_factory=list)
    children: dict[str, int] = field(default_factory=dict)  # child -> line naming it
    vars: dict[str, Any] = field(default_factory=dict)
    origins: dict[str, Origin] = field(default_factory=dict)
    priority: int = 1


@dataclass
class HostDraft:
    groups: list[str] = field(default_factory=list)
    vars: dict[str, Any] = field(default_factory=dict)
    origins: dict[str, Origin] = field(default_factory=dict)


class FileVars(NamedTuple):
    """The variables of a group_vars/ or host_vars/ file (or folder), with their lines."""

    vars: dict[str, Any]
    origins: dict[str, Origin]


# Layers of vars files: beside the inventory, then beside the playbook (which wins).
FILE_LAYERS = (0, 1)


class Built(NamedTuple):
    """What :meth:`InventoryBuilder.build` gives: the arguments of an Inventory."""

    hosts: dict[str, Host]
    groups: dict[str, Group]
    origins: dict[str, dict[str, Origin]]


def _same(a: Any, b: Any) -> bool:
    # type() too, or True and 1 would count as the same value.
    return type(a) is type(b) and bool(a == b)


def _is_port(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    return isinstance(value, int) and 1 <= value <= 65535


class InventoryBuilder:
    """Groups and hosts as a source wrote them, merged by :meth:`build`."""

    def __init__(self, source: str | None) -> None:
        self.source = source
        self.groups: dict[str, GroupDraft] = {"all": GroupDraft("all", None)}
        self.hosts: dict[str, HostDraft] = {}
        # (layer, name) -> the group_vars/<name> or host_vars/<name> variables.
        self.group_files: dict[tuple[int, str], FileVars] = {}
        self.host_files: dict[tuple[int, str], FileVars] = {}

    def error(self, message: str, line: int | None, hint: str) -> InventoryError:
        return InventoryError(message, source=self.source, line=line, hint=hint)

    def group(self, name: str, line: int | None) -> GroupDraft:
        return self.groups.setdefault(name, GroupDraft(name, line))

    def host(self, name: str) -> HostDraft:
        return self.hosts.setdefault(name, HostDraft())

    def add_host(
        self,
        group: GroupDraft,
        name: str,
        host_vars: Mapping[str, Any],
        origins: Mapping[str, Origin],
    ) -> None:
        """List ``name`` in ``group`` with its own variables; a host listed in several
        places must give each of its variables one value."""
        host = self.host(name)
        if group.name not in host.groups:
            host.groups.append(group.name)
        if name not in group.hosts:
            group.hosts.append(name)
        for var, value in host_vars.items():
            if var in host.vars and not _same(host.vars[var], value):
                # A secret's values never reach a message (a terminal, a CI log).
                now, then = (value, host.vars[var]) if var not in SECRET_VARS else ("***",) * 2
                raise self.error(
                    f"host {name!r} sets {var} to {now!r} here, but to {then!r} "
                    f"at line {host.origins[var].line}",
                    origins[var].line,
                    f"a host's own variables must agree wherever it is listed: keep one value "
                    f"for {var}, or move it to a group's vars",
                )
            host.vars[var] = value
            host.origins[var] = origins[var]
        for key, at in origins.items():
            if "." in key:  # the line of each key of a mapping value (see _check_variable)
                host.origins[key] = at

    def build(self, extra_vars: Mapping[str, Any]) -> Built:
        parents = self._parents()
        self._check_cycles()

        @cache
        def depth(name: str) -> int:
            return 1 + max(depth(p) for p in parents[name]) if parents[name] else 0

        @cache
        def ancestors(name: str) -> frozenset[str]:
            found = {name}
            for parent in parents[name]:
                found |= ancestors(parent)
            return frozenset(found)

        def merge_key(name: str) -> tuple[int, int, str]:
            return depth(name), self.groups[name].priority, name

        extra_origins = {name: Origin(EXTRA_VARS_SOURCE, None) for name in extra_vars}
        hosts: dict[str, Host] = {}
        origins: dict[str, dict[str, Origin]] = {}
        for name, draft in self.hosts.items():
            member: set[str] = {"all"}
            for group_name in draft.groups:
                member |= ancestors(group_name)
            ordered = sorted(member, key=merge_key)
            merged: dict[str, Any] = {}
            where: dict[str, Origin] = {}
            for values, at in self._layers(name, ordered):
                merged.update(values)
                where.update(at)
            merged.update(extra_vars)
            where.update(extra_origins)
            if name == "localhost" and merged.get("ansible_connection") is None:
                merged["ansible_connection"] = "local"
                where["ansible_connection"] = Origin(None, None)
            validate(name, merged, where)
            hosts[name] = Host(name, merged, tuple(ordered))
            origins[name] = where
        groups = {
            name: Group(
                name=name,
                hosts=tuple(g.hosts),
                children=tuple(g.children),
                vars=dict(g.vars),
                line=g.line,
                depth=depth(name),
                priority=g.priority,
            )
            for name, g in self.groups.items()
        }
        return Built(hosts, groups, origins)

    def _layers(
        self, host: str, ordered: list[str]
    ) -> list[tuple[Mapping[str, Any], Mapping[str, Origin]]]:
        """``host``'s variables, lowest precedence first (see the module's docstring);
        ``ordered``: its groups, "all" first, by depth, priority and name."""
        layers: list[tuple[Mapping[str, Any], Mapping[str, Origin]]] = [
            (self.groups[g].vars, self.groups[g].origins) for g in ordered
        ]
        groups = ["all"] + [g for g in ordered if g != "all"]
        for names in (groups[:1], groups[1:]):
            layers += [
                self.group_files[(layer, g)]
                for layer in FILE_LAYERS
                for g in names
                if (layer, g) in self.group_files
            ]
        draft = self.hosts[host]
        layers.append((draft.vars, draft.origins))
        layers += [self.host_files[(n, host)] for n in FILE_LAYERS if (n, host) in self.host_files]
        return layers

    def _parents(self) -> dict[str, list[str]]:
        all_group = self.groups["all"]
        parents: dict[str, list[str]] = {name: [] for name in self.groups}
        for group in self.groups.values():
            for child in group.children:
                parents[child].append(group.name)
        for name, group_parents in parents.items():
            if not group_parents and name != "all":
                # Like Ansible, a group nobody claims is a child of all.
                group_parents.append("all")
                all_group.children.setdefault(name, self.groups[name].line or 0)
        return parents

    def _check_cycles(self) -> None:
        done: set[str] = set()

        def visit(name: str, path: list[str]) -> None:
            for child, line in self.groups[name].children.items():
                if child in path:
                    cycle = " -> ".join([*path[path.index(child) :], child])
                    raise self.error(
                        f"group cycle: {cycle}",
                        line,
                        f"a group cannot contain itself: remove {child!r} from the children "
                        f"of {name!r}",
                    )
                if child not in done:
                    visit(child, [*path, child])
            done.add(name)

        for name in self.groups:
            if name not in done:
                visit(name, [name])


_OWN = {var: Declared(check) for var, check in VARIABLES.items()}


def validate(host: str, merged: Mapping[str, Any], where: Mapping[str, Origin]) -> None:
    """Check the values a host ended up with, reporting where each bad one was written."""

    def fail(var: str, message: str, hint: str) -> InventoryError:
        at = where.get(var, Origin(None, None))
        return InventoryError(
            f"host {host!r}: {message}", source=at.source, line=at.line, hint=hint
        )

    check_declared(host, merged, where, _OWN)
    port_hint = "use an integer from 1 to 65535, e.g. ansible_port: 2222"
    for var in PORT_VARS:
        if merged.get(var) is not None and not _is_port(merged[var]):
            raise fail(var, f"{var} is {merged[var]!r}, not a port number", port_hint)
    for var in SSH_ARGS_VARS:
        port = ssh_options({var: merged.get(var)}).get("port")
        if port is not None and not _is_port(port):
            raise fail(var, f"{var} sets Port to {port!r}, not a port number", port_hint)
    for var in SSH_ARGS_VARS:  # a User= there is the login name, as ansible_user is
        user = ssh_options({var: merged.get(var)}).get("user")
        if user is not None and user_name_problem(user) is not None:
            raise fail(var, f"{var} sets User to {user_name_problem(user)}", hint_for(var))
    strict = ssh_options(merged).get("stricthostkeychecking")
    if strict is not None and strict.lower() not in STRICT_WORDS:
        var = next(
            (v for v in SSH_ARGS_VARS if "stricthostkeychecking" in str(merged.get(v)).lower()),
            SSH_ARGS_VARS[0],
        )
        raise fail(
            var,
            f"StrictHostKeyChecking={strict} in {var} is not a value ssh knows",
            f"use one of {', '.join(STRICT_WORDS)}",
        )
    connection = merged.get("ansible_connection")
    if connection is not None and str(connection) not in CONNECTIONS:
        short = str(connection).rsplit(".", 1)[-1].replace("paramiko_ssh", "paramiko")
        raise fail(
            "ansible_connection",
            f"ansible_connection {connection!r} is not supported",
            f"use ansible_connection: {short}"
            if short in CONNECTIONS
            else f"use one of {', '.join(CONNECTIONS)} (cpuaccel reaches hosts over SSH or runs "
            "locally)",
        )


def check_declared(
    host: str,
    merged: Mapping[str, Any],
    where: Mapping[str, Origin],
    declared: Mapping[str, Declared],
) -> None:
    """The values a host ended up with of the ``declared`` variables, each against its
    check; the error names the line that wrote it (a bad key of a mapping: that key's
    line), or the -e."""
    for var, declaration in declared.items():
        if merged.get(var) is not None:
            _check_variable(host, var, merged[var], declaration, where)


def _check_variable(
    host: str, var: str, value: Any, declared: Declared, where: Mapping[str, Origin]
) -> None:
    try:
        declared.check(value)
    except ValueError as exc:  # BadValue, or a setting kind's complaint
        at = where.get(var, Origin(None, None))
        key = getattr(exc, "key", None)
        if key is not None:
            at = where.get(f"{var}.{key}", at)
        hint = getattr(exc, "hint", None) or declared.hint or hint_for(var)
        if at.source == EXTRA_VARS_SOURCE:
            raise InventoryError(f"-e {var}: {var} {exc}", hint=f"fix -e {var}: {hint}") from None
        raise InventoryError(
            f"host {host!r}: {var} {exc}", source=at.source, line=at.line, hint=hint
        ) from None
