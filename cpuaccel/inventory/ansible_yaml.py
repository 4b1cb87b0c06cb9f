"""The YAML side of the inventory: an Ansible YAML inventory walked node by node.

The YAML is composed into nodes and walked by hand rather than loaded into dicts: that
keeps the line of every key and value, so each mistake is reported as file:line with a
fix, and each merged variable remembers where it was written. ``Loader.build`` merges
variables with Ansible's precedence into an :class:`~cpuaccel.inventory.inventory.Inventory`.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from cpuaccel.errors import InventoryError
from cpuaccel.inventory.host import Host, ssh_options
from cpuaccel.inventory.inventory import (
    CONNECTIONS,
    EXTRA_VARS_SOURCE,
    GROUP_KEYS,
    PORT_VARS,
    PRIORITY_VAR,
    SSH_ARGS_VARS,
    Group,
    Inventory,
    Origin,
)
from cpuaccel.inventory.patterns import parse_host_key

_NULL_TAG = "tag:yaml.org,2002:null"
_MERGE_TAG = "tag:yaml.org,2002:merge"


@dataclass
class _GroupDraft:
    name: str
    line: int | None
    hosts: list[str] = field(default_factory=list)
    children: dict[str, int] = field(default_factory=dict)  # child -> line naming it
    vars: dict[str, Any] = field(default_factory=dict)
    origins: dict[str, Origin] = field(default_factory=dict)
    priority: int = 1


@dataclass
class _HostDraft:
    groups: list[str] = field(default_factory=list)
    vars: dict[str, Any] = field(default_factory=dict)
    origins: dict[str, Origin] = field(default_factory=dict)


def _kind(node: Node) -> str:
    if isinstance(node, MappingNode):
        return "a mapping"
    if isinstance(node, SequenceNode):
        return "a list"
    return f"the value {node.value!r}"


def _is_null(node: Node) -> bool:
    return isinstance(node, ScalarNode) and node.tag == _NULL_TAG


def _line(node: Node) -> int:
    return int(node.start_mark.line) + 1


def _is_port(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    return isinstance(value, int) and 1 <= value <= 65535


def _same(a: Any, b: Any) -> bool:
    # type() too, or True and 1 would count as the same value.
    return type(a) is type(b) and bool(a == b)


class Loader:
    """Walks one composed YAML document, collecting drafts, then builds the Inventory."""

    def __init__(self, source: str | None) -> None:
        self.source = source
        self.constructor = yaml.SafeLoader("")
        self.groups: dict[str, _GroupDraft] = {}
        self.hosts: dict[str, _HostDraft] = {}

    def error(self, message: str, line: int | None, hint: str) -> InventoryError:
        return InventoryError(message, source=self.source, line=line, hint=hint)

    def group(self, name: str, line: int | None) -> _GroupDraft:
        return self.groups.setdefault(name, _GroupDraft(name, line))

    def host(self, name: str) -> _HostDraft:
        return self.hosts.setdefault(name, _HostDraft())

    def load(self, text: str, extra_vars: Mapping[str, Any]) -> Inventory:
        try:
            root = yaml.compose(text, Loader=yaml.SafeLoader)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
            problem = getattr(exc, "problem", None) or str(exc)
            raise self.error(
                f"YAML syntax error: {problem}",
                mark.line + 1 if mark is not None else None,
                "fix the YAML at that line: check indentation, and that each 'key: value' "
                "has a space after the colon",
            ) from None
        if root is None or _is_null(root):
            raise self.error("the inventory is empty: it defines no hosts", 1, _NO_HOSTS_HINT)
        if not isinstance(root, MappingNode):
            raise self.error(
                f"the inventory must be a YAML mapping of groups, got {_kind(root)}",
                _line(root),
                "start the file with 'all:' and list hosts under 'all: hosts:'; an INI "
                "inventory can be converted with 'ansible-inventory -i FILE --list -y'",
            )
        self.group("all", None)
        for name, line, node in self.pairs(root, "the top level"):
            if name in GROUP_KEYS:
                raise self.error(
                    f"'{name}:' at the top level: it must belong to a group",
                    line,
                    f"put it under 'all:': add a line 'all:' above it, indent '{name}:' below",
                )
            self.parse_group(name, node, line)
        if not self.hosts:
            raise self.error("the inventory defines no hosts", _line(root), _NO_HOSTS_HINT)
        return self.build(extra_vars)

    def pairs(self, node: MappingNode, what: str) -> list[tuple[str, int, Node]]:
        """(key, key line, value) of a mapping; duplicates are errors, '<<' merges apply."""
        seen: dict[str, int] = {}
        for key, _value in node.value:
            if key.tag == _MERGE_TAG:
                continue
            if not isinstance(key, ScalarNode) or not key.value:
                raise self.error(
                    f"a key of {what} is not a plain name", _line(key), "use a plain word as key"
                )
            if key.value in seen:
                raise self.error(
                    f"duplicate key {key.value!r} in {what} (first written at line "
                    f"{seen[key.value]})",
                    _line(key),
                    "keep one of them: YAML keeps only one value per key, so the other "
                    "is silently lost",
                )
            seen[key.value] = _line(key)
        try:
            self.constructor.flatten_mapping(node)
        except yaml.YAMLError as exc:
            raise self._construct_error(exc, node) from None
        # After a '<<' merge, keys written here come after the merged ones and win.
        merged = {key.value: (_line(key), value) for key, value in node.value}
        return [(key, line, value) for key, (line, value) in merged.items()]

    def parse_group(self, name: str, node: Node, line: int) -> None:
        group = self.group(name, line)
        if group.line is None:  # "all" exists before it is written
            group.line = line
        if _is_null(node):
            return
        if not isinstance(node, MappingNode):
            raise self.error(
                f"group {name!r} must be a mapping of hosts:, vars: and children:, "
                f"got {_kind(node)}",
                _line(node),
                f"write it as '{name}:' followed by indented 'hosts:' (or vars:, children:)",
            )
        for key, key_line, value in self.pairs(node, f"group {name!r}"):
            if key == "hosts":
                self.parse_hosts(group, value)
            elif key == "vars":
                group_vars, origins = self.read_vars(value, f"the vars of group {name!r}")
                if PRIORITY_VAR in group_vars:
                    group.priority = self.priority(group_vars.pop(PRIORITY_VAR), origins)
                group.vars.update(group_vars)
                group.origins.update(origins)
            elif key == "children":
                self.parse_children(group, value)
            else:
                close = difflib.get_close_matches(key, GROUP_KEYS, n=1)
                fix = (
                    f"did you mean '{close[0]}:'?"
                    if close
                    else f"if {key!r} is a host, list it under '{name}: hosts:'; if it is a "
                    f"group, under '{name}: children:'"
                )
                raise self.error(
                    f"unknown key {key!r} in group {name!r}: a group holds only hosts:, "
                    "vars: and children:",
                    key_line,
                    fix,
                )

    def priority(self, value: Any, origins: Mapping[str, Origin]) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(
                f"{PRIORITY_VAR} must be an integer, got {value!r}",
                origins[PRIORITY_VAR].line,
                f"write e.g. {PRIORITY_VAR}: 10 (higher wins among groups of the same depth)",
            )
        return value

    def parse_hosts(self, group: _GroupDraft, node: Node) -> None:
        if _is_null(node):
            return
        if not isinstance(node, MappingNode):
            raise self.error(
                f"the hosts of group {group.name!r} must be a mapping of host names, "
                f"got {_kind(node)}",
                _line(node),
                "write each host on its own indented line as a key ending in ':' (node1:), "
                "not as a list item (- node1)",
            )
        for key, line, value in self.pairs(node, f"the hosts of group {group.name!r}"):
            try:
                names, port = parse_host_key(key)
            except InventoryError as exc:
                raise self.error(exc.message, line, exc.hint or "") from None
            host_vars: dict[str, Any] = {}
            origins: dict[str, Origin] = {}
            if port is not None:
                host_vars["ansible_port"] = port
                origins["ansible_port"] = Origin(self.source, line)
            if not _is_null(value):
                if not isinstance(value, MappingNode):
                    raise self.error(
                        f"host {key!r} must map to its variables or to nothing, got {_kind(value)}",
                        _line(value),
                        f"write '{key}:' alone, or with indented NAME: value lines below it",
                    )
                written, written_at = self.read_vars(value, f"host {key!r}")
                host_vars.update(written)
                origins.update(written_at)
            for name in names:
                self.add_host(group, name, host_vars, origins)

    def add_host(
        self, group: _GroupDraft, name: str, host_vars: dict[str, Any], origins: dict[str, Origin]
    ) -> None:
        host = self.host(name)
        if group.name not in host.groups:
            host.groups.append(group.name)
        if name not in group.hosts:
            group.hosts.append(name)
        for var, value in host_vars.items():
            if var in host.vars and not _same(host.vars[var], value):
                raise self.error(
                    f"host {name!r} sets {var} to {value!r} here, but to {host.vars[var]!r} "
                    f"at line {host.origins[var].line}",
                    origins[var].line,
                    f"a host's own variables must agree wherever it is listed: keep one value "
                    f"for {var}, or move it to a group's vars",
                )
            host.vars[var] = value
            host.origins[var] = origins[var]

    def parse_children(self, group: _GroupDraft, node: Node) -> None:
        if _is_null(node):
            return
        if not isinstance(node, MappingNode):
            raise self.error(
                f"the children of group {group.name!r} must be a mapping of group names, "
                f"got {_kind(node)}",
                _line(node),
                "write each child group as a key ending in ':' (web:), not as a list item",
            )
        for name, line, value in self.pairs(node, f"the children of group {group.name!r}"):
            if name in GROUP_KEYS or name == "all":
                raise self.error(
                    f"{name!r} cannot be a child group of {group.name!r}",
                    line,
                    "'all' contains every group already"
                    if name == "all"
                    else f"'{name}:' belongs directly in the group, next to 'children:', "
                    "not under it",
                )
            group.children.setdefault(name, line)
            self.parse_group(name, value, line)

    def read_vars(self, node: Node, what: str) -> tuple[dict[str, Any], dict[str, Origin]]:
        values: dict[str, Any] = {}
        origins: dict[str, Origin] = {}
        if _is_null(node):
            return values, origins
        if not isinstance(node, MappingNode):
            raise self.error(
                f"{what} must be a mapping of NAME: value, got {_kind(node)}",
                _line(node),
                "write one 'NAME: value' per line, indented under the key",
            )
        for name, line, value in self.pairs(node, what):
            if not name.isidentifier():
                raise self.error(
                    f"invalid variable name {name!r} in {what}",
                    line,
                    "variable names use letters, digits and '_', and do not start with a digit",
                )
            self.check_duplicates(value, set())
            try:
                values[name] = self.constructor.construct_object(value, deep=True)
            except yaml.YAMLError as exc:
                raise self._construct_error(exc, value) from None
            origins[name] = Origin(self.source, _line(value))
        return values, origins

    def check_duplicates(self, node: Node, visited: set[int]) -> None:
        """Duplicate keys nested in a variable's value are errors too (PyYAML ignores them)."""
        if id(node) in visited:
            return
        visited.add(id(node))
        if isinstance(node, MappingNode):
            seen: dict[str, int] = {}
            for key, value in node.value:
                if isinstance(key, ScalarNode) and key.tag != _MERGE_TAG:
                    if key.value in seen:
                        raise self.error(
                            f"duplicate key {key.value!r} (first written at line "
                            f"{seen[key.value]})",
                            _line(key),
                            "keep one of them: YAML keeps only one value per key",
                        )
                    seen[key.value] = _line(key)
                self.check_duplicates(value, visited)
        elif isinstance(node, SequenceNode):
            for item in node.value:
                self.check_duplicates(item, visited)

    def _construct_error(self, exc: yaml.YAMLError, node: Node) -> InventoryError:
        mark = getattr(exc, "problem_mark", None)
        return self.error(
            f"cannot read this value: {getattr(exc, 'problem', None) or exc}",
            mark.line + 1 if mark is not None else _line(node),
            "use plain YAML values: tags such as !vault (Ansible Vault) are not supported",
        )

    def build(self, extra_vars: Mapping[str, Any]) -> Inventory:
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
        self.check_cycles()

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
            for group_name in ordered:
                merged.update(self.groups[group_name].vars)
                where.update(self.groups[group_name].origins)
            for values, at in ((draft.vars, draft.origins), (extra_vars, extra_origins)):
                merged.update(values)
                where.update(at)
            if name == "localhost" and merged.get("ansible_connection") is None:
                merged["ansible_connection"] = "local"
                where["ansible_connection"] = Origin(None, None)
            _validate(name, merged, where)
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
        return Inventory(self.source, hosts, groups, origins)

    def check_cycles(self) -> None:
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


_NO_HOSTS_HINT = "list hosts under 'all: hosts:', one 'node1:' key per host, indented below"


def _validate(host: str, merged: Mapping[str, Any], where: Mapping[str, Origin]) -> None:
    """Check the values a host ended up with, reporting where each bad one was written."""

    def fail(var: str, message: str, hint: str) -> InventoryError:
        at = where.get(var, Origin(None, None))
        return InventoryError(
            f"host {host!r}: {message}", source=at.source, line=at.line, hint=hint
        )

    port_hint = "use an integer from 1 to 65535, e.g. ansible_port: 2222"
    for var in PORT_VARS:
        if merged.get(var) is not None and not _is_port(merged[var]):
            raise fail(var, f"{var} is {merged[var]!r}, not a port number", port_hint)
    for var in SSH_ARGS_VARS:
        port = ssh_options({var: merged.get(var)}).get("port")
        if port is not None and not _is_port(port):
            raise fail(var, f"{var} sets Port to {port!r}, not a port number", port_hint)
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
