"""An Ansible YAML inventory, walked node by node into an InventoryBuilder.

The YAML is composed into nodes (by :mod:`cpuaccel.yamlsource`) and walked by hand
rather than loaded into dicts: that keeps the line of every key and value, so each
mistake is reported as file:line with a fix, and each variable remembers where it was
written. Merging the variables is the builder's (:mod:`cpuaccel.inventory.builder`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from yaml.nodes import MappingNode, Node

from cpuaccel.errors import InventoryError
from cpuaccel.inventory.builder import GroupDraft, InventoryBuilder, Origin
from cpuaccel.inventory.patterns import parse_host_key
from cpuaccel.inventory.variables import host_name_problem
from cpuaccel.yamlsource import YamlReader, is_null, kind, line_of

GROUP_KEYS = ("hosts", "vars", "children")
PRIORITY_VAR = "ansible_group_priority"
_NO_HOSTS_HINT = "list hosts under 'all: hosts:', one 'node1:' key per host, indented below"


def read_inventory(text: str, source: str | None) -> InventoryBuilder:
    """The groups and hosts of an Ansible YAML inventory, ready to be merged."""
    return _Walker(source).walk(text)


def read_vars_file(text: str, source: str) -> tuple[dict[str, Any], dict[str, Origin]]:
    """A group_vars/host_vars file: a YAML mapping of NAME: value, each with its line."""
    walker = _Walker(source)
    root = walker.yaml.compose(text)
    if root is None or is_null(root):
        return {}, {}  # an empty file sets nothing (as in Ansible)
    return walker.read_vars(root, "a vars file")


class _Walker:
    """Walks one composed YAML document, filling an InventoryBuilder."""

    def __init__(self, source: str | None) -> None:
        self.source = source
        self.yaml = YamlReader(source, InventoryError)
        self.built = InventoryBuilder(source)
        # The group mappings being walked: an alias can make a group its own child.
        self._walking: set[int] = set()

    def error(self, message: str, line: int | None, hint: str) -> InventoryError:
        return InventoryError(message, source=self.source, line=line, hint=hint)

    def walk(self, text: str) -> InventoryBuilder:
        root = self.yaml.compose(text)
        if root is None or is_null(root):
            raise self.error("the inventory is empty: it defines no hosts", 1, _NO_HOSTS_HINT)
        if not isinstance(root, MappingNode):
            raise self.error(
                f"the inventory must be a YAML mapping of groups, got {kind(root)}",
                line_of(root),
                "start the file with 'all:' and list hosts under 'all: hosts:'; an INI "
                "inventory can be converted with 'ansible-inventory -i FILE --list -y'",
            )
        for name, line, node in self.yaml.pairs(root, "the top level"):
            if name == "plugin" and not isinstance(node, MappingNode):
                raise self.error(
                    f"inventory plugins ('plugin: {getattr(node, 'value', '')}') are not "
                    "supported: cpuaccel reads the hosts of a YAML or INI inventory",
                    line,
                    "write the plugin's hosts to a file with 'ansible-inventory -i FILE "
                    "--list -y > inventory.yaml' and pass that",
                )
            if name in GROUP_KEYS:
                raise self.error(
                    f"'{name}:' at the top level: it must belong to a group",
                    line,
                    f"put it under 'all:': add a line 'all:' above it, indent '{name}:' below",
                )
            self.parse_group(name, node, line)
        if not self.built.hosts:
            raise self.error("the inventory defines no hosts", line_of(root), _NO_HOSTS_HINT)
        return self.built

    def parse_group(self, name: str, node: Node, line: int) -> None:
        group = self.built.group(name, line)
        if group.line is None:  # "all" exists before it is written
            group.line = line
        if is_null(node):
            return
        if not isinstance(node, MappingNode):
            raise self.error(
                f"group {name!r} must be a mapping of hosts:, vars: and children:, "
                f"got {kind(node)}",
                line_of(node),
                f"write it as '{name}:' followed by indented 'hosts:' (or vars:, children:)",
            )
        if id(node) in self._walking:
            raise self.error(
                f"group {name!r} is a YAML alias of a group that contains it",
                line,
                "a group cannot be its own child: name the child group without '*alias'",
            )
        self._walking.add(id(node))
        try:
            self.parse_group_keys(group, node)
        finally:
            self._walking.discard(id(node))

    def parse_group_keys(self, group: GroupDraft, node: MappingNode) -> None:
        name = group.name
        for key, key_line, value in self.yaml.pairs(node, f"group {name!r}"):
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
                import difflib  # only for the hint on a bad key: off start-up

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

    def mapping_pairs(
        self, node: Node, what: str, holds: str, hint: str
    ) -> list[tuple[str, int, Node]]:
        """The (key, line, value) pairs of ``node``, a mapping of ``holds`` (none when it
        is empty); any other value is an error naming its line, with ``hint``."""
        if is_null(node):
            return []
        if not isinstance(node, MappingNode):
            raise self.error(
                f"{what} must be a mapping of {holds}, got {kind(node)}", line_of(node), hint
            )
        return self.yaml.pairs(node, what)

    def parse_hosts(self, group: GroupDraft, node: Node) -> None:
        hosts = self.mapping_pairs(
            node,
            f"the hosts of group {group.name!r}",
            "host names",
            "write each host on its own indented line as a key ending in ':' (node1:), "
            "not as a list item (- node1)",
        )
        for key, line, value in hosts:
            try:
                names, port = parse_host_key(key)
            except InventoryError as exc:
                raise self.error(exc.message, line, exc.hint or "") from None
            for name in names:
                problem = host_name_problem(name)
                if problem is not None:
                    raise self.error(
                        f"host {problem}",
                        line,
                        "name each host as ssh knows it (node1, node1.example.org, 10.0.0.2), "
                        "or give it an alias here and its address in ansible_host",
                    )
            host_vars: dict[str, Any] = {}
            origins: dict[str, Origin] = {}
            if port is not None:
                host_vars["ansible_port"] = port
                origins["ansible_port"] = Origin(self.source, line)
            if not is_null(value):
                if not isinstance(value, MappingNode):
                    raise self.error(
                        f"host {key!r} must map to its variables or to nothing, got {kind(value)}",
                        line_of(value),
                        f"write '{key}:' alone, or with indented NAME: value lines below it",
                    )
                written, written_at = self.read_vars(value, f"host {key!r}")
                host_vars.update(written)
                origins.update(written_at)
            for name in names:
                self.built.add_host(group, name, host_vars, origins)

    def parse_children(self, group: GroupDraft, node: Node) -> None:
        children = self.mapping_pairs(
            node,
            f"the children of group {group.name!r}",
            "group names",
            "write each child group as a key ending in ':' (web:), not as a list item",
        )
        for name, line, value in children:
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
        written = self.mapping_pairs(
            node, what, "NAME: value", "write one 'NAME: value' per line, indented under the key"
        )
        for name, line, value in written:
            if not name.isidentifier():
                raise self.error(
                    f"invalid variable name {name!r} in {what}",
                    line,
                    "variable names use letters, digits and '_', and do not start with a digit",
                )
            values[name] = self.yaml.construct(value)
            origins[name] = Origin(self.source, line_of(value))
            if isinstance(value, MappingNode):
                # Each key's own line, for an error about one key (a bad cpuaccel_env name).
                for key_node, _ in value.value:
                    origins[f"{name}.{key_node.value}"] = Origin(self.source, line_of(key_node))
        return values, origins
