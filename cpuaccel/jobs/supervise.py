"""Supervise a launched job: stream its ranks' output, end it cleanly, everywhere.

mpirun runs on the head node (locally when that is the controller) from launch.sh,
which records its process group. Ending a job — after Ctrl-C, SIGTERM, --timeout, or
when it ends by itself — means: signal that process group on the head (MPI passes it
on), then sweep every node for the processes whose environment carries this run's id,
and verify none is left. Nothing is matched by command line.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import IO, Any

from rich.console import Console

from cpuaccel.connectors import programs
from cpuaccel.connectors.base import Process
from cpuaccel.connectors.connect_options import ConnectOptions
from cpuaccel.errors import CpuaccelError
from cpuaccel.executor import ConnectionPool
from cpuaccel.jobs import hang, launchers
from cpuaccel.jobs.plan import RunPlan
from cpuaccel.jobs.rundir import RunDir
from cpuaccel.node.progress import ProgressTracker
from cpuaccel.node.supervisor import STATES, start_time, status_doc, write_status
from cpuaccel.runs import fanout
from cpuaccel.runs.fanout import TEARDOWN
from cpuaccel.slurm import steps
from cpuaccel.ui import escape
from cpuaccel.worker import EXIT_MARKER, KILLED_MARKER

LABEL = re.compile(r"^\[rank (\d+) ([^\]]*)\] ?(.*)$")
COLOURS = ("cyan", "magenta", "green", "yellow", "blue", "red")
GRACE = 5.0  # seconds between SIGTERM and SIGKILL
EXIT_INTERRUPTED, EXIT_TERMINATED, EXIT_TIMEOUT = 130, 143, 124
EXIT_LOST = 255  # a node's connection died during the run (ssh's code for it)


@dataclass
class Failure:
    rank: int
    host: str
    code: int


def _reported_code(text: str) -> int | None:
    """The code of a rank's exit marker line (worker.py), None for any other line."""
    if not text.startswith(EXIT_MARKER):
        return None
    word = text[len(EXIT_MARKER) :].strip()
    return int(word) if word.lstrip("-").isdigit() else 1


class OutputRouter:
    """Each line to the terminal, labelled (coloured on a TTY), and to its rank's log."""

    def __init__(self, run_dir: RunDir, out: Console, err: Console) -> None:
        self.run_dir = run_dir
        self.out = out
        self.err = err
        self.failures: list[Failure] = []
        self.codes: dict[int, int] = {}  # rank -> the exit code it reported
        # Set when a rank failed: MPI does not always end the others (Intel MPI's hydra
        # lets the remaining ranks run on when a rank on another node exits).
        self.failed = threading.Event()
        # While cpuaccel itself ends the job, the launcher's reports of ranks it killed
        # go to launcher.log only: they are the ending, not news.
        self.quiet = False
        # run --hang-timeout: every rank's last progress (Job sets it; jobs/hang.py).
        self.progress: ProgressTracker | None = None
        self._logs: dict[str, IO[str]] = {}
        self._lock = threading.Lock()

    def _log(self, name: str) -> IO[str]:
        if name not in self._logs:
            self._logs[name] = self.run_dir.log(name).open("a", buffering=1)
        return self._logs[name]

    def feed(self, stream: str, line: str) -> None:
        match = LABEL.match(line)
        with self._lock:
            if match is None:  # the launcher's own words
                if "BAD TERMINATION" in line:  # a rank died without reporting (a signal)
                    self.failed.set()
                for task in launchers.srun_task_exits(line):  # a lost marker (srun's race)
                    if task[0] not in self.codes and not self.quiet:
                        self.failures.append(Failure(*task))
                        self.failed.set()
                    self.codes.setdefault(task[0], task[2])
                self._log("launcher.log").write(line + "\n")
                if not self.quiet:
                    self.err.print(f"[dim]\\[mpirun][/] {escape(line)}")
                return
            rank, host, text = int(match[1]), match[2], match[3]
            if self.progress is not None and self.progress.line(rank, host, text, time.monotonic()):
                return  # cpuaccel's progress marker: not the user's to see
            code = _reported_code(text)
            if code is not None:
                self.codes[rank] = code
                if code == 0:
                    return  # a rank that succeeded: for run --json, not for the logs
            self._log(f"rank-{rank}.log").write(text + "\n")
            if self.quiet and text.startswith((EXIT_MARKER, KILLED_MARKER)):
                return  # a rank that cpuaccel is ending: the ending, not a failure
            if code is not None:
                self.failures.append(Failure(rank, host, code))
                self.failed.set()
                return
            colour = COLOURS[rank % len(COLOURS)]
            console = self.out if stream == "out" else self.err
            console.print(f"[{colour}]\\[rank {rank} {escape(host)}][/] {escape(text)}")

    def close(self) -> None:
        for log in self._logs.values():
            log.close()


def cause(failures: list[Failure]) -> Failure | None:
    """The failure to blame: the first reported, unless it was a SIGTERM (143) and
    another rank failed otherwise. A launcher ends the other ranks with SIGTERM once one
    fails (srun's --kill-on-bad-exit), and a victim's report can arrive first."""
    own = [f for f in failures if f.code != 128 + signal.SIGTERM] or failures
    return own[0] if own else None


@dataclass
class Outcome:
    exit_code: int
    reason: str  # completed | failed | interrupted | terminated | timeout | lost | hang
    seconds: float
    launcher_exit: int | None
    first_failure: Failure | None
    swept: dict[str, Any] = field(default_factory=dict)  # node -> what the sweep ended
    left: dict[str, Any] = field(default_factory=dict)  # node -> processes still there
    lost: list[str] = field(default_factory=list)  # nodes whose connection died
    codes: dict[int, int] = field(default_factory=dict)  # rank -> the code it reported
    hang: list[dict[str, Any]] = field(default_factory=list)  # each rank's last progress


@contextmanager
def _stop_signals(on_stop: Any) -> Iterator[None]:
    previous = {
        sig: signal.signal(sig, lambda signum, frame: on_stop(signum, frame))
        for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class Job:
    def __init__(
        self,
        plan: RunPlan,
        connect: ConnectOptions,
        run_dir: RunDir,
        router: OutputRouter,
        forks: int,
        pool: ConnectionPool | None = None,
    ) -> None:
        # Connections of the earlier phases, reused: the launch and the sweep then cost
        # no new SSH handshake.
        self.pool = pool or ConnectionPool(connect)
        self._own_pool = pool is None
        self.plan = plan
        self.connect = connect
        self.run_dir = run_dir
        self.router = router
        self.forks = forks
        self.stop_reason: str | None = None
        self.lost: list[str] = []  # nodes whose connection died, in the order noticed
        self.hung: list[dict[str, Any]] = []  # run --hang-timeout: the ranks, once hung
        self.kept: fanout.Kept | None = None  # the preflight's programs, for the sweep

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.stop_reason is None:
            self.stop_reason = "interrupted" if signum == signal.SIGINT else "terminated"
            self.router.err.print("[yellow]ending the job on every node...[/]")

    def run(self, timeout: float | None) -> Outcome:
        started = time.monotonic()
        self.router.progress = hang.tracker(self.plan, started)
        head = self.pool.get(self.plan.head)
        try:
            # setsid -w: a process group of its own (forking only if it must), whose
            # exit status it passes back.
            proc = head.start(["setsid", "-w", "/bin/sh", self.plan.path("launch.sh")])
            reader = threading.Thread(target=self._pump, args=(proc,), daemon=True)
            with _stop_signals(self._on_signal):
                reader.start()
                self._supervise(reader, started, timeout)
                launcher_exit = self._launcher_exit(proc)
                proc.close()
                self._cancel_step(launcher_exit)
                swept, left = self.sweep()
                reader.join(GRACE)  # its last lines, before the logs close
        finally:
            if self._own_pool:
                self.pool.close()
            self.router.close()
        return self._outcome(launcher_exit, time.monotonic() - started, swept, left)

    def _supervise(self, reader: threading.Thread, started: float, timeout: float | None) -> None:
        """Until the launcher's output ends, watch for a reason to end the job; then
        signal the launcher's process group, SIGTERM, then SIGKILL."""
        while reader.is_alive():
            reader.join(0.2)
            if timeout is not None and time.monotonic() - started > timeout:
                self.stop_reason = self.stop_reason or "timeout"
            if self.router.failed.is_set():
                self.stop_reason = self.stop_reason or "failed"
            self._notice_lost()
            self._notice_hang()
            if self.stop_reason:
                self.router.quiet = True
                self._signal_launcher(signal.SIGTERM)
                reader.join(GRACE)
                if reader.is_alive():
                    self._signal_launcher(signal.SIGKILL)
                    # A process outside the group (an MPI proxy whose peer was lost)
                    # can hold the output open: the sweep ends it; no need to wait more.
                    reader.join(GRACE)
                return

    def _notice_lost(self) -> None:
        """Nodes whose connection died (keepalives unanswered) end the job: named once."""
        for name in self.pool.lost(self.plan.hosts):
            if name not in self.lost:
                self.lost.append(name)
                self.stop_reason = self.stop_reason or "lost"
                self.router.err.print(
                    f"[red]lost the connection to {escape(name)}[/] (no answer to "
                    "keepalives): ending the job on the other nodes"
                )

    def _notice_hang(self) -> None:
        """No rank progressed for --hang-timeout: said, stacks kept, the job ends (hang)."""
        found = self.router.progress
        if found is None or self.stop_reason or not found.stalled(time.monotonic()):
            return
        self.stop_reason = "hang"
        self.hung = hang.declare(
            found, self.plan, self.run_dir.path, self.pool, self.forks, self.lost, self.router.err
        )

    def _launcher_exit(self, proc: Process) -> int | None:
        """The launcher's exit status, or None when its node cannot give it in time."""
        try:
            return proc.wait(TEARDOWN)
        except CpuaccelError as exc:
            self._notice_lost()
            message = f"no exit status from the launcher: {escape(str(exc))}"
            self.router.err.print(f"[yellow]{message}[/]")
            return None

    def _pump(self, proc: Process) -> None:
        for stream, line in proc.lines():
            self.router.feed(stream, line)

    def _signal_launcher(self, signum: int) -> None:
        args = ["signal", self.plan.run_id, self.plan.path("launcher.pid"), str(int(signum))]
        if self.plan.head.name in self.lost:
            return  # nothing can reach it; the sweep ends the job on the other nodes
        try:
            programs.call(
                self.pool.get(self.plan.head),
                "jobctl",
                args,
                what="signalling the job",
                timeout=TEARDOWN,
            )
        except CpuaccelError as exc:
            # The sweep that follows still ends every process of the job, node by node.
            self.router.err.print(f"[yellow]could not signal the launcher: {escape(str(exc))}[/]")

    def _cancel_step(self, launcher_exit: int | None) -> None:
        """Under Slurm, the run's srun step, if still there, is scancelled (the sweep
        follows); a Slurm that does not answer is said, and the sweep still runs. An
        srun that ended by itself took its step along: nothing to ask Slurm then."""
        job = self.plan.head.slurm_job
        if self.plan.launcher.name != "slurm" or job is None:
            return
        if self.stop_reason is None and launcher_exit is not None:
            return
        try:
            steps.cancel(job, launchers.step_name(self.plan.run_id))
        except CpuaccelError as exc:
            self.router.err.print(f"[yellow]could not end the job step: {escape(str(exc))}[/]")

    def sweep(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """End what is left of the job on every node; report what was ended and what stays."""
        self._notice_lost()
        plan, pool = self.plan, self.pool
        return fanout.sweep_hosts(
            plan.hosts, plan.run_id, plan.run_dir, pool, self.forks, self.lost,
            timeout=TEARDOWN, kept=self.kept,
        )  # fmt: skip

    def _outcome(
        self,
        launcher_exit: int | None,
        seconds: float,
        swept: dict[str, Any],
        left: dict[str, Any],
    ) -> Outcome:
        first = cause(self.router.failures)
        if self.stop_reason == "interrupted":
            code, reason = EXIT_INTERRUPTED, "interrupted"
        elif self.stop_reason == "terminated":
            code, reason = EXIT_TERMINATED, "terminated"
        elif self.stop_reason in ("timeout", "hang"):
            code, reason = EXIT_TIMEOUT, self.stop_reason
        elif self.lost and (self.stop_reason == "lost" or launcher_exit != 0):
            # Ranks on the other nodes fail because one was lost: name the cause.
            code, reason = EXIT_LOST, "lost"
        elif first is not None:
            code, reason = first.code, "failed"
        elif self.stop_reason == "failed":
            code, reason = launcher_exit or 1, "failed"
        elif launcher_exit != 0:
            code, reason = 1 if launcher_exit is None else launcher_exit, "failed"
        else:
            code, reason = 0, "completed"
        lost = list(self.lost)
        return Outcome(
            code, reason, seconds, launcher_exit, first, swept, left, lost, self.router.codes,
            self.hung,
        )  # fmt: skip


# ---------------------------------------------------------------- status.json


def foreground_status(plan: RunPlan, run_dir: RunDir) -> dict[str, Any]:
    """status.json of a foreground run, written as it starts: this process supervises it
    (`cpuaccel stop` ends it through this process, found by pid and start time)."""
    me = {"host": socket.gethostname(), "pid": os.getpid(), "start_time": start_time(os.getpid())}
    doc = status_doc(plan.run_id, time.time(), False, me, plan.world or 0)
    write_status(str(run_dir.path), doc)
    return doc


def end_status(doc: dict[str, Any], run_dir: RunDir, outcome: Outcome) -> None:
    """The final status.json: the contract's state for the outcome's reason."""
    first = outcome.first_failure
    ended_by = outcome.reason
    if outcome.reason == "failed" and first is not None:
        ended_by = f"rank {first.rank}"
    elif outcome.reason == "terminated":
        ended_by = "stop"
    clean = outcome.reason == "completed" and outcome.launcher_exit == 0
    ranks = {str(r): outcome.codes.get(r, 0 if clean else None) for r in range(len(doc["ranks"]))}
    doc.update(
        state=STATES[outcome.reason],
        exit_code=outcome.exit_code,
        ended_by=ended_by,
        ended=time.time(),
        ranks=ranks,
    )
    if outcome.hang:  # run --hang-timeout: each rank's last step and silence
        doc["hang"] = outcome.hang
    write_status(str(run_dir.path), doc)
