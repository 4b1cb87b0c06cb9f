"""Ctrl-C in a foreground ``cpuaccel.launch`` from a real Python process: the ranks
end, the run's records are written, then ``KeyboardInterrupt`` is raised in the caller,
as ``subprocess.run`` does; a caller that catches it and launches again can interrupt
that run too. The signal is a real SIGINT to the caller's process group, as a
terminal's Ctrl-C sends it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testsupport.command import inherited_env

# Each rank writes its pid where the test finds it, then sleeps.
SLEEP = """\
import os, time
open(os.path.join("pids", str(os.getpid())), "w").close()
time.sleep(120)
"""
# A loop of two launches; "catch" catches KeyboardInterrupt and goes on.
DRIVER = """\
import sys, time
import cpuaccel

for i in range(2):
    started = time.monotonic()
    try:
        cpuaccel.launch("sleep.py", nodes=1, ppn=1)
    except KeyboardInterrupt:
        print(f"interrupted {i} {time.monotonic() - started:.1f}", flush=True)
        if sys.argv[1] != "catch":
            raise
    else:
        print(f"returned {i}", flush=True)
print("done", flush=True)
"""
BOUND = 60.0  # seconds for a rank to start, or for an interrupted run to end


def _start(project: Path, mode: str) -> subprocess.Popen[str]:
    env = inherited_env()  # without CPUACCEL_INVENTORY: a run of this machine
    return subprocess.Popen(
        [sys.executable, "drive.py", mode],
        cwd=project,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a group of its own: the SIGINT a terminal would send
    )


def _next_rank(project: Path, seen: set[int], proc: subprocess.Popen[str]) -> int:
    """The pid of the next rank that started (its file under pids/)."""
    deadline = time.monotonic() + BOUND
    while time.monotonic() < deadline:
        new = {int(p.name) for p in (project / "pids").iterdir()} - seen
        if new:
            (pid,) = new
            seen.add(pid)
            return pid
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    raise AssertionError("no rank started")


def _gone(pid: int) -> bool:
    """Whether the process has ended (a zombie has ended too)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _records(project: Path) -> list[tuple[str, str, int]]:
    """Each run's (status.json state, run.json reason, exit code), oldest first."""
    found = []
    for folder in sorted((project / "runs").iterdir()):
        status = json.loads((folder / "status.json").read_text())
        record = json.loads((folder / "run.json").read_text())
        found.append((status["state"], record["reason"], record["exit_code"]))
    return found


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "sleep.py").write_text(SLEEP)
    (tmp_path / "drive.py").write_text(DRIVER)
    (tmp_path / "pids").mkdir()
    return tmp_path


def _interrupt(proc: subprocess.Popen[str], project: Path, seen: set[int]) -> int:
    pid = _next_rank(project, seen, proc)
    time.sleep(1.0)  # the rank is in its sleep, the caller in the supervisor's wait
    os.killpg(proc.pid, signal.SIGINT)
    return pid


def test_ctrl_c_ends_the_ranks_then_raises_keyboard_interrupt(project: Path) -> None:
    proc = _start(project, "raise")
    seen: set[int] = set()
    try:
        rank = _interrupt(proc, project, seen)
        out, err = proc.communicate(timeout=BOUND)
    finally:
        if proc.poll() is None:
            proc.kill()
    # Uncaught, Python ends as killed by SIGINT: a shell says 130.
    assert proc.returncode == -signal.SIGINT, (out, err)
    assert err.rstrip().endswith("KeyboardInterrupt"), err
    assert out.startswith("interrupted 0") and "returned" not in out, out
    assert _gone(rank), f"rank pid {rank} is still running"
    assert _records(project) == [("interrupted", "interrupted", 130)]


def test_a_caught_interrupt_leaves_the_next_launch_interruptible(project: Path) -> None:
    proc = _start(project, "catch")
    seen: set[int] = set()
    try:
        first = _interrupt(proc, project, seen)
        second = _interrupt(proc, project, seen)
        sent = time.monotonic()
        out, err = proc.communicate(timeout=BOUND)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, (out, err)
    words = [line.split()[:2] for line in out.splitlines()]
    assert words == [["interrupted", "0"], ["interrupted", "1"], ["done"]], out
    assert took < 20, f"the second run took {took:.1f} s to end after SIGINT"
    assert _gone(first) and _gone(second), (first, second)
    assert _records(project) == [("interrupted", "interrupted", 130)] * 2


def test_sigterm_ends_the_ranks_then_the_caller_as_its_handler_says(project: Path) -> None:
    proc = _start(project, "raise")
    seen: set[int] = set()
    try:
        rank = _next_rank(project, seen, proc)
        time.sleep(1.0)
        os.killpg(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=BOUND)
    finally:
        if proc.poll() is None:
            proc.kill()
    # The default SIGTERM disposition, once the records are written: a shell says 143.
    assert proc.returncode == -signal.SIGTERM, (out, err)
    assert out == "", out  # the loop did not go on
    assert _gone(rank), f"rank pid {rank} is still running"
    assert _records(project) == [("stopped", "terminated", 143)]
