"""A traceback every rank raises is shown once, labelled with those ranks, without
cpuaccel's own frames (worker.py, runpy); the rank logs keep it whole."""

from __future__ import annotations

import re
import time
from pathlib import Path

from cpuaccel.jobs.tracebacks import Folding, ranks_text, without_own_frames
from testsupport.command import clean_env, cpuaccel

WRAPPED = [
    "Traceback (most recent call last):",
    '  File "/venv/lib/python3.11/site-packages/cpuaccel/worker.py", line 108, in run_script',
    '    runpy.run_path(script, run_name="__main__")',
    '  File "<frozen runpy>", line 291, in run_path',
    '  File "/usr/lib/python3.10/runpy.py", line 86, in _run_code',
    "    exec(code, run_globals)",
    '  File "train.py", line 3, in <module>',
    "    raise ValueError('boom')",
    "ValueError: boom",
]
SHOWN = [WRAPPED[0], *WRAPPED[6:]]


def test_cpuaccels_own_frames_are_left_out() -> None:
    assert without_own_frames(WRAPPED) == SHOWN


def test_ranks_are_written_as_ranges() -> None:
    assert ranks_text([3, 0, 1, 2, 8, 10, 11]) == "0-3,8,10-11"
    assert ranks_text([5]) == "5"


class Screen:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def line(self, stream: str, rank: int | None, host: str, text: str) -> None:
        self.lines.append(f"[rank {rank} {host}] {text}")

    def group(self, ranks: object, hosts: object, lines: list[str]) -> None:
        self.lines += [f"[ranks {ranks_text(ranks)} {','.join(hosts)}] {t}" for t in lines]  # type: ignore[arg-type]


def test_identical_tracebacks_are_folded_and_others_pass_through() -> None:
    screen = Screen()
    fold = Folding(screen.line, screen.group, window=60)
    for rank in (1, 0, 3, 2):
        fold("out", rank, "vm", f"step {rank}")
        for text in WRAPPED if rank != 2 else [*WRAPPED[:-1], "KeyError: 2"]:
            fold("err", rank, "vm", text)
    assert screen.lines == [f"[rank {r} vm] step {r}" for r in (1, 0, 3, 2)]
    fold.flush()
    folded = [f"[ranks 0-1,3 vm] {t}" for t in SHOWN]
    alone = [f"[rank 2 vm] {t}" for t in [*SHOWN[:-1], "KeyError: 2"]]
    assert screen.lines[4:] == folded + alone


def test_a_chained_traceback_is_held_whole_and_the_window_shows_it() -> None:
    screen = Screen()
    fold = Folding(screen.line, screen.group, window=0.05)
    chained = [*WRAPPED, "", "During handling of the above exception, another exception "
               "occurred:", "", *WRAPPED[:-1], "RuntimeError: again"]  # fmt: skip
    for text in chained:
        fold("err", 0, "vm", text)
    assert screen.lines == []
    deadline = time.monotonic() + 5
    while not screen.lines and time.monotonic() < deadline:
        time.sleep(0.01)
    assert screen.lines[-1] == "[rank 0 vm] RuntimeError: again"
    assert not any("worker.py" in line or "runpy" in line for line in screen.lines)


def test_a_traceback_cut_short_is_shown_at_the_attempts_end() -> None:
    screen = Screen()
    fold = Folding(screen.line, screen.group, window=60)
    for text in WRAPPED[:4]:
        fold("err", 0, "vm", text)
    fold.flush()
    assert screen.lines == ["[rank 0 vm] Traceback (most recent call last):"]


# Both ranks raise together, and neither ends before both tracebacks are written: a
# rank that fails first would otherwise have the other one ended before it raised.
BOTH_RAISE = """\
import atexit, os, pathlib, time
def meet(stage):
    folder = pathlib.Path({folder!r})
    (folder / f"{{stage}}-{{os.environ['RANK']}}").touch()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if all((folder / f"{{stage}}-{{rank}}").exists() for rank in "01"):
            return
        time.sleep(0.01)
atexit.register(meet, "raised")
meet("ready")
def f():
    raise ValueError('boom')
f()
"""


def test_a_local_run_shows_the_failure_of_every_rank_once(tmp_path: Path) -> None:
    """A real run of two ranks on this machine: one traceback, "[ranks 0-1 HOST]", no
    worker.py or runpy frame on the terminal; each rank's log keeps them."""
    (tmp_path / "train.py").write_text(BOTH_RAISE.format(folder=str(tmp_path)))
    args = ("run", "--nodes", "1", "--ppn", "2", "train.py")
    proc = cpuaccel(*args, cwd=tmp_path, env=clean_env(), timeout=120)
    assert proc.returncode == 1, proc.stderr
    shown = [line for line in proc.stderr.splitlines() if line.startswith("[rank")]
    assert len(shown) == 6, proc.stderr
    assert all(re.match(r"\[ranks 0-1 \S+\] ", line) for line in shown), shown
    assert shown[-1].endswith("] ValueError: boom")
    assert "worker.py" not in proc.stderr and "runpy" not in proc.stderr
    (run,) = (tmp_path / "runs").iterdir()
    for rank in (0, 1):
        log = (run / f"rank-{rank}.log").read_text()
        assert "cpuaccel/worker.py" in log and "runpy" in log and "ValueError: boom" in log
