"""Inventory: the hosts to run on, read from an Ansible inventory (YAML or INI), an MPI
hostfile or a comma list of hosts (``-i node1,node2,``).

The format is Ansible's so that users can point cpuaccel at the inventory they already
have. Each source fills an InventoryBuilder (the YAML in ``ansible_yaml``, the INI in
``ansible_ini``, a plain MPI hostfile in ``hostfile``; group_vars/ and host_vars/ in
``groupvars``), which merges the variables (``builder``); this module is what the rest
of cpuaccel uses: loading, the implicit localhost, discovery, --limit, and -e.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from cpuaccel.errors import InventoryError
from cpuaccel.inventory import ansible_ini, groupvars
from cpuaccel.inventory.ansible_yaml import read_inventory
from cpuaccel.inventory.builder import (
    EXTRA_VARS_SOURCE,
    Group,
    InventoryBuilder,
    Origin,
    check_declared,
)
from cpuaccel.inventory.host import Host
from cpuaccel.inventory.patterns import (
    expand_host_pattern,
    parse_host_key,
    pattern_hosts,
    select_hosts,
)
from cpuaccel.inventory.variables import Declared, host_name_problem
from cpuaccel.sourcefile import read_source
from cpuaccel.yamlsource import MAX_DEPTH, NestedTooDeep, YamlReader, safe_load

__all__ = [
    "ENV_VAR",
    "EXTRA_VARS_SOURCE",
    "Group",
    "Inventory",
    "Origin",
    "expand_host_pattern",
    "parse_extra_vars",
]

ENV_VAR = "CPUACCEL_INVENTORY"
DEFAULT_FILE = "inventory.yaml"
YAML_SUFFIXES = (".yaml", ".yml", ".json")
INI_SUFFIXES = (".ini",)
# Names that end so are files (inventroy.yaml), never a host given alone.
_FILE_SUFFIXES = (".yaml", ".yml", ".ini")
# Files of these names beside an inventory are not inventories.
_NOT_INVENTORIES = {"cpuaccel.yaml", "default_config.yaml"}


def _missing_file_hint(source: str) -> str:
    """The fix for ``-i FILE`` that does not exist: the inventory files in its folder
    (the closest first), and ``cpuaccel config``, which writes one."""
    import difflib  # only for the hint on a missing file: off every command's start-up

    folder = os.path.dirname(source) or "."
    try:
        names = sorted(
            entry.name
            for entry in os.scandir(folder)
            if entry.name.lower().endswith(_FILE_SUFFIXES)
            and entry.name not in _NOT_INVENTORIES
            and entry.is_file()
        )
    except OSError:
        names = []
    here = "this folder" if folder == "." else folder
    if not names:
        return (
            f"no inventory file in {here}: write one with cpuaccel config, then pass it "
            f"with -i FILE or set {ENV_VAR}"
        )
    close = difflib.get_close_matches(os.path.basename(source), names, n=1)
    found = f"{here} holds {', '.join(names[:5])}{', ...' if len(names) > 5 else ''}"
    if close:
        where = close[0] if folder == "." else os.path.join(folder, close[0])
        return f"did you mean -i {where}? ({found}; cpuaccel config writes a new one)"
    return f"{found}; pass one with -i, or write one with cpuaccel config"


# A YAML inventory's first line: "key:", "- item", "---", "{...}" or a directive.
_YAMLISH = re.compile(r"^(?:---|%|\{|- |-$|[^\s=]*:(?:\s|$))")


class Inventory:
    """Hosts (in file order) and groups, with each host's variables already merged."""

    def __init__(
        self,
        source: str | None,
        hosts: Mapping[str, Host],
        groups: Mapping[str, Group],
        origins: Mapping[str, Mapping[str, Origin]] | None = None,
    ) -> None:
        self.source = source
        self.hosts: dict[str, Host] = dict(hosts)
        self.groups: dict[str, Group] = dict(groups)
        self._origins = dict(origins or {})
        self._builder: InventoryBuilder | None = None  # kept to add a playbook's vars files
        self._extra_vars: dict[str, Any] = {}
        self._declared: dict[str, Declared] = {}  # see check_declared
        # Said once to the user by the CLI (e.g. "a hostfile has no SSH details").
        self.warnings: list[str] = []

    @classmethod
    def load(cls, path: str | Path, extra_vars: Mapping[str, Any] | None = None) -> Inventory:
        """The inventory file at ``path`` (Ansible YAML or INI, or an MPI hostfile), with
        the group_vars/ and host_vars/ beside it, and -e on top."""
        source = str(path)
        hint = f"pass the inventory file itself with -i PATH, or set {ENV_VAR}"
        if not os.path.lexists(source) and source.lower().endswith(_FILE_SUFFIXES):
            hint = _missing_file_hint(source)  # a file name, not a host's
        elif host_name_problem(source) is None and not os.path.lexists(source):
            hint = f"for the host {source} alone, write -i {source}, (with the comma, as Ansible)"
        text = read_source(path, InventoryError, "inventory file", hint)
        warnings: list[str] = []
        if source.endswith(INI_SUFFIXES) or ansible_ini.starts_with_section(text):
            builder = ansible_ini.read_ini(text, source)
        elif source.endswith(YAML_SUFFIXES):
            builder = read_inventory(text, source)
        else:
            builder = _unnamed_kind(text, source, warnings)
        # A file the user typed names a folder: group_vars/ beside it, as Ansible reads.
        warnings += groupvars.attach(builder, os.path.dirname(source), 0)
        inventory = cls.built(builder, extra_vars)
        inventory.warnings += warnings
        return inventory

    @classmethod
    def from_host_list(
        cls, text: str, what: str, extra_vars: Mapping[str, Any] | None = None
    ) -> Inventory:
        """``-i node1,node2,``: Ansible's host_list inventory (hosts in "ungrouped", no
        variables, ``name:port`` allowed); ``what`` names it in errors ("-i node1,...")."""
        builder = InventoryBuilder(what)
        group = builder.group("ungrouped", None)
        for word in (w.strip() for w in text.split(",")):
            if not word:
                continue
            try:
                names, port = parse_host_key(word)
            except InventoryError as exc:
                raise InventoryError(f"{what}: {exc.message}", hint=exc.hint) from None
            problem = next(filter(None, map(host_name_problem, names)), None)
            if problem is not None or "[" in word:
                raise InventoryError(
                    f"{what}: host {problem or repr(word) + ' is a range'}",
                    hint="list host names or addresses separated by commas, e.g. "
                    "-i node1,node2:2222, (an inventory file holds ranges and variables)",
                )
            values = {"ansible_port": port} if port is not None else {}
            builder.add_host(group, names[0], values, dict.fromkeys(values, Origin(what, None)))
        if not builder.hosts:
            raise InventoryError(f"{what}: no host listed", hint="write e.g. -i node1,node2,")
        return cls.built(builder, extra_vars)

    @classmethod
    def built(
        cls, builder: InventoryBuilder, extra_vars: Mapping[str, Any] | None = None
    ) -> Inventory:
        """The inventory a source filled ``builder`` with, variables merged and -e last."""
        hosts, groups, origins = builder.build(extra_vars or {})
        inventory = cls(builder.source, hosts, groups, origins)
        inventory._builder, inventory._extra_vars = builder, dict(extra_vars or {})
        return inventory

    def check_declared(self, declared: Mapping[str, Declared]) -> Inventory:
        """This inventory, once every host's values of the variables a layer above
        declares (the run settings': config/settings.py) pass their checks, as its own
        passed theirs when it was built; they are checked again with a playbook's vars."""
        for name, host in self.hosts.items():
            check_declared(name, host.vars, self._origins.get(name, {}), declared)
        self._declared = {**self._declared, **declared}
        return self

    def with_playbook_vars(self, folder: str | Path) -> Inventory:
        """This inventory with the group_vars/ and host_vars/ beside a playbook in
        ``folder`` too (over those beside the inventory, as in ansible-playbook)."""
        builder = self._builder
        beside_inventory = os.path.dirname(self.source) if self.source else None
        if builder is None or (
            beside_inventory is not None
            and os.path.realpath(beside_inventory or ".") == os.path.realpath(folder)
        ):
            return self  # the same files, already read
        warnings = groupvars.attach(builder, str(folder), 1)
        inventory = Inventory.built(builder, self._extra_vars)
        inventory.warnings = [*self.warnings, *warnings]
        return inventory.check_declared(self._declared)

    @classmethod
    def implicit(cls, extra_vars: Mapping[str, Any] | None = None) -> Inventory:
        """This machine alone, as Ansible's implicit localhost, run by this Python."""
        builder = InventoryBuilder(None)
        local = {"ansible_connection": "local", "cpuaccel_python": sys.executable}
        origins = dict.fromkeys(local, Origin(None, None))
        builder.add_host(builder.groups["all"], "localhost", local, origins)
        return cls.built(builder, extra_vars)

    def select(
        self,
        limit: str | None,
        hostnames: Callable[[], Mapping[str, Sequence[str]]] | None = None,
    ) -> list[Host]:
        """The hosts an Ansible host pattern given as --limit selects, in the order of
        ``all`` (as Ansible's --limit keeps it); all hosts for None.
        ``hostnames``: the nodes' own hostnames a term may name (patterns.select_hosts)."""
        groups = self.every_group_hosts()
        if limit is None:
            return [self.hosts[name] for name in groups["all"]]
        names = select_hosts(
            limit, list(self.hosts), groups, source=self.source, hostnames=hostnames
        )
        return [self.hosts[name] for name in names]

    def select_pattern(self, pattern: str) -> list[Host]:
        """The hosts a host pattern selects in the order Ansible gives them for it
        (``ansible PATTERN``, a play's ``hosts:``): term by term."""
        groups = self.every_group_hosts()
        names = pattern_hosts(pattern, list(self.hosts), groups, source=self.source)
        return [self.hosts[name] for name in names]

    def group_hosts(self, name: str) -> list[str]:
        """All hosts of a group, its children's included, in Ansible's order for it."""
        return list(self.every_group_hosts()[name])

    def every_group_hosts(self) -> Mapping[str, list[str]]:
        """Every group's hosts as :meth:`group_hosts` gives them, worked out once for
        all the groups a caller asks for (each when first asked)."""
        return _AnsibleGroups(self.hosts, self.groups)

    def origin(self, host: str, var: str) -> Origin | None:
        """Where the value of ``var`` that ``host`` ended up with was written."""
        return self._origins.get(host, {}).get(var)


class _AnsibleGroups(Mapping[str, list[str]]):
    """Every group's hosts, children included, as Ansible lists them for host patterns;
    the groups in Ansible's order, each group's hosts worked out when first asked for.

    Ansible holds "all" and "ungrouped" before any group of the file, "ungrouped" as the
    first child of "all" and holding every host of no other group. A group's hosts
    (``Group.get_hosts``) are its own, then those of its children, then of their
    children, level by level, each host once. Within a level below the children, Ansible
    takes the groups in the order of a set of objects, which is not fixed from one run
    to the next; here they come in the order the file introduced them.
    """

    def __init__(self, hosts: Mapping[str, Host], groups: Mapping[str, Group]) -> None:
        self._own = {name: list(group.hosts) for name, group in groups.items()}
        self._children = {name: list(group.children) for name, group in groups.items()}
        named = {h for name, own in self._own.items() if name not in _BUILTIN for h in own}
        listed = [h for h in self._own.get("ungrouped", []) if h not in named]
        named.update(listed)
        self._own["ungrouped"] = listed + [h for h in hosts if h not in named]
        self._children.setdefault("ungrouped", [])
        rest = [c for c in self._children.get("all", []) if c != "ungrouped"]
        self._children["all"] = ["ungrouped", *rest]
        self._order = [*_BUILTIN, *(name for name in groups if name not in _BUILTIN)]
        self._hosts: dict[str, list[str]] = {}

    def __getitem__(self, name: str) -> list[str]:
        if name not in self._children:
            raise KeyError(name)
        if name not in self._hosts:
            self._hosts[name] = self._walk(name)
        return self._hosts[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._order)

    def __len__(self) -> int:
        return len(self._order)

    def _walk(self, name: str) -> list[str]:
        ordered = [name, *self._children[name]]
        level, seen = list(ordered), set(ordered)
        while level:
            below: list[str] = []
            for group in level:
                for child in self._children[group]:
                    if child not in seen:
                        seen.add(child)
                        below.append(child)
            ordered += below
            level = below
        return list(dict.fromkeys(h for group in ordered for h in self._own[group]))


_BUILTIN = ("all", "ungrouped")


def _unnamed_kind(text: str, source: str, warnings: list[str]) -> InventoryBuilder:
    """A file named neither .ini nor .yaml: an MPI hostfile, an INI inventory without a
    section, else YAML. The hostfile reader loads only here, off the start-up of a
    command given a .yaml inventory."""
    from cpuaccel.inventory import hostfile

    if hostfile.looks_like_hostfile(text):
        if not hostfile.has_ini_words(text):
            entries = hostfile.parse_hostfile(text, source)
            builder = hostfile.hostfile_inventory(entries, source)
            warnings.append(hostfile.warning_for(source))
            return builder
        return ansible_ini.read_ini(text, source)  # "node1 ansible_user=x", no section
    if not _yamlish(ansible_ini.first_line(text)):
        return ansible_ini.read_ini(text, source)
    return read_inventory(text, source)


def _yamlish(line: str) -> bool:
    return _YAMLISH.match(line) is not None


def is_host_list(text: str) -> bool:
    """``-i node1,node2,``: a comma list of hosts, not a file (Ansible's host_list test)."""
    return "," in text and not os.path.exists(text)


def parse_extra_vars(items: Sequence[str]) -> dict[str, Any]:
    """Merge ``-e`` items: ``KEY=VALUE`` (VALUE read as a YAML scalar), ``@FILE.yaml`` or
    an inline YAML mapping. Later items override earlier ones."""
    result: dict[str, Any] = {}
    for item in items:
        if item.startswith("@"):
            result.update(_read_vars_file(item[1:], item))
        elif item.lstrip().startswith("{"):
            result.update(_vars_mapping(item, f"-e {_shown(item)}", None))
        else:
            result.update(_key_values(item))
    return result


def _shown(item: str) -> str:
    """An -e item as its error names it: quoted, and cut when long (a hostile value may
    be thousands of characters)."""
    return repr(item) if len(item) <= 60 else repr(item[:60]) + "..."


def _key_values(item: str) -> dict[str, Any]:
    """``-e 'a=1 b="x y"'``: words split as a shell would, each KEY=VALUE (Ansible's
    parse_kv), so that one -e may set several variables."""
    hint = "write e.g. -e ansible_user=train, -e 'nproc=4 ppn=2' or -e @vars.yaml"
    try:
        words = shlex.split(item)
    except ValueError as exc:
        raise InventoryError(
            f"-e {_shown(item)}: expected KEY=VALUE words ({exc})", hint=hint
        ) from None
    result: dict[str, Any] = {}
    for word in words or [item]:
        key, sep, raw = word.partition("=")
        if not sep or not key.isidentifier():
            raise InventoryError(
                f"-e {_shown(item)}: expected KEY=VALUE, @FILE.yaml or a YAML mapping"
                + (f" ({_shown(word)} is not KEY=VALUE)" if len(words) > 1 else ""),
                hint=hint,
            )
        result[key] = _scalar(raw, key)
    return result


def _scalar(raw: str, key: str) -> Any:
    if not raw.strip():
        return raw
    try:
        value = safe_load(raw)
    except NestedTooDeep:
        raise InventoryError(
            f"-e {key}: the value is nested more than {MAX_DEPTH} levels deep",
            hint="give a plain value as -e NAME=VALUE, and nested ones in a file: -e @vars.yaml",
        ) from None
    except yaml.YAMLError:
        return raw
    # Only plain scalars convert; "a: b" or a date stays the text the user typed.
    return value if value is None or type(value) in (str, int, float, bool) else raw


def _read_vars_file(path: str, item: str) -> dict[str, Any]:
    hint = "give -e @FILE the path of a readable YAML file of NAME: value lines"
    text = read_source(path, InventoryError, f"-e {item} file", hint)
    return _vars_mapping(text, f"-e {item}", path)


def _vars_mapping(text: str, what: str, source: str | None) -> dict[str, Any]:
    hint = "write variables as a YAML mapping, e.g. {ansible_user: train, nproc: 4}"
    reader = YamlReader(source, InventoryError)
    root = reader.compose(text, message=f"{what}: invalid YAML ({{problem}})", hint=hint)
    try:
        data = None if root is None else reader.construct(root)
    except InventoryError as exc:
        if source is not None:
            raise
        # An inline mapping has no file to name: say which -e it was.
        raise InventoryError(f"{what}: {exc.message}", hint=exc.hint) from None
    if data is None:
        return {}
    if not isinstance(data, dict) or not all(
        isinstance(key, str) and key.isidentifier() for key in data
    ):
        raise InventoryError(
            f"{what}: expected a mapping of variable names", source=source, hint=hint
        )
    return data
