"""Read a small YAML mapping keeping the line of every key, for file:line errors."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, ScalarNode

from cpuaccel.errors import InventoryError


@dataclass(frozen=True)
class Field:
    """One key of the file: its value (plain Python), the key's line, and, for a nested
    mapping, its own fields."""

    value: Any
    line: int
    children: dict[str, Field] | None = None


def read_text(path: str | Path, what: str, hint: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InventoryError(f"{what} not found", source=str(path), hint=hint) from None
    except IsADirectoryError:
        raise InventoryError(f"{what} is a directory", source=str(path), hint=hint) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InventoryError(
            f"cannot read the {what}: {exc}",
            source=str(path),
            hint="check the file's permissions, and that it is UTF-8 text",
        ) from None


def parse_mapping(text: str, source: str, what: str) -> dict[str, Field]:
    """The top-level mapping of a YAML document; an empty document is an empty mapping."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        raise InventoryError(
            f"YAML syntax error: {getattr(exc, 'problem', None) or exc}",
            source=source,
            line=mark.line + 1 if mark is not None else None,
            hint="fix the YAML at that line: indentation, and a space after each 'key:'",
        ) from None
    if root is None or (isinstance(root, ScalarNode) and root.value == ""):
        return {}
    if not isinstance(root, MappingNode):
        raise InventoryError(
            f"the {what} must be a YAML mapping of 'key: value' lines",
            source=source,
            line=root.start_mark.line + 1,
            hint="write one 'key: value' per line",
        )
    return _fields(root, source)


def _fields(node: MappingNode, source: str) -> dict[str, Field]:
    constructor = yaml.SafeLoader("")
    found: dict[str, Field] = {}
    for key, value in node.value:
        line = key.start_mark.line + 1
        if not isinstance(key, ScalarNode) or not key.value:
            raise InventoryError(
                "a key is not a plain name", source=source, line=line, hint="use a plain word"
            )
        if key.value in found:
            raise InventoryError(
                f"duplicate key {key.value!r} (first at line {found[key.value].line})",
                source=source,
                line=line,
                hint="keep one of them: YAML keeps only one value per key",
            )
        children = _fields(value, source) if isinstance(value, MappingNode) else None
        try:
            constructed = constructor.construct_object(value, deep=True)
        except yaml.YAMLError as exc:
            raise InventoryError(
                f"cannot read the value of {key.value!r}: {getattr(exc, 'problem', exc)}",
                source=source,
                line=line,
                hint="use plain YAML values",
            ) from None
        found[key.value] = Field(constructed, line, children)
    return found
