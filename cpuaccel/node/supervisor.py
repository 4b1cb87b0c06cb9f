"""The supervisor of a run: one attempt loop, wherever the run is watched from.

Part of cpuaccel's node package (see ``cpuaccel.node``): stdlib only, Python 3.8+. A run
is supervised where it has to outlive what started it: a foreground run by the
``cpuaccel run`` on the controller (jobs/foreground.py), a detached one by the
``detached`` program on its head node (node/detached.py). Both run this code; what
differs is how each side reaches things (the head's connection or a child process, the
nodes' connections or the run's ssh.sh), declared by :class:`Side` and :class:`Attempts`.

- :func:`watch` supervises one attempt. It starts the job's launch.sh, splits its
  labelled output into rank-R.log and launcher.log (and, in the foreground, onto the
  terminal), and ends the job when a rank fails, a node is lost, no rank progressed for
  --hang-timeout, the ranks did not all join the process group within
  --rendezvous-timeout, --timeout passes or a stop signal comes: the launcher's process group
  gets SIGTERM, then SIGKILL after GRACE, and every node is swept of the run's
  processes. Its :class:`Outcome` says how the attempt ended.
- :func:`run_attempts` is the attempt loop of --max-restarts. After a failed attempt it
  applies :func:`decide`, waits --restart-delay, has the side check the nodes again
  (leaving out failing ones while --nodes MIN remain) and starts the next attempt from
  the newest checkpoint every node holds whole. :class:`AttemptLog` keeps its record:
  ``attempts.jsonl`` (one :class:`Attempt` a line), ``attempt-<k>/`` with copies of
  attempt k's logs, and a ``--- attempt k ---`` line in each rank log where k starts.
- status.json, the contract with ps, logs, fetch, stop and the dashboard, is written
  here and nowhere else (:func:`write_status`): run_id, state, exit_code, ended_by,
  started, ended, detached, supervisor, ranks (each rank's exit code), signals (the
  signal that ended a rank, by name), and as they happen attempt, attempts,
  hang, rendezvous, launcher_exit, left and unreachable.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import threading
import time
from dataclasses import dataclass, field

from cpuaccel.node.boundedjson import loads
from cpuaccel.node.common import write_atomic
from cpuaccel.node.endings import (
    COMPLETED,
    ERROR,
    FAILED,
    HANG,
    INTERRUPTED,
    LOST,
    RENDEZVOUS,
    RETRIED,
    STATES,
    TERMINATED,
    TIMEOUT,
    exit_code,
)
from cpuaccel.node.progress import (
    CAUSE_LIMIT,
    CAUSE_MARKER,
    EXIT_MARKER,
    KILLED_MARKER,
    ProgressTracker,
    innermost,
    odd_ones_out,
    planned_hosts,
    write_stacks,
)
from cpuaccel.node.rendezvous import RendezvousTracker

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence
    from typing import IO, Any

LABEL = re.compile(r"^\[rank (\d+) ([^\]]*)\] ?(.*)$")  # as cpuaccel/_labels.py writes them
# A rank's marker line after another writer's unfinished line: the launcher's stream is
# shared (setsid -w writes "setsid: " and its message apart, and a rank's line may land
# between them). A rank's labelled lines are written whole, so the marker is intact.
EMBEDDED = re.compile(r"\[rank (\d+) ([^\]]*)\] (\[cpuaccel\] .*)$")
GRACE = 5.0  # seconds between SIGTERM and SIGKILL
# The launcher's exit status after the kill: a node that cannot give it within this is
# reported, not waited for.
LAUNCHER_WAIT = 20.0
STACK_LINES = 40  # of the odd rank's stack, said on a hang (its file holds all of it)
# The endings' exit codes, states and restarts: node/endings.py, their one list.
EXIT_INTERRUPTED = exit_code(INTERRUPTED.word)
EXIT_TERMINATED = exit_code(TERMINATED.word)
EXIT_TIMEOUT = exit_code(TIMEOUT.word)  # --hang-timeout's, --rendezvous-timeout's too
EXIT_LOST = exit_code(LOST.word)  # a node's connection died (ssh's code for it)
RESTART_ENV, RESUME_ENV = "CPUACCEL_RESTART", "CPUACCEL_RESUME"
ATTEMPTS = "attempts.jsonl"
MARKER = "--- attempt {} ---"  # where attempt k starts in a top-level rank log
_APPEND = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
# srun's own report of a task that failed (src/srun: "HOST: task N: Exited with exit
# code C", "tasks 0-2" for several). It stands for the rank's code when the rank's exit
# marker was lost: srun ends the step at the first bad exit (--kill-on-bad-exit) and
# may drop that task's last output lines. Compiled by re on first use: a run that ends
# well never reads it.
_SRUN_TASK_EXIT = r"^srun: error: (\S+): tasks? (\d+)(?:-(\d+))?: Exited with exit code (\d+)$"


# ---------------------------------------------------------------- status.json


def start_time(pid: int) -> int | None:
    """The process's start (clock ticks since boot): with the pid, its identity."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def write_status(run_dir: str, doc: dict[str, Any]) -> None:
    folder = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        data = (json.dumps(doc, indent=2) + "\n").encode()
        write_atomic("status.json", data, 0o600, dir_fd=folder)
    finally:
        os.close(folder)


def read_status(run_dir: str) -> dict[str, Any] | None:
    try:
        fd = os.open(os.path.join(run_dir, "status.json"), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        try:
            doc = loads(f.read(1 << 20))
        except ValueError:
            return None
    return doc if isinstance(doc, dict) else None


def status_doc(
    run_id: str, started: float, detached: bool, supervisor: Any, world: int
) -> dict[str, Any]:
    """status.json of a run that has just started."""
    return {
        "run_id": run_id,
        "state": "running",
        "exit_code": None,
        "ended_by": None,
        "started": started,
        "ended": None,
        "detached": detached,
        "supervisor": supervisor,
        "ranks": {str(r): None for r in range(world)},
    }


def mark_ended(run_dir: str, state: str, ended_by: str) -> dict[str, Any] | None:
    """A status.json still "running" whose supervisor is gone (killed, or its node
    restarted), once `cpuaccel stop` has swept the nodes: recorded as ``state``."""
    doc = read_status(run_dir)
    if doc is not None and doc.get("state") == "running":
        doc.update(state=state, ended_by=ended_by, ended=time.time())
        write_status(run_dir, doc)
    return doc


def ended_by(outcome: Outcome) -> str:
    """status.json's ended_by for an outcome: the first failing rank, "stop", or the
    reason."""
    if outcome.reason == FAILED.word and outcome.first_failure is not None:
        return f"rank {outcome.first_failure.rank}"
    if outcome.reason == TERMINATED.word:
        return "stop"
    return outcome.reason


# ---------------------------------------------------------------- one attempt


@dataclass
class Failure:
    rank: int
    host: str
    code: int
    cause: str | None = None  # what torch's @record wrote (the rank's CAUSE_MARKER line)


def cause(failures: Sequence[Failure]) -> Failure | None:
    """The failure to blame: the first reported, unless it was a SIGTERM (143) and
    another rank failed otherwise. A launcher ends the other ranks with SIGTERM once one
    fails (srun's --kill-on-bad-exit), and a victim's report can arrive first."""
    own = [f for f in failures if f.code != 128 + signal.SIGTERM] or list(failures)
    return own[0] if own else None


def srun_task_exits(line: str) -> list[tuple[int, str, int]]:
    """(rank, host, exit code) for each task one srun error line reports failed."""
    found = re.match(_SRUN_TASK_EXIT, line.strip())
    if found is None:
        return []
    first = int(found[2])
    last = int(found[3]) if found[3] is not None else first
    if last - first > 4096:  # not a range srun prints for one node
        return []
    return [(rank, found[1], int(found[4])) for rank in range(first, last + 1)]


def _reported_code(text: str) -> int | None:
    """The code of a rank's exit marker line (worker.py), None for any other line."""
    if not text.startswith(EXIT_MARKER):
        return None
    word = text[len(EXIT_MARKER) :].strip()
    return int(word) if word.lstrip("-").isdigit() else 1


@dataclass
class Outcome:
    exit_code: int
    # completed | failed | interrupted | terminated | timeout | lost | hang | rendezvous
    reason: str
    seconds: float
    launcher_exit: int | None
    first_failure: Failure | None
    swept: dict[str, Any] = field(default_factory=dict)  # node -> what the sweep ended
    left: dict[str, Any] = field(default_factory=dict)  # node -> processes still there
    lost: list[str] = field(default_factory=list)  # nodes whose connection died
    codes: dict[int, int] = field(default_factory=dict)  # rank -> the code it reported
    # rank -> the signal that ended it, by name (SIGTERM), as its worker reported it
    signals: dict[int, str] = field(default_factory=dict)
    sent: int | None = None  # the signal the supervisor ended the job with, if it did
    hang: list[dict[str, Any]] = field(default_factory=list)  # each rank's last progress
    rendezvous: dict[str, Any] = field(default_factory=dict)  # who joined, who did not


class Output:
    """The launcher's output, line by line: each rank's lines into rank-R.log, the
    launcher's own into launcher.log, and to ``show`` (the terminal) when there is one;
    the ranks' exit reports and progress markers noted on the way."""

    def __init__(
        self,
        run_dir: str,
        show: Callable[[str, int | None, str, str], None] | None = None,
        progress: ProgressTracker | None = None,
        placed: dict[int, str] | None = None,
        rendezvous: RendezvousTracker | None = None,
    ) -> None:
        self.run_dir = run_dir
        # Each rank's node by its inventory name (planned_hosts): a rank's lines are
        # labelled with it, as logs, ps and the dashboard name the node, not with the
        # hostname the rank's labeller saw.
        self.placed = placed or {}
        # show(stream, rank, host, text): rank None for the launcher's own words
        self.show = show
        self.progress = progress  # --hang-timeout: every rank's last progress
        self.rendezvous = rendezvous  # --rendezvous-timeout: every rank's rendezvous
        self.failures: list[Failure] = []
        self.codes: dict[int, int] = {}  # rank -> the code it reported
        self.causes: dict[int, str] = {}  # rank -> the root cause it reported
        self.signals: dict[int, str] = {}  # rank -> the signal that ended it, by name
        # Set when a rank failed: MPI does not always end the others (Intel MPI's hydra
        # lets the remaining ranks run on when a rank on another node exits).
        self.failed = threading.Event()
        # While the supervisor itself ends the job, the launcher's reports of ranks it
        # killed go to the logs only: they are the ending, not news.
        self.quiet = False
        self.sent: int | None = None  # the last signal the supervisor ended the job with
        self._logs: dict[str, IO[str]] = {}
        self._lock = threading.Lock()

    def _log(self, name: str) -> IO[str]:
        if name not in self._logs:
            fd = os.open(os.path.join(self.run_dir, name), _APPEND, 0o600)
            self._logs[name] = os.fdopen(fd, "a", buffering=1)
        return self._logs[name]

    def feed(self, stream: str, line: str) -> None:
        match = LABEL.match(line)
        if match is None and "[rank " in line:
            embedded = EMBEDDED.search(line)
            if embedded is not None and embedded.start() > 0:
                self.feed(stream, line[: embedded.start()])  # the other writer's words
                line = line[embedded.start() :]
                match = LABEL.match(line)
        with self._lock:
            if match is None:  # the launcher's own words
                if "BAD TERMINATION" in line:  # a rank died without reporting (a signal)
                    self.failed.set()
                for task in srun_task_exits(line) if line.startswith("srun: ") else ():
                    if task[0] not in self.codes and not self.quiet:
                        self.failures.append(Failure(*task))
                        self.failed.set()
                    self.codes.setdefault(task[0], task[2])
                self._log("launcher.log").write(line + "\n")
                if not self.quiet and self.show is not None:
                    self.show("err", None, "", line)
                return
            rank, machine, text = int(match[1]), match[2], match[3]
            host = self.placed.get(rank, machine)
            now = time.monotonic()
            if self.progress is not None and self.progress.line(rank, host, text, now, machine):
                return  # cpuaccel's progress marker: not the user's to see
            if self.rendezvous is not None and self.rendezvous.line(rank, host, text, now):
                return  # cpuaccel's rendezvous marker: the same
            if text.startswith(CAUSE_MARKER):  # the summary says it: the log keeps it
                self.causes[rank] = text[len(CAUSE_MARKER) :].strip()[:CAUSE_LIMIT]
                self._log(f"rank-{rank}.log").write(text + "\n")
                return
            if text.startswith(KILLED_MARKER):
                self.signals[rank] = text[len(KILLED_MARKER) :].strip()[:32]
            code = _reported_code(text)
            if code is not None:
                self.codes[rank] = code
                if code == 0:
                    return  # a rank that succeeded: for status.json, not for the logs
            self._log(f"rank-{rank}.log").write(text + "\n")
            if self.quiet and text.startswith((EXIT_MARKER, KILLED_MARKER)):
                return  # a rank that the supervisor is ending: the ending, not a failure
            if code is not None:
                self.failures.append(Failure(rank, host, code, self.causes.get(rank)))
                self.failed.set()
                return
            if self.show is not None:
                self.show(stream, rank, host, text)

    def close(self) -> None:
        for log in self._logs.values():
            log.close()
        self._logs.clear()


class Launched:
    """launch.sh, started on the head by a side: its output, then its exit status."""

    def lines(self) -> Iterator[tuple[str, str]]:
        """("out" or "err", line), until the launcher's output ends."""
        raise NotImplementedError

    def wait(self, timeout: float) -> int | None:
        """The exit status, None when it cannot be had within ``timeout`` (said)."""
        raise NotImplementedError

    def close(self) -> None:
        """launch.sh's stdin closed: it ends the job if it still runs."""


class Side:
    """What supervising needs of the place it runs: the controller (jobs/foreground.py)
    or the head node (node/detached.py). ``hosts``: the current attempt's nodes, the
    head first; ``run_dir``: where status.json and the logs are written here."""

    run_id: str
    run_dir: str
    hosts: list[str]

    def say(self, level: str, text: str) -> None:
        """One line for the user ("error", "warning" or "note")."""
        raise NotImplementedError

    def start(self) -> Launched:
        """The attempt's launch.sh, started on the head in a process group of its own."""
        raise NotImplementedError

    def signal_launcher(self, signum: int, lost: Sequence[str]) -> None:
        """``signum`` to launch.sh's process group (the launcher passes it on)."""
        raise NotImplementedError

    def lost(self) -> list[str]:
        """The nodes whose connection died (keepalives unanswered), in the order seen."""
        return []

    def stacks(self, pids: dict[str, list[Any]], lost: Sequence[str]) -> dict[str, str]:
        """Every reachable node's dumps of its ranks (rank -> text), for a hang."""
        return {}

    def end_step(self, stopped: bool, launcher_exit: int | None) -> None:
        """After the launcher: what else ends the job where a scheduler started it."""

    def sweep(self, lost: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
        """Every node swept of the run's processes: (what was ended, what stays), each
        by node; a node in ``lost`` is named as not checked, and one found unreachable
        is added to it."""
        raise NotImplementedError


class _Stop:
    """The reason a stop signal gave, noted by the handler (the main thread's)."""

    def __init__(self, side: Side) -> None:
        self.reason: str | None = None
        self.side = side

    def note(self, signum: int, frame: Any) -> None:
        if self.reason is None:
            self.reason = INTERRUPTED.word if signum == signal.SIGINT else TERMINATED.word
            self.side.say("warning", "ending the job on every node...")


class _Handlers:
    """SIGINT and SIGTERM handled by ``handler`` for a block, then given back; nothing
    outside the main thread, whose handlers they are (tests drive the loop from others)."""

    def __init__(self, handler: Callable[[int, Any], None]) -> None:
        self.handler = handler
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.previous[sig] = signal.signal(sig, self.handler)

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


def watch(
    side: Side,
    output: Output,
    timeout: float | None,
) -> Outcome:
    """Attempt: launch.sh started, watched to its end, the job ended everywhere."""
    started = time.monotonic()
    stop = _Stop(side)
    seen = Watched()
    launched = side.start()
    reader = threading.Thread(target=_pump, args=(launched, output), daemon=True)
    try:
        with _Handlers(stop.note):
            reader.start()
            deadline = None if timeout is None else started + timeout
            reason = _until_done(side, output, reader, deadline, stop, seen)
            launcher_exit = launched.wait(LAUNCHER_WAIT)
            launched.close()
            _notice_lost(side, seen.lost)
            side.end_step(reason is not None, launcher_exit)
            seen.swept, seen.left = side.sweep(seen.lost)
            reader.join(GRACE)  # its last lines, before the logs close
    finally:
        output.close()
    return _outcome(reason, launcher_exit, time.monotonic() - started, output, seen)


@dataclass
class Watched:
    """What watching an attempt found besides its reason to end: the nodes lost (each
    once), the hung ranks' state (--hang-timeout, for status.json's "hang"), the
    rendezvous's report (--rendezvous-timeout, its "rendezvous"), and what the sweep
    ended and left, by node."""

    lost: list[str] = field(default_factory=list)
    hung: list[dict[str, Any]] = field(default_factory=list)
    met: dict[str, Any] = field(default_factory=dict)
    swept: dict[str, Any] = field(default_factory=dict)
    left: dict[str, Any] = field(default_factory=dict)


def _pump(launched: Launched, output: Output) -> None:
    for stream, line in launched.lines():
        output.feed(stream, line)


def _until_done(
    side: Side,
    output: Output,
    reader: threading.Thread,
    deadline: float | None,
    stop: _Stop,
    seen: Watched,
) -> str | None:
    """Until the launcher's output ends, watch for a reason to end the job; then signal
    the launcher's process group, SIGTERM, then SIGKILL. The reason, None for none.
    ``deadline``: when --timeout ends the attempt (time.monotonic())."""
    lost = seen.lost
    reason: str | None = None
    while reader.is_alive():
        reader.join(0.2)
        if deadline is not None and time.monotonic() > deadline:
            reason = reason or TIMEOUT.word
        if output.failed.is_set() and not _failed_joining(output):
            reason = reason or FAILED.word
        if _notice_lost(side, lost):
            reason = reason or LOST.word
        if reason is None and stop.reason is None and _stalled(output):
            reason = HANG.word
            seen.hung.extend(_declare_hang(side, output, lost))
        if reason is None and stop.reason is None and _unmet(output):
            reason = RENDEZVOUS.word
            seen.met.update(_declare_unmet(side, output))
        reason = stop.reason or reason
        if reason:
            output.quiet = True
            output.sent = signal.SIGTERM
            side.signal_launcher(signal.SIGTERM, lost)
            reader.join(GRACE)
            if reader.is_alive():
                output.sent = signal.SIGKILL
                side.signal_launcher(signal.SIGKILL, lost)
                # A process outside the group (an MPI proxy whose peer was lost) can
                # hold the output open: the sweep ends it; no need to wait more.
                reader.join(GRACE)
            return reason
    if stop.reason is None and output.failed.is_set() and _failed_joining(output):
        seen.met.update(_declare_unmet(side, output))  # the ranks ended before the bound did
        return RENDEZVOUS.word
    return stop.reason


def _notice_lost(side: Side, lost: list[str]) -> bool:
    """Nodes whose connection died end the job: each named once. True when one is new."""
    new = [name for name in side.lost() if name not in lost]
    for name in new:
        lost.append(name)
        side.say(
            "error",
            f"lost the connection to {name} (no answer to keepalives): ending the job on "
            "the other nodes",
        )
    return bool(new)


def _stalled(output: Output) -> bool:
    return output.progress is not None and output.progress.stalled(time.monotonic())


def _failed_joining(output: Output) -> bool:
    """Whether the ranks' failure is the rendezvous's (reported once it is overdue)."""
    found = output.rendezvous
    ranks = [f.rank for f in output.failures]
    return found is not None and found.fails(ranks, time.monotonic())


def _unmet(output: Output) -> bool:
    return output.rendezvous is not None and output.rendezvous.overdue(time.monotonic())


def _declare_unmet(side: Side, output: Output) -> dict[str, Any]:
    """Say the ranks did not all join (which did, which did not and from which nodes, the
    last network error each saw); the same for status.json's "rendezvous"."""
    found = output.rendezvous
    assert found is not None
    now = time.monotonic()
    since = now - (found.started or now)
    missing = [p.rank for p in found.missing()]
    what = (
        f"rank(s) {', '.join(map(str, missing))} of {len(found.ranks)} did not join the "
        "process group"
        if missing
        else "the process group's first collective did not finish"
    )
    side.say(
        "error",
        f"rendezvous: {what}, {since:.1f} s after the first rank began it "
        f"(--rendezvous-timeout {found.bound:g}): ending the job on every node",
    )
    for line in found.report():
        side.say("note", f"  {line}")
    return found.to_json(now)


def _declare_hang(side: Side, output: Output, lost: Sequence[str]) -> list[dict[str, Any]]:
    """Say the job hung (a line a rank) and keep each rank's stacks (py-spy's, where it
    is installed) as hang-<rank>.txt; the ranks' state, for status.json's "hang"."""
    found = output.progress
    assert found is not None
    now = time.monotonic()
    side.say(
        "error",
        f"hang: no rank made progress for {found.idle(now):.1f} s "
        f"(--hang-timeout {found.timeout:g}): ending the job on every node",
    )
    for line in found.report(now):
        side.say("note", f"  {line}")
    pids = found.pids()
    dumps = side.stacks(pids, lost) if pids else {}
    written = write_stacks(side.run_dir, dumps)
    odd = odd_ones_out(dumps)
    if odd is not None:
        ranks, common = odd
        waiting = sorted((r for r in dumps if r not in ranks), key=int)
        first = found.ranks.get(int(ranks[0]))
        where = f" on {first.host}" if first is not None else ""
        side.say(
            "note",
            f"  the odd one out: rank {ranks[0]}{where}, in {innermost(dumps[ranks[0]])}; "
            f"rank(s) {', '.join(waiting)} wait in {common}"
            + (f" (also elsewhere: rank(s) {', '.join(ranks[1:])})" if ranks[1:] else ""),
        )
        for line in dumps[ranks[0]].splitlines()[:STACK_LINES]:  # its stack first
            side.say("note", f"    {line}")
        written.sort(key=lambda name: name != f"hang-{int(ranks[0])}.txt")
    if written:
        paths = ", ".join(os.path.join(side.run_dir, n) for n in written)
        side.say("note", f"  stacks (py-spy): {paths}")
    return [p.to_json(now) for p in found.stuck_first()]


# The endings the supervisor decides itself, each with its fixed exit code.
_FIXED = frozenset(e.word for e in (INTERRUPTED, TERMINATED, TIMEOUT, HANG, RENDEZVOUS))


def _outcome(
    reason: str | None,
    launcher_exit: int | None,
    seconds: float,
    output: Output,
    seen: Watched,
) -> Outcome:
    """How the attempt ended, from its reason, the launcher's exit and what was seen."""
    lost = seen.lost
    first = cause(output.failures)
    if reason in _FIXED:  # the supervisor's own ending: its code, whatever the ranks did
        code = exit_code(reason)
    elif lost and (reason == LOST.word or launcher_exit != 0):
        # Ranks on the other nodes fail because one was lost: name the cause.
        code, reason = EXIT_LOST, LOST.word
    elif first is not None:
        code, reason = first.code, FAILED.word
    elif reason == FAILED.word:
        code = launcher_exit or 1
    elif launcher_exit != 0:
        code, reason = 1 if launcher_exit is None else launcher_exit, FAILED.word
    else:
        code, reason = 0, COMPLETED.word
    return Outcome(
        code, reason, seconds, launcher_exit, first, seen.swept, seen.left, list(lost),
        output.codes, output.signals, output.sent, seen.hung, dict(seen.met),
    )  # fmt: skip


# ---------------------------------------------------------------- the attempts


@dataclass
class Attempt:
    """One line of attempts.jsonl."""

    attempt: int
    started: float
    ended: float
    reason: str
    exit_code: int | None
    rank: int | None
    host: str | None
    hosts: list[str]
    resume: str | None
    cause: str | None = None  # the failing rank's root cause (torch's @record), if any

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def why(self) -> str:
        """The failure in words: "exit code 3, rank 1 on node2"."""
        words = [f"exit code {self.exit_code}" if self.reason == FAILED.word else self.reason]
        if self.rank is not None:
            words.append(f"rank {self.rank} on {self.host}")
        elif self.host is not None:
            words.append(f"node {self.host}")
        return ", ".join(words)


def attempt_of(
    k: int,
    started: float,
    outcome: Outcome,
    hosts: list[str],
    resume: str | None,
    placed: dict[int, str] | None = None,
) -> Attempt:
    """The record of attempt ``k`` from its outcome (the first failing rank, else the
    first node lost). ``placed``: each rank's node by the plan, so that a rank is named
    by its inventory name rather than by the hostname its label carries."""
    first = outcome.first_failure
    if first is not None:
        host: str | None = (placed or {}).get(first.rank, first.host)
    else:
        host = outcome.lost[0] if outcome.lost else None
    return Attempt(
        attempt=k,
        started=round(started, 3),
        ended=round(time.time(), 3),
        reason=outcome.reason,
        exit_code=outcome.exit_code,
        rank=first.rank if first else None,
        host=host,
        hosts=list(hosts),
        resume=resume,
        cause=first.cause if first else None,
    )


@dataclass(frozen=True)
class Verdict:
    restart: bool
    why: str | None = None  # the one line said when it stops for a reason of its own


def decide(history: Sequence[Attempt], max_restarts: int, resume: str | None) -> Verdict:
    """Restart after the last attempt of ``history``? ``resume``: the checkpoint the next
    attempt would get (None: none complete). A failure that repeats identically (same
    reason, rank, node and exit code) with no checkpoint before either would repeat
    forever: it stops the run."""
    last = history[-1]
    if last.reason not in RETRIED:
        return Verdict(False)
    if len(history) > max_restarts:
        if not max_restarts:
            return Verdict(False)  # restarts were not asked for: nothing to say
        return Verdict(False, f"attempt {last.attempt} failed ({last.why()}): no restart left")
    if len(history) >= 2:
        before = history[-2]
        same = (before.reason, before.rank, before.host, before.exit_code) == (
            last.reason,
            last.rank,
            last.host,
            last.exit_code,
        )
        if same and last.resume is None and resume is None:
            return Verdict(
                False,
                f"attempt {last.attempt} failed as attempt {before.attempt} did "
                f"({last.why()}) before any checkpoint: not restarting it again",
            )
    return Verdict(True)


class AttemptLog:
    """The run folder's record of the attempts. With restarts off, attempts.jsonl alone:
    the logs stay as they are."""

    def __init__(self, run_dir: str, world: int, restarts: bool) -> None:
        self.run_dir = run_dir
        self.world = world
        self.restarts = restarts
        self.history: list[Attempt] = []
        self._offsets: dict[str, int] = {}

    def _names(self) -> list[str]:
        return [f"rank-{r}.log" for r in range(self.world)] + ["launcher.log"]

    def begin(self, k: int, world: int | None = None) -> None:
        """Attempt ``k`` starts (with ``world`` ranks, when that changed)."""
        self.world = world if world is not None else self.world
        if not self.restarts:
            return
        for name in self._names():
            fd = os.open(os.path.join(self.run_dir, name), _APPEND, 0o600)
            try:
                if name.startswith("rank-"):
                    os.write(fd, (MARKER.format(k) + "\n").encode())
                self._offsets[name] = os.fstat(fd).st_size
            finally:
                os.close(fd)

    def end(self, attempt: Attempt) -> None:
        self.history.append(attempt)
        if self.restarts:
            folder = os.path.join(self.run_dir, f"attempt-{attempt.attempt}")
            os.makedirs(folder, mode=0o700, exist_ok=True)
            for name in self._names():
                try:
                    fd = os.open(
                        os.path.join(self.run_dir, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
                    )
                except FileNotFoundError:
                    continue
                with os.fdopen(fd, "rb") as log:
                    log.seek(self._offsets.get(name, 0))
                    data = log.read()
                write_atomic(os.path.join(folder, name), data, 0o600)
        fd = os.open(os.path.join(self.run_dir, ATTEMPTS), _APPEND, 0o600)
        try:
            os.write(fd, (json.dumps(attempt.to_json()) + "\n").encode())
        finally:
            os.close(fd)


class Attempts:
    """What the loop needs of a run's side between attempts."""

    hosts: list[str]  # the next attempt's nodes, head first

    def run(self, k: int, resume: str | None) -> Outcome:
        """Attempt ``k``: its files in place, started, watched, ended everywhere."""
        raise NotImplementedError

    def preflight(self) -> bool:
        """The nodes checked again, failing ones left out while --nodes MIN remain;
        False (the problems said) when the run cannot go on."""
        raise NotImplementedError

    def prepare(self, k: int, resume: str | None) -> bool:
        """Attempt ``k``'s files on every node (its CPUACCEL_RESTART and CPUACCEL_RESUME);
        False (said) when a node cannot take them."""
        return True

    def newest_checkpoint(self) -> str | None:
        """The newest checkpoint every node of ``hosts`` holds whole."""
        raise NotImplementedError

    def recorded(self, history: Sequence[Attempt]) -> None:
        """Attempt records so far, for the side's own copy (the controller's run.json)."""

    def placed(self) -> dict[int, str]:
        """Each rank's node by the current plan (none when not known)."""
        return {}


@dataclass
class Settings:
    max_restarts: int
    delay: float
    say: Callable[[str, str], None]  # (level, line), as Side.say
    stop: list[str] = field(default_factory=list)  # the signal that ended the wait


def run_attempts(job: Attempts, log: AttemptLog, settings: Settings) -> Outcome:
    """Attempt after attempt until one ends for good; the last one's outcome."""
    resume: str | None = None
    k = 0
    while True:
        started = time.time()
        log.begin(k)
        outcome = job.run(k, resume)
        log.end(attempt_of(k, started, outcome, job.hosts, resume, job.placed()))
        job.recorded(log.history)
        if outcome.reason not in RETRIED or k >= settings.max_restarts:
            verdict = decide(log.history, settings.max_restarts, None)
        else:
            resume = job.newest_checkpoint()
            verdict = decide(log.history, settings.max_restarts, resume)
        if not verdict.restart:
            if verdict.why:
                settings.say("error", verdict.why)
            return outcome
        last = log.history[-1]
        settings.say(
            "warning",
            f"attempt {k} failed ({last.why()}): restarting in {settings.delay:g} s"
            + (f" from {resume}" if resume else ""),
        )
        with _Handlers(lambda signum, frame: _note(settings.stop, signum)):
            ready = _wait(settings) and job.preflight()
        if settings.stop:
            return _stopped(outcome, settings.stop[0], settings)
        if not ready:
            settings.say("error", f"not restarting: attempt {k + 1}'s preflight failed")
            return outcome
        if job.hosts != last.hosts:  # nodes left out (--nodes MIN:MAX): theirs only
            resume = job.newest_checkpoint()
            settings.say(
                "note",
                f"attempt {k + 1} on {len(job.hosts)} node(s): {', '.join(job.hosts)}"
                + (f", from {resume}" if resume else ", from the start"),
            )
        if not job.prepare(k + 1, resume):
            return outcome
        k += 1


def _note(stop: list[str], signum: int) -> None:
    """Between attempts, Ctrl-C and SIGTERM (`cpuaccel stop`) note the stop; the wait
    and the preflight end with it, not with a traceback."""
    if not stop:
        stop.append(INTERRUPTED.word if signum == signal.SIGINT else TERMINATED.word)


def _wait(settings: Settings) -> bool:
    """The delay, cut short by a stop signal: False when one came."""
    deadline = time.monotonic() + settings.delay
    while not settings.stop and time.monotonic() < deadline:
        time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
    return not settings.stop


def _stopped(outcome: Outcome, reason: str, settings: Settings) -> Outcome:
    """Ctrl-C or SIGTERM between attempts: the job is already ended everywhere."""
    settings.say("warning", f"{reason} before the restart: no further attempt")
    return dataclasses.replace(outcome, exit_code=exit_code(reason), reason=reason)


# ---------------------------------------------------------------- a run


@dataclass
class Limits:
    """What bounds a run: --timeout (each attempt's), --hang-timeout,
    --rendezvous-timeout, --max-restarts and --restart-delay; and what says where its
    ranks run (ranks per node)."""

    timeout: float | None = None
    hang_timeout: float | None = None
    rendezvous_timeout: float | None = None
    max_restarts: int = 0
    restart_delay: float = 0.0
    ppn: int | None = None


class Supervised(Attempts):
    """A run's attempts on one side: each is :func:`watch`-ed, with the status.json of
    the run kept up to date; :meth:`supervise` runs them all and writes the final one."""

    def __init__(self, side: Side, limits: Limits, doc: dict[str, Any]) -> None:
        self.side = side
        self.limits = limits
        self.doc = doc  # status.json, written as the run goes
        self.show: Callable[[str, int | None, str, str], None] | None = None

    @property
    def hosts(self) -> list[str]:  # type: ignore[override]
        return self.side.hosts

    @property
    def world(self) -> int:
        ppn = self.limits.ppn
        return ppn * len(self.side.hosts) if ppn else len(self.doc["ranks"])

    def run(self, k: int, resume: str | None) -> Outcome:
        if k:  # a fresh watch: every rank running again
            self.doc.update(ranks={str(r): None for r in range(self.world)}, attempt=k)
            write_status(self.side.run_dir, self.doc)
        output = Output(
            self.side.run_dir, self.show, self._tracker(), self.placed(), self._rendezvous()
        )
        outcome = watch(self.side, output, self.limits.timeout)
        self.unreported(outcome)
        self.doc["ranks"].update({str(r): c for r, c in outcome.codes.items()})
        if outcome.signals:  # the ranks a signal ended, by name
            self.doc["signals"] = {str(r): name for r, name in sorted(outcome.signals.items())}
        else:
            self.doc.pop("signals", None)
        return outcome

    def placed(self) -> dict[int, str]:
        return planned_hosts(self.side.hosts, self.limits.ppn, self.world)

    def unreported(self, outcome: Outcome) -> None:
        """A rank the supervisor's signal ended before its worker could say so (one
        still starting: the worker reports from the moment its signals are blocked) is
        recorded as ended by that signal; a rank of a lost node stays unknown (None)."""
        if outcome.sent is None:
            return
        placed = self.placed()
        name = signal.Signals(outcome.sent).name
        for rank in range(self.world):
            if rank not in outcome.codes and placed.get(rank) not in outcome.lost:
                outcome.codes[rank] = 128 + outcome.sent
                outcome.signals[rank] = name

    def _tracker(self) -> ProgressTracker | None:
        timeout = self.limits.hang_timeout
        if timeout is None:
            return None
        return ProgressTracker(
            self.side.run_id, timeout, self.world, time.monotonic(), self.placed()
        )

    def _rendezvous(self) -> RendezvousTracker | None:
        bound = self.limits.rendezvous_timeout
        if bound is None:
            return None
        return RendezvousTracker(self.side.run_id, bound, self.world, self.placed())

    def recorded(self, history: Sequence[Attempt]) -> None:
        if self.limits.max_restarts:
            self.doc["attempts"] = [a.to_json() for a in history]
            write_status(self.side.run_dir, self.doc)

    def supervise(self) -> tuple[Outcome, list[Attempt]]:
        """Every attempt, then the final status.json; the last outcome and the record."""
        write_status(self.side.run_dir, self.doc)
        log = AttemptLog(self.side.run_dir, self.world, self.limits.max_restarts > 0)
        settings = Settings(self.limits.max_restarts, self.limits.restart_delay, self.side.say)
        try:
            outcome = run_attempts(self, log, settings)
        except BaseException:  # no outcome (the head refused the launch): not "running"
            mark_ended(self.side.run_dir, FAILED.state, ERROR.word)
            raise
        self.finish(outcome)
        return outcome, log.history

    def finish(self, outcome: Outcome) -> None:
        """The final status.json: the state for the outcome's reason."""
        clean = outcome.reason == COMPLETED.word and outcome.launcher_exit == 0
        ranks = {r: outcome.codes.get(int(r), 0 if clean else None) for r in self.doc["ranks"]}
        self.doc.update(
            state=self.state_of(outcome),
            exit_code=outcome.exit_code,
            ended_by=self.ended_by(outcome),
            ended=time.time(),
            ranks=ranks,
            launcher_exit=outcome.launcher_exit,
            left=outcome.left,
        )
        if outcome.hang:  # --hang-timeout: each rank's last step and silence
            self.doc["hang"] = outcome.hang
        if outcome.rendezvous:  # --rendezvous-timeout: who joined, who did not, and why
            self.doc["rendezvous"] = outcome.rendezvous
        write_status(self.side.run_dir, self.doc)

    def state_of(self, outcome: Outcome) -> str:
        """status.json's state for the run's last outcome."""
        return STATES[outcome.reason]

    def ended_by(self, outcome: Outcome) -> str:
        return ended_by(outcome)
