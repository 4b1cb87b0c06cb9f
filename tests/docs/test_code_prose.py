"""The code's comments and docstrings say what the code does and why, not its history.

Every comment (found with ``tokenize``) and every docstring (found with ``ast``) of every
``.py`` file of the package, the tests, the benches, the examples and the tools is
checked for three marks of history: an issue's number (the word, then the number, with
or without ``#``, on one line or across two), a review round (the word, then its number)
and a date in ISO form. Those belong in commit bodies and docs/benchmarks.md. Tests are
named by component: no test file's name, nor any test's, names an issue. A failure
names file:line and the text.

Plain files only: no cluster, no network.
"""

from __future__ import annotations

import ast
import io
import itertools
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Where the project's own Python lives (a bench's own venv, under bench/, is not its own).
SOURCES = ("cpuaccel", "tests", "bench", "examples", "tools")

HISTORY = re.compile(r"\bissue\s+#?\d+|\bround\s+\d+|20\d\d-\d\d-\d\d", re.IGNORECASE)


def python_files() -> list[Path]:
    return sorted(
        path
        for folder in SOURCES
        for path in (ROOT / folder).rglob("*.py")
        if not any(part.startswith(".") for part in path.relative_to(ROOT).parts)
    )


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


def history_in(path: Path, root: Path = ROOT) -> list[str]:
    """file:line: text for each comment or docstring line that tells history."""
    relative = path.relative_to(root).as_posix()
    lines = sorted(prose(path.read_text(encoding="utf-8")))
    found = [
        f"{relative}:{number}: {text.strip()}" for number, text in lines if HISTORY.search(text)
    ]
    # A mark broken over two lines of prose ("see issue" / "17)") counts as well.
    for (number, text), (after, following) in itertools.pairwise(lines):
        joined = text.strip() + " " + following.strip()
        alone = HISTORY.search(text) or HISTORY.search(following)
        if after == number + 1 and HISTORY.search(joined) and not alone:
            found.append(f"{relative}:{number}: {joined}")
    return found


ISSUE_NAME = re.compile(r"issue_?\d+", re.IGNORECASE)


def issue_names(path: Path, root: Path = ROOT) -> list[str]:
    """file[:line]: a file's name, or a test's, that names an issue."""
    relative = path.relative_to(root).as_posix()
    found = [relative] if ISSUE_NAME.search(path.stem) else []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        is_test = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        if is_test and node.name.lower().startswith("test") and ISSUE_NAME.search(node.name):
            found.append(f"{relative}:{node.lineno}: {node.name}")
    return found


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


def test_a_mark_across_two_lines_is_found(tmp_path: Path) -> None:
    path = tmp_path / "module.py"
    path.write_text('def f():\n    """Built for the probe (see issue\n    17)."""\n')
    assert history_in(path, tmp_path) == ["module.py:2: Built for the probe (see issue 17)."]


def test_a_test_named_by_issue_is_found(tmp_path: Path) -> None:
    path = tmp_path / "test_issue41.py"
    path.write_text(
        "def test_fix_for_issue_12():\n    pass\n\n\ndef test_issued_keys():\n    pass\n"
    )
    assert issue_names(path, tmp_path) == [
        "test_issue41.py",
        "test_issue41.py:1: test_fix_for_issue_12",
    ]


def test_no_test_names_an_issue() -> None:
    found = [line for path in python_files() for line in issue_names(path)]
    assert not found, "name tests by component, not by issue:\n" + "\n".join(found)


def test_prose_tells_no_history() -> None:
    found = [line for path in python_files() for line in history_in(path)]
    assert not found, (
        "a comment or docstring tells history (an issue, a round, a date); say what "
        "the code does and why, and keep the history in the commit:\n" + "\n".join(found)
    )
