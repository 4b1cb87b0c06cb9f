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

from yaml.nodes import MappingNode, ScalarNode

from cpuaccel.config.settings import TABLE
from cpuaccel.errors import InventoryError, ProjectFileError
from cpuaccel.inventory.slurm_source import PREFIX as SLURM_PREFIX
from cpuaccel.yamlsource import YamlReader, line_of

PROJECT_FILE = "cpuaccel.yaml"
# The key written in the file -> what it means (the hint of a bad value), and its check:
# the keys of the settings table (config/settings.py), in its order.
KEYS: dict[str, str] = {entry.key: entry.help for entry in TABLE if entry.key is not None}
CHECKS: dict[str, Callable[[Any], Any]] = {
    entry.key: entry.kind.check for entry in TABLE if entry.key is not None
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
        hint = getattr(exc, "hint", None) or f"{key}: {KEYS[key]}"
        raise ProjectFileError(f"{key} {exc}", source=source, line=line, hint=hint) from None


def is_accelerate(fields: dict[str, Field]) -> bool:
    return "distributed_type" in fields or "compute_environment" in fields


# ---------------------------------------------------------------- YAML with each key's line
# Read a small YAML mapping keeping the line of every key, for file:line errors.
@dataclass(frozen=True)
class Field:
    """One key of the file: its value (plain Python), the key's line, and, for a nested
    mapping, its own fields."""

    value: Any
    line: int
    children: dict[str, Field] | None = None


def parse_mapping(text: str, source: str, what: str) -> dict[str, Field]:
    """The top-level mapping of a YAML document; an empty document is an empty mapping."""
    reader = YamlReader(source, ProjectFileError)
    root = reader.compose(text)
    if root is None or (isinstance(root, ScalarNode) and root.value == ""):
        return {}
    if not isinstance(root, MappingNode):
        raise reader.error(
            f"the {what} must be a YAML mapping of 'key: value' lines",
            line_of(root),
            "write one 'key: value' per line",
        )
    return _fields(reader, root)


def _fields(reader: YamlReader, node: MappingNode) -> dict[str, Field]:
    found: dict[str, Field] = {}
    for key, line, value in reader.pairs(node):
        children = _fields(reader, value) if isinstance(value, MappingNode) else None
        found[key] = Field(reader.construct(value), line, children)
    return found
