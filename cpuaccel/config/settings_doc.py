"""The settings table of docs/run.md, written from the table of config/settings.py.

The markdown sits between two HTML comments in docs/run.md; a unit test fails when it
differs from what the table gives. To rewrite it after changing the table::

    python -m cpuaccel.config.settings_doc --write docs/run.md
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from cpuaccel.config.settings import BENCH, RUN, SHOW, SUBMIT, TABLE, TUNE, Entry
from cpuaccel.rank_settings import TORCHRUN_ENV

COMMAND = "python -m cpuaccel.config.settings_doc --write docs/run.md"
BEGIN = f"<!-- the settings table: written by `{COMMAND}` from cpuaccel/config/settings.py -->"
END = "<!-- end of the settings table -->"
TORCHRUN_BEGIN = (
    f"<!-- torchrun's variables: written by `{COMMAND}` from cpuaccel/rank_settings.py -->"
)
TORCHRUN_END = "<!-- end of torchrun's variables -->"
_VERBS = (
    (RUN, "run"),
    (SUBMIT, "submit"),
    (TUNE, "tune"),
    (BENCH, "bench net"),
    (SHOW, "config show"),
)
_HEADER = (
    "setting",
    "flag",
    "`cpuaccel.yaml`",
    "inventory",
    "the ranks' environment",
    "default",
    "flag of",
)


def _code(words: Sequence[str]) -> str:
    return ", ".join(f"`{word}`" for word in words)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")  # a pipe, in a code span too, would end the cell


def _flag(entry: Entry) -> str:
    flag = entry.flag
    if flag is not None and flag.decls:
        spelled = [f"{flag.decls[-1]} {flag.metavar}" if flag.metavar else flag.decls[-1]]
        return _code([*flag.decls[:-1], *spelled])
    if flag is not None and flag.aliases:
        return _code(flag.aliases[:1])
    if entry.also is not None:
        return entry.also
    if entry.variables:
        return f"`-e {entry.variables[0]}=...`"
    return ""


def _default(entry: Entry) -> str:
    if entry.default is None or entry.default in ((), [], {}):
        return entry.note or "none"
    shown = f"`{entry.kind.show(entry.default)}`"
    return f"{shown}: {entry.note}" if entry.note else shown


def _row(entry: Entry) -> str:
    verbs = ", ".join(name for verb, name in _VERBS if verb in entry.verbs and entry.flag)
    flag = _flag(entry)
    if entry.flag is not None and entry.also is not None:
        flag = f"{flag}, {entry.also}"
    cells = (
        entry.label or entry.name,
        flag,
        _code([entry.key]) if entry.key else "",
        _code(entry.variables),
        _code(entry.env),
        _default(entry),
        verbs,
    )
    return "| " + " | ".join(_cell(cell) for cell in cells) + " |"


def markdown() -> str:
    """The table, one row for each setting of TABLE that has a label."""
    lines = ["| " + " | ".join(_HEADER) + " |", "|" + "---|" * len(_HEADER)]
    lines += [_row(entry) for entry in TABLE if entry.label is not None]
    return "\n".join(lines) + "\n"


def torchrun_markdown() -> str:
    """torchrun's variables, what torchrun sets each to and what cpuaccel does."""
    lines = ["| variable | torchrun | cpuaccel run |", "|---|---|---|"]
    lines += [f"| `{name}` | {ours[0]} | {ours[1]} |" for name, ours in TORCHRUN_ENV.items()]
    return "\n".join(lines) + "\n"


def replaced(text: str) -> str:
    """``text`` (docs/run.md) with the tables between their markers written anew."""
    for begin, end_mark, body in (
        (BEGIN, END, markdown()),
        (TORCHRUN_BEGIN, TORCHRUN_END, torchrun_markdown()),
    ):
        start, end = text.find(begin), text.find(end_mark)
        if start < 0 or end < start:
            raise ValueError(f"no {begin!r} ... {end_mark!r} markers")
        text = text[: start + len(begin)] + "\n" + body + text[end:]
    return text


def main(argv: Sequence[str]) -> int:
    if len(argv) == 2 and argv[0] == "--write":
        path = Path(argv[1])
        path.write_text(replaced(path.read_text()))
        return 0
    if not argv:
        sys.stdout.write(markdown())
        return 0
    sys.stderr.write(f"usage: {COMMAND}  (or no argument: print the table)\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
