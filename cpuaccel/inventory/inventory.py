"""Inventory: the hosts to run on, read from an Ansible YAML inventory or an MPI hostfile.

The format is Ansible's so that users can point cpuaccel at the inventory they already
have. Each source fills an InventoryBuilder (the YAML in ``ansible_yaml``, a plain MPI
hostfile in ``hostfile``), which merges the variables (``builder``); this module is what
the rest of cpuaccel uses: loading, the implicit localhost, discovery, --limit, and -e.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from cpuaccel.errors import InventoryError
from cpuaccel.inventory import hostfile
from cpuaccel.inventory.ansible_yaml import read_inventory
from cpuaccel.inventory.builder import EXTRA_VARS_SOURCE, Group, InventoryBuilder, Origin
from cpuaccel.inventory.host import Host
from cpuaccel.inventory.patterns import expand_host_pattern, select_hosts
from cpuaccel.sourcefile import read_source
from cpuaccel.yamlsource import YamlReader

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
        # Said once to the user by the CLI (e.g. "a hostfile has no SSH details").
        self.warnings: list[str] = []

    @classmethod
    def load(cls, path: str | Path, extra_vars: Mapping[str, Any] | None = None) -> Inventory:
        source = str(path)
        text = read_source(
            path,
            InventoryError,
            "inventory file",
            f"pass the inventory file itself with -i PATH, or set {ENV_VAR}",
        )
        # A .yaml file is always read as YAML, so that a mistake in it keeps its YAML error.
        if not source.endswith(YAML_SUFFIXES) and hostfile.looks_like_hostfile(text):
            entries = hostfile.parse_hostfile(text, source)
            inventory = cls.built(hostfile.hostfile_inventory(entries, source), extra_vars)
            inventory.warnings.append(hostfile.warning_for(source))
            return inventory
        return cls.built(read_inventory(text, source), extra_vars)

    @classmethod
    def built(
        cls, builder: InventoryBuilder, extra_vars: Mapping[str, Any] | None = None
    ) -> Inventory:
        """The inventory a source filled ``builder`` with, variables merged and -e last."""
        hosts, groups, origins = builder.build(extra_vars or {})
        return cls(builder.source, hosts, groups, origins)

    @classmethod
    def implicit(cls, extra_vars: Mapping[str, Any] | None = None) -> Inventory:
        """This machine alone, as Ansible's implicit localhost, run by this Python."""
        builder = InventoryBuilder(None)
        local = {"ansible_connection": "local", "cpuaccel_python": sys.executable}
        origins = dict.fromkeys(local, Origin(None, None))
        builder.add_host(builder.groups["all"], "localhost", local, origins)
        return cls.built(builder, extra_vars)

    def select(self, limit: str | None) -> list[Host]:
        """The hosts an Ansible host pattern (--limit) selects; all hosts for None."""
        if limit is None:
            return list(self.hosts.values())
        group_hosts = {name: self.group_hosts(name) for name in self.groups}
        names = select_hosts(limit, list(self.hosts), group_hosts, source=self.source)
        return [self.hosts[name] for name in names]

    def group_hosts(self, name: str) -> list[str]:
        """All hosts of a group, its children's included, in inventory order."""
        members: set[str] = set()
        pending, seen = [name], set()
        while pending:
            group = self.groups[pending.pop()]
            if group.name not in seen:
                seen.add(group.name)
                members.update(group.hosts)
                pending.extend(group.children)
        return [host for host in self.hosts if host in members]

    def origin(self, host: str, var: str) -> Origin | None:
        """Where the value of ``var`` that ``host`` ended up with was written."""
        return self._origins.get(host, {}).get(var)


def parse_extra_vars(items: Sequence[str]) -> dict[str, Any]:
    """Merge ``-e`` items: ``KEY=VALUE`` (VALUE read as a YAML scalar), ``@FILE.yaml`` or
    an inline YAML mapping. Later items override earlier ones."""
    result: dict[str, Any] = {}
    for item in items:
        if item.startswith("@"):
            result.update(_read_vars_file(item[1:], item))
        elif item.lstrip().startswith("{"):
            result.update(_vars_mapping(item, f"-e {item!r}", None))
        else:
            result.update(_key_values(item))
    return result


def _key_values(item: str) -> dict[str, Any]:
    """``-e 'a=1 b="x y"'``: words split as a shell would, each KEY=VALUE (Ansible's
    parse_kv), so that one -e may set several variables."""
    hint = "write e.g. -e ansible_user=train, -e 'nproc=4 ppn=2' or -e @vars.yaml"
    try:
        words = shlex.split(item)
    except ValueError as exc:
        raise InventoryError(f"-e {item!r}: expected KEY=VALUE words ({exc})", hint=hint) from None
    result: dict[str, Any] = {}
    for word in words or [item]:
        key, sep, raw = word.partition("=")
        if not sep or not key.isidentifier():
            raise InventoryError(
                f"-e {item!r}: expected KEY=VALUE, @FILE.yaml or a YAML mapping"
                + (f" ({word!r} is not KEY=VALUE)" if len(words) > 1 else ""),
                hint=hint,
            )
        result[key] = _scalar(raw)
    return result


def _scalar(raw: str) -> Any:
    if not raw.strip():
        return raw
    try:
        value = yaml.safe_load(raw)
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
