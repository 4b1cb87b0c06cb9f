"""The attempts of one foreground job (``run --max-restarts N``), in one run folder.

When an attempt fails (a rank exits non-zero or is killed, a node is lost, a hang), it
has already been ended everywhere (jobs/supervise.py's teardown and sweep). If
attempts remain, this waits ``--restart-delay`` (Ctrl-C or SIGTERM then ends the run),
runs the preflight again and starts attempt k+1 with ``CPUACCEL_RESTART=k+1`` and, when
every node holds one whole, ``CPUACCEL_RESUME`` (jobs/resume.py's newest checkpoint).

A failure that repeats identically (same rank, same exit code, and no checkpoint before
either) would repeat forever: it is said once, and the run stops. ``decide`` is that
judgement, pure, in cpuaccel/node/restarts.py with the record's form (a detached run's
supervisor follows the same rule and keeps the same record on the head). ``AttemptLog``
keeps the record: ``attempts.jsonl`` (one line per attempt), run.json's ``attempts``,
a ``--- attempt k ---`` line in every top-level rank log where an attempt starts, and
``attempt-<k>/`` with copies of attempt k's logs.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import Protocol

from rich.console import Console

from cpuaccel.jobs.plan import RunPlan
from cpuaccel.jobs.rundir import RunDir
from cpuaccel.jobs.supervise import EXIT_INTERRUPTED, EXIT_TERMINATED, Outcome
from cpuaccel.node.restarts import (
    ATTEMPTS,
    MARKER,
    RESTART_ENV,
    RESUME_ENV,
    RETRIED,
    Attempt,
    Verdict,
    decide,
)
from cpuaccel.ui import escape

__all__ = ["ATTEMPTS", "RESTART_ENV", "RESUME_ENV", "RETRIED", "Attempt", "Verdict", "decide"]


def attempt_of(
    k: int, started: float, outcome: Outcome, hosts: list[str], resume: str | None
) -> Attempt:
    """The record of attempt ``k`` from its outcome (the first failing rank, else the
    first node lost)."""
    first = outcome.first_failure
    host = first.host if first else (outcome.lost[0] if outcome.lost else None)
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
    )


def plan_for(plan: RunPlan, k: int, resume: str | None) -> RunPlan:
    """The plan of attempt ``k`` (``plan``: the run's own): the same job, with the ranks
    told which attempt it is and the checkpoint found for it. Without one, a
    ``CPUACCEL_RESUME`` the user gave (``--env``: resume from another run) stays: each
    attempt starts from there until this run saved a checkpoint of its own."""
    env = dict(plan.env)
    env[RESTART_ENV] = str(k)
    if resume is not None:
        env[RESUME_ENV] = resume
    return dataclasses.replace(plan, env=env)


class AttemptLog:
    """The run folder's record of the attempts (see the module's docstring). With
    restarts off, only attempts.jsonl and run.json's list: the logs stay as they were."""

    def __init__(self, run_dir: RunDir, world: int, restarts: bool) -> None:
        self.run_dir = run_dir
        self.names = [f"rank-{r}.log" for r in range(world)] + ["launcher.log"]
        self.restarts = restarts
        self.history: list[Attempt] = []
        self._offsets: dict[str, int] = {}

    def begin(self, k: int) -> None:
        if not self.restarts:
            return
        for name in self.names:
            path = self.run_dir.log(name)
            if name.startswith("rank-"):
                with path.open("a") as log:
                    log.write(MARKER.format(k) + "\n")
            self._offsets[name] = path.stat().st_size

    def end(self, attempt: Attempt) -> None:
        self.history.append(attempt)
        if self.restarts:
            folder = f"attempt-{attempt.attempt}"
            (self.run_dir.path / folder).mkdir(mode=0o700, exist_ok=True)
            for name in self.names:
                with self.run_dir.log(name).open("rb") as log:
                    log.seek(self._offsets.get(name, 0))
                    text = log.read().decode(errors="replace")
                self.run_dir.write(f"{folder}/{name}", text)
        with self.run_dir.log(ATTEMPTS).open("a") as out:
            out.write(json.dumps(attempt.to_json()) + "\n")
        self.run_dir.record(attempts=[a.to_json() for a in self.history])


class Attempts(Protocol):
    """What the loop needs of the job (jobs/launch.py gives it)."""

    hosts: list[str]

    def run(self, k: int, resume: str | None) -> Outcome:
        """Attempt ``k``: started, watched, ended everywhere."""

    def preflight(self) -> bool:
        """The nodes checked again; False (the problems printed) when one is not ready."""

    def newest_checkpoint(self) -> str | None:
        """The newest checkpoint every node holds whole."""


@dataclass
class Settings:
    max_restarts: int
    delay: float
    err: Console
    stop: list[str] = field(default_factory=list)  # the signal that ended the wait


def run_attempts(job: Attempts, log: AttemptLog, settings: Settings) -> Outcome:
    """Attempt after attempt until one ends for good; the last one's outcome."""
    resume: str | None = None
    k = 0
    while True:
        started = time.time()
        log.begin(k)
        outcome = job.run(k, resume)
        log.end(attempt_of(k, started, outcome, job.hosts, resume))
        if outcome.reason not in RETRIED or k >= settings.max_restarts:
            verdict = decide(log.history, settings.max_restarts, None)
        else:
            resume = job.newest_checkpoint()
            verdict = decide(log.history, settings.max_restarts, resume)
        if not verdict.restart:
            if verdict.why:
                settings.err.print(f"[red]{escape(verdict.why)}[/]")
            return outcome
        last = log.history[-1]
        settings.err.print(
            f"[yellow]attempt {k} failed[/] ({escape(last.why())}): restarting in "
            f"{settings.delay:g} s" + (f" from {escape(resume)}" if resume else "")
        )
        with _stop_signals(settings.stop):
            ready = _wait(settings) and job.preflight()
        if settings.stop:
            return _stopped(outcome, settings.stop[0], settings.err)
        if not ready:
            settings.err.print(f"[red]not restarting[/]: attempt {k + 1}'s preflight failed")
            return outcome
        if job.hosts != last.hosts:  # nodes left out (--nodes MIN:MAX): theirs only
            resume = job.newest_checkpoint()
            settings.err.print(
                f"attempt {k + 1} on {len(job.hosts)} node(s): {escape(', '.join(job.hosts))}"
                + (f", from {escape(resume)}" if resume else ", from the start")
            )
        k += 1


def _wait(settings: Settings) -> bool:
    """The delay, cut short by a stop signal: False when one came."""
    deadline = time.monotonic() + settings.delay
    while not settings.stop and time.monotonic() < deadline:
        time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
    return not settings.stop


def _stopped(outcome: Outcome, reason: str, err: Console) -> Outcome:
    """Ctrl-C or SIGTERM between attempts: the job is already ended everywhere."""
    err.print(f"[yellow]{reason}[/] before the restart: no further attempt")
    code = EXIT_INTERRUPTED if reason == "interrupted" else EXIT_TERMINATED
    return dataclasses.replace(outcome, exit_code=code, reason=reason)


@contextmanager
def _stop_signals(stop: list[str]) -> Iterator[None]:
    """Between attempts, Ctrl-C and SIGTERM (`cpuaccel stop`) note the stop; the wait
    and the preflight end with it, not with a traceback."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers are the main thread's (tests call this from others)
        return

    def note(signum: int, frame: FrameType | None) -> None:
        if not stop:
            stop.append("interrupted" if signum == signal.SIGINT else "terminated")

    previous = {sig: signal.signal(sig, note) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
