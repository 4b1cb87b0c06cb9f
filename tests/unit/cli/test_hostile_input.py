"""The hostile-input corpus: every malformed or hostile input is one error line, exit 64.

Each case is data under ``tests/hostile/``:

- a file ``<kind>/<case>.<ext>`` (inventory, hostfile, project, accelerate, playbook)
  whose first comment lines say how to run it::

      # cmd: config show -i {file}        (after `cpuaccel`; {file} is this file's copy)
      # expect: duplicate key 'node1'     (a fragment stderr must hold)
      # line: 10                          (the line the error names, as FILE:LINE)
      # as: cpuaccel.yaml                 (optional: the name the copy gets)

- an entry of ``cmdline.yaml`` (flags and ``-e`` values): ``argv``, ``names`` (the flag,
  the -e item or FILE:LINE the error line names), ``expect`` and optional ``files``, and
  optional ``repeat`` (``{TOKEN: [TEXT, COUNT]}``: TOKEN in argv and files stands for
  TEXT written COUNT times, for inputs of thousands of characters).

Every case runs as a user runs it, ``python -m cpuaccel ...`` in a fresh folder holding
only its files (no inventory around, ``CPUACCEL_INVENTORY`` unset, HOME empty), and must
end with exit 64 (EXIT_USAGE), no traceback, one ``error:`` line (plus its ``fix:`` line) naming the
place, and the folder unchanged. Only verbs that contact no node, or only this machine
in check mode, are used.

The subprocesses of the selected cases are started together on a few threads (each costs
~0.3 s of start-up), and each test waits for its own.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import tempfile
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from cpuaccel.errors import EXIT_USAGE
from cpuaccel.testing.command import cpuaccel, inherited_env

HOSTILE = Path(__file__).parents[2] / "hostile"
TABLE = HOSTILE / "cmdline.yaml"
HEADER = re.compile(r"^# (cmd|expect|line|as): (.*)$")
TIMEOUT = 60.0  # a YAML bomb or a huge range must be refused, not hang the suite
WORKERS = 4


@dataclass(frozen=True)
class Case:
    id: str
    argv: tuple[str, ...]
    names: str  # what the error line must name: FILE:LINE, a flag or an -e item
    expect: str
    files: dict[str, bytes] = field(default_factory=dict)
    line_pattern: bool = False  # names is FILE:LINE: not followed by another digit


def file_case(path: Path) -> Case:
    """A case from a data file's header comment (the rest may be bytes that are not UTF-8:
    some cases are)."""
    data = path.read_bytes()
    header: dict[str, str] = {}
    for line in data.decode("utf-8", errors="replace").splitlines():
        match = HEADER.match(line)
        if match is None:
            break
        header[match.group(1)] = match.group(2)
    missing = {"cmd", "expect", "line"} - set(header)
    assert not missing, f"{path}: header lacks {sorted(missing)}"
    name = header.get("as", path.name)
    argv = tuple(word.replace("{file}", name) for word in shlex.split(header["cmd"]))
    return Case(
        id=f"{path.parent.name}/{path.stem}",
        argv=argv,
        names=f"{name}:{int(header['line'])}",
        expect=header["expect"],
        files={name: data},
        line_pattern=True,
    )


def table_case(entry: dict[str, Any]) -> Case:
    repeat = {
        str(token): str(text) * int(count)
        for token, (text, count) in (entry.get("repeat") or {}).items()
    }

    def expand(value: Any) -> str:
        text = str(value)
        for token, long in repeat.items():
            text = text.replace(token, long)
        return text

    return Case(
        id=f"cmdline/{entry['id']}",
        argv=tuple(expand(word) for word in entry["argv"]),
        names=str(entry["names"]),
        expect=str(entry["expect"]),
        files={str(k): expand(v).encode() for k, v in (entry.get("files") or {}).items()},
    )


def cases_in(root: Path) -> list[Case]:
    """The file cases of root's folders, then the entries of root's cmdline.yaml (the
    hostile test modules beside them, and their __pycache__, are no cases)."""
    cases = [
        file_case(path)
        for folder in sorted(root.iterdir())
        if folder.is_dir() and folder.name != "__pycache__"
        for path in sorted(folder.iterdir())
    ]
    table = root / TABLE.name
    if table.is_file():
        cases += [table_case(entry) for entry in yaml.safe_load(table.read_text("utf-8"))]
    return cases


CASES = cases_in(HOSTILE)


def test_the_corpus_is_large_and_ids_are_unique() -> None:
    ids = [case.id for case in CASES]
    assert len(ids) == len(set(ids))
    assert len(CASES) >= 60
    kinds = {case.id.split("/")[0] for case in CASES}
    assert {"inventory", "hostfile", "project", "accelerate", "playbook", "cmdline"} <= kinds


@dataclass
class Outcome:
    returncode: int
    stdout: str
    stderr: str
    changed: list[str]


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
    }


def execute(case: Case) -> Outcome:
    with tempfile.TemporaryDirectory(prefix="hostile-") as tmp:
        root = Path(tmp)
        home, work = root / "home", root / "work"
        home.mkdir()
        work.mkdir()
        (work / "train.py").write_text("print('never runs')\n")
        for name, data in case.files.items():
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            (work / name).write_bytes(data)
        before = snapshot(work)
        env = inherited_env(HOME=str(home))
        try:
            proc = cpuaccel(*case.argv, cwd=work, env=env, timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            return Outcome(-1, "", f"(still running after {TIMEOUT:.0f} s: killed)", [])
        after = snapshot(work)
        changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        return Outcome(proc.returncode, proc.stdout, proc.stderr, changed)


@pytest.fixture(scope="module")
def outcomes(request: pytest.FixtureRequest) -> Iterator[dict[str, Future[Outcome]]]:
    """Start every selected case at once (bounded by WORKERS); tests wait for theirs."""
    selected = {
        item.callspec.params["case"].id
        for item in request.session.items
        if getattr(item, "originalname", None) == "test_hostile_input" and hasattr(item, "callspec")
    }
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        yield {case.id: pool.submit(execute, case) for case in CASES if case.id in selected}


def names_place(case: Case, line: str) -> bool:
    if case.line_pattern:
        return re.search(rf"(^|[\s/]){re.escape(case.names)}(?!\d)", line) is not None
    return case.names in line


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_hostile_input(case: Case, outcomes: dict[str, Future[Outcome]]) -> None:
    out = outcomes[case.id].result()
    shown = f"{case.argv}\nstdout:\n{out.stdout}\nstderr:\n{out.stderr}"
    assert "Traceback" not in out.stderr, shown
    assert out.returncode == EXIT_USAGE, shown
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    # Warnings may come first (e.g. a host-key opt-out); then the error and its fix.
    message = [line for line in lines if not line.startswith("warning:")]
    assert message and message[0].startswith("error: "), shown
    assert len(message) == 1 or (len(message) == 2 and message[1].startswith("  fix: ")), shown
    assert names_place(case, message[0]), f"the error line does not name {case.names}\n{shown}"
    assert case.expect in out.stderr, shown
    assert out.changed == [], f"the folder changed: {out.changed}\n{shown}"
    # The corpus spells every credential's value s3cr3t: no message may repeat it.
    assert "s3cr3t" not in out.stdout + out.stderr, shown
