"""Read a small YAML mapping keeping the line of every key, for file:line errors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from yaml.nodes import MappingNode, ScalarNode

from cpuaccel.errors import ProjectFileError
from cpuaccel.yamlsource import YamlReader, line_of


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
