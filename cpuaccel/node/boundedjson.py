"""JSON read within bounds: the one parser of JSON that comes from a file or from
another machine, on the nodes and on the controller (``cpuaccel.jsonsource`` reads the
controller's files with it and gives its refusals the controller's shape).

Part of cpuaccel's node package (see ``cpuaccel.node``): stdlib only, Python 3.8+.

Python's json parser recurses once per level of nesting: a line of 3,000 '[' ends in a
RecursionError, which no ``except ValueError`` catches, and a value a few hundred levels
deep parses, then fails in whatever walks it next (a repr, json.dumps). Here a value
nested more than MAX_DEPTH levels, or a text longer than the caller's limit, is refused
with ``Refused``: a ValueError, so that code that skips bad JSON skips it too, with a
one-line message.

The depth check costs nothing in the common case: nesting deeper than MAX_DEPTH needs
more than MAX_DEPTH '[' or '{', so a text with fewer (every record cpuaccel writes, a
metrics line) is not walked; any other is walked once, level by level, without
recursion.
"""

from __future__ import annotations

import json

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time: the node pays for every import
    from typing import Any

# Twice the YAML reader's bound (cpuaccel.yamlsource): a value a YAML file may hold still
# passes inside the few levels of the messages and records that carry it.
MAX_DEPTH = 200


class Refused(ValueError):
    """A JSON text refused before or after parsing: too long, or nested too deep."""


def loads(text: str | bytes, limit: int | None = None) -> Any:
    """The value of a JSON text; ValueError when it is not JSON (json's own error),
    ``Refused`` when it is longer than ``limit`` (characters, or bytes) or nested more
    than MAX_DEPTH levels deep."""
    if limit is not None and len(text) > limit:
        raise Refused(f"longer than {limit:,} bytes")
    try:
        value = json.loads(text)
    except RecursionError:
        raise Refused(_DEEP) from None
    if _openings(text) > MAX_DEPTH and too_deep(value, MAX_DEPTH):
        raise Refused(_DEEP)
    return value


def lines(data: bytes) -> list[Any]:
    """The values of the JSON lines in ``data`` (whole lines), in order; a line that is
    not JSON, or is refused, is left out.

    Parsed as one JSON array first (one call, where a call a line pays the parser's
    entry each time); line by line when that fails, or when the array is deeper than
    a line may be (lines joined by commas can nest across each other)."""
    body = data.strip(b"\n")
    if not body:
        return []
    try:
        values = json.loads(b"[" + body.replace(b"\n", b",") + b"]")
    except (ValueError, RecursionError):
        values = None
    if isinstance(values, list) and not too_deep(values, MAX_DEPTH + 1):
        return values
    found = []
    for line in body.splitlines():
        try:
            found.append(loads(line))
        except ValueError:
            continue
    return found


def too_deep(value: Any, limit: int) -> bool:
    """Whether ``value`` nests lists and dicts more than ``limit`` levels deep (a list or
    a dict is one level). Level by level: each level's members are gathered and their
    types collected by C loops; Python looks at a member only on a level that has
    containers in it."""
    level = [value] if type(value) in _CONTAINERS else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        members: list[Any] = []
        for container in level:
            members.extend(container.values() if type(container) is dict else container)
        kinds = set(map(type, members))
        if kinds.isdisjoint(_CONTAINERS):
            return False
        level = members if kinds <= _CONTAINERS else [m for m in members if type(m) in _CONTAINERS]
    return False


def describe(exc: ValueError) -> str:
    """One line for why a text was not read: json's message with its place, or the
    refusal."""
    if isinstance(exc, json.JSONDecodeError):
        return f"not valid JSON ({exc.msg}, line {exc.lineno} column {exc.colno})"
    if isinstance(exc, UnicodeDecodeError):
        return "not UTF-8 text"
    return str(exc)


_CONTAINERS = frozenset((dict, list))
_DEEP = f"values nested more than {MAX_DEPTH} levels deep"


def _openings(text: str | bytes) -> int:
    if isinstance(text, str):
        return text.count("[") + text.count("{")
    return text.count(b"[") + text.count(b"{")
