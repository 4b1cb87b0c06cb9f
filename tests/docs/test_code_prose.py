"""The code's comments and docstrings say what the code does and why, not its history.

Every comment (found with ``tokenize``) and every docstring (found with ``ast``) of every
``.py`` file under ``cpuaccel/`` is checked for three marks of history: an issue number
(``issue 12``, ``issue #12``), a review round (``round 3``) and a date (``2024-05-01``).
Those belong in commit bodies and docs/benchmarks.md. A failure names file:line and
the text.

Plain files only: no cluster, no network.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "cpuaccel"

HISTORY = re.compile(r"\bissue\s+#?\d+|\bround\s+\d+|20\d\d-\d\d-\d\d", re.IGNORECASE)


def python_files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def prose(source: str) -> list[tuple[int, str]]:
    """(line number, text) of each comment and each line of each docstring."""
    out: list[tuple[int, str]] = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            out.append((token.start[0], token.string))
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        body = node.body
        if not body or not isinstance(body[0], ast.Expr):
            continue
        value = body[0].value
        if not (isinstance(value, ast.Constant) and isinstance(value.value, str)):
            continue
        # The docstring's own lines, from where its literal starts: a literal's
        # lineno is its first line, and its text keeps every line break.
        for offset, line in enumerate(value.value.splitlines()):
            out.append((value.lineno + offset, line))
    return out


def history_in(path: Path) -> list[str]:
    """file:line: text for each comment or docstring line that tells history."""
    relative = path.relative_to(ROOT).as_posix()
    return [
        f"{relative}:{number}: {text.strip()}"
        for number, text in prose(path.read_text(encoding="utf-8"))
        if HISTORY.search(text)
    ]


def test_the_scan_finds_comments_and_docstrings() -> None:
    source = (
        '"""Module, see issue 12."""\n'
        "def f():\n"
        '    """Done in round 3,\n'
        '    on 2024-05-01."""\n'
        "    x = 'issue 7 in a string is code, not prose'\n"
        "    return x  # Issue #40 again\n"
    )
    found = [number for number, text in prose(source) if HISTORY.search(text)]
    assert sorted(found) == [1, 3, 4, 6]


def test_prose_tells_no_history() -> None:
    found = [line for path in python_files() for line in history_in(path)]
    assert not found, (
        "a comment or docstring tells history (an issue, a round, a date); say what "
        "the code does and why, and keep the history in the commit:\n" + "\n".join(found)
    )
