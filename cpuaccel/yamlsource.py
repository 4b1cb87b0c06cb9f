"""One YAML reader for every file a user writes: inventory, project file, playbook.

PyYAML composes the text into nodes, which keep the line of every key and value; this
module turns nodes into values itself, so that all three file kinds follow the same
rules: a syntax error is ``file:line: YAML syntax error`` with a hint, a key written twice
in one mapping is an error (PyYAML would silently keep the last one), and ``<<`` merge
keys work, the keys written beside a ``<<`` winning over the merged ones. Each caller
passes its own error class, so that the exit code and the kind of file stay its own.

Hostile files are bounded: values nested deeper than ``MAX_DEPTH`` are refused while
composing (PyYAML's composer recurses), and since an alias is read again wherever it is
used, the values read through aliases and merges are counted, so that a "billion laughs"
file is refused with its line instead of taking all memory.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from cpuaccel.errors import SourceError

MAP_TAG = "tag:yaml.org,2002:map"
SEQ_TAG = "tag:yaml.org,2002:seq"
NULL_TAG = "tag:yaml.org,2002:null"
MERGE_TAG = "tag:yaml.org,2002:merge"
SYNTAX_MESSAGE = "YAML syntax error: {problem}"
SYNTAX_HINT = (
    "fix the YAML at that line: check indentation, and that each 'key: value' has a "
    "space after the colon"
)
_MERGE_HINT = "write '<<: *name' with an anchor '&name' on a mapping, or '<<: [*a, *b]'"
MAX_DEPTH = 100
# Values read per file beyond its own size: a file without aliases has fewer values than
# characters, so only aliases (or merges) used over and over can reach the bound.
ALIAS_ALLOWANCE = 100_000
_BOMB_HINT = (
    "use each '*alias' for a value once or a few times: aliases that repeat aliases "
    "multiply (a 'billion laughs' file)"
)


class NestedTooDeep(ComposerError):
    """A value nested more than MAX_DEPTH levels deep: a YAMLError, so that a caller that
    words YAML errors words this one too, and one that reads short texts as plain values
    when they are not YAML (``safe_load``'s callers) can still tell it apart."""


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing values nested more than MAX_DEPTH deep (its composer
    is recursive: a deep enough file would end in a RecursionError, not a message)."""

    _depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                event = self.peek_event()  # type: ignore[no-untyped-call]
                raise NestedTooDeep(
                    None, None, f"values nested more than {MAX_DEPTH} levels deep",
                    event.start_mark,
                )  # fmt: skip
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def safe_load(text: str) -> Any:
    """PyYAML's ``safe_load`` of a short text (an ``-e`` value, a value about to be
    written): the same values, with the nesting bound of every file read here
    (NestedTooDeep, never a RecursionError). Files go through YamlReader instead."""
    return yaml.load(text, Loader=_BoundedLoader)


class _BudgetSpent(Exception):
    """The values read from one file went beyond its budget (see ALIAS_ALLOWANCE)."""


class LineDict(dict[Any, Any]):
    """A mapping read with ``lines=True``: the line it starts on and each key's line."""

    line = 0
    key_lines: dict[str, int]


class LineList(list[Any]):
    """A list read with ``lines=True``: the line it starts on."""

    line = 0


def line_of(node: Node) -> int:
    """The 1-based line a node starts on."""
    return int(node.start_mark.line) + 1


def is_null(node: Node) -> bool:
    return isinstance(node, ScalarNode) and node.tag == NULL_TAG


def kind(node: Node) -> str:
    """What a node is, for messages: "a mapping", "a list" or "the value 'x'"."""
    if isinstance(node, MappingNode):
        return "a mapping"
    if isinstance(node, SequenceNode):
        return "a list"
    return f"the value {node.value!r}"


class YamlReader:
    """Reads the YAML of one file, raising ``error`` (the caller's SourceError class)
    with the file and line of every mistake."""

    def __init__(self, source: str | None, error: type[SourceError]) -> None:
        self.source = source
        self.error_type = error
        # Only scalars go through PyYAML's constructor (ints, bools, dates, !!binary...);
        # mappings and lists are built here, so that merges and duplicates are ours.
        self._scalars = SafeConstructor()
        self._budget = ALIAS_ALLOWANCE

    def error(self, message: str, line: int | None, hint: str) -> SourceError:
        return self.error_type(message, source=self.source, line=line, hint=hint)

    def compose(
        self, text: str, *, message: str = SYNTAX_MESSAGE, hint: str = SYNTAX_HINT
    ) -> Node | None:
        """The document's root node (None when empty). ``message`` words a syntax error;
        its "{problem}" is replaced (not str.format: it may quote the user's braces)."""
        self._budget = ALIAS_ALLOWANCE + len(text)
        try:
            return yaml.compose(text, Loader=_BoundedLoader)
        except yaml.reader.ReaderError as exc:
            # A control character (NUL...): PyYAML's message spans lines and has no line.
            line = text[: exc.position].count("\n") + 1
            problem = f"unacceptable character #x{exc.character:04x}: {exc.reason}"
            raise self.error(message.replace("{problem}", problem), line, hint) from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
            problem = getattr(exc, "problem", None) or str(exc)
            raise self.error(
                message.replace("{problem}", problem),
                mark.line + 1 if mark is not None else None,
                hint,
            ) from None

    def load(self, text: str, *, lines: bool = False) -> Any:
        """The document as plain values (see :meth:`construct`); None when empty."""
        root = self.compose(text)
        return None if root is None else self.construct(root, lines=lines)

    def pairs(self, node: MappingNode, what: str | None = None) -> list[tuple[str, int, Node]]:
        """(key, key's line, value node) of a mapping whose keys must be plain names, in
        file order, '<<' merges applied; ``what`` names the mapping in messages."""
        merged: dict[str, tuple[int, Node]] = {}
        for key, value in self._within_budget(self._flatten, node, what, ()):
            if not isinstance(key, ScalarNode) or not key.value:
                where = f" of {what}" if what else ""
                raise self.error(
                    f"a key{where} is not a plain name", line_of(key), "use a plain word as key"
                )
            # A key already merged keeps its place, and the value written later wins.
            merged[key.value] = (line_of(key), value)
        return [(key, line, value) for key, (line, value) in merged.items()]

    def construct(self, node: Node, *, lines: bool = False) -> Any:
        """The plain Python value of a node: dicts, lists and scalars. With ``lines``,
        mappings are LineDicts (keys as strings) and lists LineLists."""
        return self._within_budget(self._construct, node, lines, ())

    def _within_budget(self, read: Any, node: Node, *args: Any) -> Any:
        """``read(node, *args)``; when the file's budget of values runs out, the error
        names the line of `node`, the value that expands too far."""
        try:
            return read(node, *args)
        except _BudgetSpent:
            raise self.error(
                "YAML aliases expand to too many values (more than "
                f"{ALIAS_ALLOWANCE:,} beyond the file's size)",
                line_of(node),
                _BOMB_HINT,
            ) from None

    def _spend(self, count: int) -> None:
        self._budget -= count
        if self._budget < 0:
            raise _BudgetSpent

    def _construct(self, node: Node, lines: bool, stack: tuple[int, ...]) -> Any:
        if id(node) in stack:
            raise self.error(
                "a YAML alias refers to the value that contains it",
                line_of(node),
                "an anchor '&name' cannot be used ('*name') inside its own value",
            )
        inner = (*stack, id(node))
        self._spend(1)
        if isinstance(node, MappingNode) and node.tag == MAP_TAG:
            result: dict[Any, Any] = LineDict() if lines else {}
            key_lines: dict[str, int] = {}
            for key_node, value_node in self._flatten(node, None, inner):
                if not isinstance(key_node, ScalarNode):
                    raise self.error(
                        "a key is not a plain name", line_of(key_node), "use a plain word as key"
                    )
                key = self._scalar(key_node)
                if lines:
                    key = str(key)
                    key_lines[key] = line_of(key_node)
                result[key] = self._construct(value_node, lines, inner)
            if isinstance(result, LineDict):
                result.line, result.key_lines = line_of(node), key_lines
            return result
        if isinstance(node, SequenceNode) and node.tag == SEQ_TAG:
            items = [self._construct(item, lines, inner) for item in node.value]
            if not lines:
                return items
            listed = LineList(items)
            listed.line = line_of(node)
            return listed
        return self._scalar(node)

    def _scalar(self, node: Node) -> Any:
        # Also any other tag (!vault, !!set...): PyYAML's safe rules decide, and refuse.
        try:
            return self._scalars.construct_object(node, deep=True)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            raise self.error(
                f"cannot read this value: {getattr(exc, 'problem', None) or exc}",
                mark.line + 1 if mark is not None else line_of(node),
                "use plain YAML values: tags such as !vault (Ansible Vault) are not supported",
            ) from None

    def _flatten(
        self, node: MappingNode, what: str | None, stack: tuple[int, ...]
    ) -> list[tuple[Node, Node]]:
        """The key/value pairs of a mapping: the merged ones first, then its own, so that
        a later pair wins (YAML's merge rule). The node itself is left as composed, since
        an anchored mapping is read again at every alias."""
        own: list[tuple[Node, Node]] = []
        merged: list[tuple[Node, Node]] = []
        seen: dict[str, int] = {}
        self._spend(len(node.value))
        for key, value in node.value:
            if key.tag == MERGE_TAG:
                merged.extend(self._merge(value, line_of(key), (*stack, id(node))))
                continue
            if isinstance(key, ScalarNode):
                if key.value in seen:
                    where = f" in {what}" if what else ""
                    raise self.error(
                        f"duplicate key {key.value!r}{where} (first written at line "
                        f"{seen[key.value]})",
                        line_of(key),
                        "keep one of them: YAML keeps only one value per key, so the other "
                        "is silently lost",
                    )
                seen[key.value] = line_of(key)
            own.append((key, value))
        return merged + own

    def _merge(self, value: Node, line: int, stack: tuple[int, ...]) -> list[tuple[Node, Node]]:
        """The pairs a '<<' (written at `line`: its value may be an alias of a value
        written elsewhere) brings in; of a list of mappings, the first one wins."""
        if isinstance(value, MappingNode):
            sources = [value]
        elif isinstance(value, SequenceNode) and all(
            isinstance(item, MappingNode) for item in value.value
        ):
            sources = list(reversed(value.value))
        else:
            raise self.error(
                f"a '<<' merge key takes a mapping or a list of mappings, got {kind(value)}",
                line,
                _MERGE_HINT,
            )
        pairs: list[tuple[Node, Node]] = []
        for source in sources:
            if id(source) in stack:
                raise self.error(
                    "a '<<' merge key merges the mapping that contains it",
                    line,
                    _MERGE_HINT,
                )
            pairs.extend(self._flatten(source, None, stack))
        return pairs
