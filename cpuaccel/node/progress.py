"""Hang detection (``run --hang-timeout``): each rank's progress, and its stacks on a hang.

Used by the supervisor (node/supervisor.py), on the controller for a foreground run and
on the head for a detached one, and by the rank side (cpuaccel/_progress.py writes the
markers parsed here, the worker the exit markers). Stdlib only, Python 3.8+.

Progress is any labelled output line of a rank, and cpuaccel's progress marker: the
runtime (ctx.backward, ctx.log, a prepared optimizer's step) writes
``[cpuaccel] progress RUN_ID step=N`` at most every ``marker_interval`` seconds, and the
worker ``[cpuaccel] progress RUN_ID pid=P`` once, as the script starts (the process
py-spy dumps on a hang). Only a line carrying this run's id, in exactly that form, is
cpuaccel's: it is kept out of the terminal and of rank-R.log (one line every few
seconds for hours is noise there; the last step of each rank is what status.json's
"hang" keeps). Any other line, one that merely looks like a marker included, is the
user's: shown and logged as it is.

When no rank has progressed for the timeout (plus one marker interval: a rate-limited
marker may be that late), the supervisor prints ``report`` (the ranks that seem stuck
first) and asks each node for ``stacks``; the job then ends as a failure, exit code 124.
"""

from __future__ import annotations

import os
import sys
import time

from cpuaccel.node.common import write_atomic

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MARKER = "[cpuaccel] progress"
# What the worker writes as a rank's last line (cpuaccel/worker.py): its exit code, or
# the signal that killed its script.
EXIT_MARKER = "[cpuaccel] exit code"
KILLED_MARKER = "[cpuaccel] killed by"
# Before a failed rank's exit marker: the error torch's @record wrote to the rank's
# TORCHELASTIC_ERROR_FILE, on one line (the root cause, as torchrun's ChildFailedError).
CAUSE_MARKER = "[cpuaccel] root cause:"
CAUSE_LIMIT = 500  # characters of the cause kept: one line of a summary
ENV = "CPUACCEL_PROGRESS"  # the marker interval (s) in every rank; unset: no markers
STACK_LIMIT = 1 << 16  # bytes of one rank's dump kept: a dump is a few KiB
DUMP_TIMEOUT = 10.0  # seconds py-spy may take, all of a node's ranks at once
_FIELDS = ("step", "pid")


def marker_interval(timeout: float) -> float:
    """Seconds between two markers of a rank: a tenth of the hang timeout, 0.5 to 5 s
    (a write every few seconds costs nothing; detection is late by one interval at most)."""
    return min(5.0, max(0.5, timeout / 10))


def marker(run_id: str, **fields: int) -> str:
    """A marker line's text: ``[cpuaccel] progress RUN_ID step=12``."""
    words = [f"{key}={int(value)}" for key, value in fields.items() if key in _FIELDS]
    return " ".join([MARKER, run_id, *words])


def parse(text: str, run_id: str) -> dict[str, int] | None:
    """The fields of cpuaccel's marker for this run; None for any other line (a user's
    line that looks like a marker but names another run, or no run, stays the user's)."""
    if not text.startswith(MARKER + " "):
        return None
    words = text[len(MARKER) + 1 :].split(" ")
    if len(words) < 2 or words[0] != run_id:
        return None
    found: dict[str, int] = {}
    for word in words[1:]:
        key, sep, value = word.partition("=")
        # ASCII digits only: "²" is a digit to str.isdigit, and no number to int().
        if (
            not sep
            or key not in _FIELDS
            or key in found
            or not (value.isascii() and value.isdigit())
        ):
            return None
        found[key] = int(value)
    return found


class RankProgress:
    """What a supervisor last saw of one rank."""

    __slots__ = ("host", "last", "machine", "pid", "rank", "seen", "step")

    def __init__(self, rank: int, host: str, started: float) -> None:
        self.rank = rank
        self.host = host  # its node's inventory name (the plan's), as reports name it
        self.machine = host  # the hostname its label carried: where its stack is dumped
        self.step: int | None = None
        self.pid: int | None = None
        self.last = started  # monotonic time of its last progress (the start, until seen)
        self.seen = False

    def to_json(self, now: float) -> dict[str, Any]:
        idle = round(now - self.last, 1)
        return {"rank": self.rank, "host": self.host, "step": self.step, "idle": idle}


class ProgressTracker:
    """The last progress (time, step) of every rank of one job, fed its labelled lines."""

    def __init__(
        self,
        run_id: str,
        timeout: float,
        world: int,
        started: float,
        hosts: dict[int, str] | None = None,
    ) -> None:
        self.run_id = run_id
        self.timeout = timeout
        # A rank's last marker may trail its real progress by one interval.
        self.slack = marker_interval(timeout)
        self.started = started
        self.ranks = {r: RankProgress(r, (hosts or {}).get(r, "?"), started) for r in range(world)}

    def line(self, rank: int, host: str, text: str, now: float, machine: str | None = None) -> bool:
        """Note one labelled line of ``rank`` (on ``host``, its inventory name; its
        label's hostname ``machine``): progress. True when it is cpuaccel's marker, which
        the caller keeps out of the user's view."""
        seen = self.ranks.get(rank)
        if seen is None:  # a rank beyond the planned world: tracked all the same
            seen = self.ranks[rank] = RankProgress(rank, host, self.started)
        seen.host, seen.last, seen.seen = host, now, True
        seen.machine = machine or host
        fields = parse(text, self.run_id)
        if fields is None:
            return False
        if "step" in fields:
            seen.step = fields["step"]
        if "pid" in fields:
            seen.pid = fields["pid"]
        return True

    def idle(self, now: float) -> float:
        """Seconds since any rank last made progress (since the start, before any did)."""
        return now - max((p.last for p in self.ranks.values()), default=self.started)

    def stalled(self, now: float) -> bool:
        return self.idle(now) >= self.timeout + self.slack

    def stuck_first(self) -> list[RankProgress]:
        """Every rank, the likeliest culprits first: the ones never seen, then the lowest
        step, then the longest silent."""
        return sorted(
            self.ranks.values(),
            key=lambda p: (p.seen, -1 if p.step is None else p.step, p.last, p.rank),
        )

    def report(self, now: float) -> list[str]:
        """One line a rank: rank, host, last step seen, seconds since its last progress."""
        lines = []
        for p in self.stuck_first():
            step = "no step seen" if p.step is None else f"last step {p.step}"
            since = "its last progress" if p.seen else "the start (no output seen)"
            lines.append(f"rank {p.rank} on {p.host}: {step}, {now - p.last:.1f} s since {since}")
        return lines

    def pids(self) -> dict[str, list[Any]]:
        """rank -> [host, pid] of the ranks whose script announced its pid (``stacks``)."""
        return {str(p.rank): [p.machine, p.pid] for p in self.ranks.values() if p.pid is not None}


# ---------------------------------------------------------------- on each node


def find_py_spy() -> str | None:
    """py-spy beside this Python (a venv's bin, often not on a non-login PATH), else on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if os.path.isfile(beside) and os.access(beside, os.X_OK):
        return beside
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        path = os.path.join(folder, "py-spy")
        if folder and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def stacks(ranks: dict[str, list[Any]], ours: set[int], timeout: float) -> dict[str, str]:
    """``py-spy dump`` of each rank that runs here (its label's host is this node) and
    whose pid is one of the job's processes (``ours``: found by CPUACCEL_RUN_ID, as the
    sweep finds them), all at once within ``timeout`` s: rank -> the dump (or why none).
    Nothing when py-spy is not installed here: the dumps are a bonus, never a failure."""
    import socket  # here: the jobs program carries this part, and pays for each import
    import subprocess

    spy = find_py_spy()
    here = socket.gethostname()
    wanted = {r: int(hp[1]) for r, hp in ranks.items() if hp[0] == here and int(hp[1]) in ours}
    if spy is None or not wanted:
        return {}
    procs = {
        rank: subprocess.Popen(
            [spy, "dump", "--pid", str(pid)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        for rank, pid in wanted.items()
    }
    deadline = time.monotonic() + timeout
    found = {}
    for rank, proc in procs.items():
        try:
            out, _ = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
            text = out[:STACK_LIMIT].decode(errors="replace")
            found[rank] = text if proc.returncode == 0 else f"py-spy failed: {text}"
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            found[rank] = f"py-spy gave no dump within {timeout:.0f} s"
    return found


def innermost(dump: str) -> str | None:
    """The frame a py-spy dump shows its process in: the first frame of its main thread
    (py-spy lists the innermost first), e.g. ``all_reduce (torch/.../c10d.py:2050)``."""
    frame, in_thread, main = None, False, False
    for line in dump.splitlines():
        if line.startswith("Thread "):
            in_thread, main = True, '"MainThread"' in line
            continue
        if in_thread and line.startswith((" ", "\t")) and line.strip():
            if main:
                return line.strip()
            frame = frame or line.strip()
            in_thread = False
    return frame


def odd_ones_out(dumps: dict[str, str]) -> tuple[list[str], str] | None:
    """(the ranks elsewhere, the frame where most ranks wait) when most of the dumped
    ranks wait in the same frame (a collective) and some do not: the likeliest cause of
    a hang is the rank the others wait for. None when there is no such majority."""
    frames = {rank: f for rank, text in dumps.items() if (f := innermost(text)) is not None}
    counts: dict[str, int] = {}
    for f in frames.values():
        counts[f] = counts.get(f, 0) + 1
    if not counts:
        return None
    common = max(counts, key=lambda f: counts[f])
    odd = sorted((r for r, f in frames.items() if f != common), key=int)
    if counts[common] < 2 or not odd or counts[common] <= len(frames) / 2:
        return None
    return odd, common


def write_stacks(run_dir: str, dumps: dict[str, str]) -> list[str]:
    """Each dump as RUN_DIR/hang-<rank>.txt (0600; an earlier attempt's replaced: the
    last hang's); the names written."""
    folder = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    written = []
    try:
        for rank, text in sorted(dumps.items(), key=lambda item: int(item[0])):
            name = f"hang-{int(rank)}.txt"
            write_atomic(name, text.encode(), 0o600, dir_fd=folder)
            written.append(name)
    finally:
        os.close(folder)
    return written


def planned_hosts(hosts: list[str], ppn: int | None, world: int) -> dict[int, str]:
    """Where each rank runs by the plan (ppn ranks a node, in the hostfile's order): the
    host a report names for a rank that never wrote a line."""
    return {r: hosts[r // ppn] for r in range(world) if ppn and r // ppn < len(hosts)}
