"""A submitted job's state as Slurm tells it, and ``scancel``.

``squeue`` knows the jobs that are queued or running (and, for MinJobAge seconds,
those just ended); ``sacct`` knows every job once accounting is on. So: one squeue for
the user's jobs, then one sacct for the ids squeue did not list; where sacct answers
nothing (accounting off), ``scontrol show job`` while slurmctld still holds the job.
Whatever Slurm cannot say is left out: the caller keeps the run's own word.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cpuaccel.slurm import commands
from cpuaccel.slurm.commands import SlurmError

# Slurm job states (squeue(1) "JOB STATE CODES") -> the run's state of records.py.
QUEUED = frozenset(
    {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING"}
    | {"SUSPENDED", "STOPPED", "SPECIAL_EXIT", "SIGNALING", "STAGE_OUT"}
)
ACTIVE = QUEUED | {"RUNNING", "COMPLETING"}
RUN_STATE = {
    "COMPLETED": "succeeded",
    "FAILED": "failed",
    "OUT_OF_MEMORY": "failed",
    "NODE_FAIL": "failed",
    "BOOT_FAIL": "failed",
    "LAUNCH_FAILED": "failed",
    "DEADLINE": "timeout",
    "TIMEOUT": "timeout",
    "CANCELLED": "stopped",
    "PREEMPTED": "stopped",
    "REVOKED": "stopped",
}
_ID = re.compile(r"\d+")
Runner = Callable[[list[str]], str]  # commands.run, or a test's stand-in


@dataclass(frozen=True)
class JobState:
    job_id: str
    state: str  # Slurm's word: PENDING, RUNNING, COMPLETED, CANCELLED, ...
    exit_code: int | None = None  # the batch script's, once ended
    reason: str | None = None  # why a pending job waits (squeue's %r)

    @property
    def ended(self) -> bool:
        return self.state not in ACTIVE

    def run_state(self) -> str:
        """The run state this Slurm state means: queued, running, or an ended state."""
        if self.state in QUEUED:
            return "queued"
        if self.state in ACTIVE:
            return "running"
        return RUN_STATE.get(self.state, "failed")

    def describe(self) -> str:
        text = self.state
        if self.reason and self.reason not in ("None", "(null)") and self.state in QUEUED:
            text += f" ({self.reason})"
        return text


def _word(state: str) -> str:
    """sacct writes "CANCELLED by 0": the state is the first word."""
    return (state.split() or ["UNKNOWN"])[0].rstrip("+").upper()


def _exit_code(text: str) -> int | None:
    """sacct's ExitCode is "CODE:SIGNAL"; a signal is 128+SIGNAL, as a shell says it."""
    code, _, signal = text.strip().partition(":")
    if not code.isdigit():
        return None
    if signal.isdigit() and int(signal) and not int(code):
        return 128 + int(signal)
    return int(code)


def parse_squeue(text: str) -> dict[str, JobState]:
    """``squeue -h -o %i|%T|%r`` lines; lines that are not a plain job's are skipped."""
    found: dict[str, JobState] = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < 2 or not _ID.fullmatch(parts[0].strip()):
            continue  # an array task (123_4), a header, a blank line
        reason = parts[2].strip() if len(parts) > 2 else None
        found[parts[0].strip()] = JobState(parts[0].strip(), _word(parts[1]), None, reason)
    return found


def parse_sacct(text: str) -> dict[str, JobState]:
    """``sacct -X -n -P -o JobID,State,ExitCode`` lines (-X: the job, not its steps)."""
    found: dict[str, JobState] = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < 3 or not _ID.fullmatch(parts[0].strip()):
            continue
        job = parts[0].strip()
        found[job] = JobState(job, _word(parts[1]), _exit_code(parts[2]))
    return found


def parse_scontrol(text: str) -> JobState | None:
    """``scontrol show job J --oneliner``: its JobId, JobState and ExitCode."""
    fields = dict(re.findall(r"(\w+)=(\S*)", text))
    job, state = fields.get("JobId", ""), fields.get("JobState")
    if not _ID.fullmatch(job) or not state:
        return None
    return JobState(job, _word(state), _exit_code(fields.get("ExitCode", "")))


def _run(argv: list[str]) -> str:
    return commands.run(argv, timeout=15.0)


def states(ids: Sequence[str], run: Runner = _run) -> dict[str, JobState]:
    """Slurm's word on each job of ``ids`` that Slurm still knows; SlurmError when
    Slurm does not answer at all (squeue fails)."""
    wanted = [i for i in dict.fromkeys(ids) if _ID.fullmatch(i)]
    if not wanted:
        return {}
    queue = parse_squeue(run(["squeue", "-h", "--me", "-o", "%i|%T|%r"]))
    found = {i: queue[i] for i in wanted if i in queue}
    # Not sacct for a job squeue lists: sacct says CANCELLED or COMPLETED while the job
    # is still COMPLETING (processes of it not yet ended on some node).
    rest = [i for i in wanted if i not in found]
    if rest:
        argv = ["sacct", "-X", "-n", "-P", "-o", "JobID,State,ExitCode", "-j", ",".join(rest)]
        # Accounting off: scontrol below, while slurmctld remembers the job.
        with contextlib.suppress(SlurmError):
            found.update(parse_sacct(run(argv)))
    for job in [i for i in wanted if i not in found]:
        try:
            state = parse_scontrol(run(["scontrol", "show", "job", job, "--oneliner"]))
        except SlurmError:
            continue  # purged from slurmctld and no accounting: Slurm cannot say
        if state is not None:
            found[job] = state
    return found


def state(job_id: str, run: Runner = _run) -> JobState | None:
    return states([job_id], run).get(job_id)


def cancel(job_id: str, run: Runner = _run) -> None:
    """``scancel JOB``: Slurm signals every step and the batch script, then kills what
    is left after KillWait; the job ends CANCELLED."""
    if not _ID.fullmatch(job_id):
        raise ValueError(f"not a Slurm job id: {job_id!r}")
    run(["scancel", job_id])


def wait_ended(
    job_id: str, seconds: float, run: Runner = _run, poll: float = 1.0
) -> JobState | None:
    """Slurm's state once the job has ended and left COMPLETING (Slurm has seen every
    process of it end on every node), or the last state seen when ``seconds`` pass."""
    deadline = time.monotonic() + seconds
    last = state(job_id, run)
    while (last is None or not last.ended) and time.monotonic() < deadline:
        time.sleep(poll)
        last = state(job_id, run) or last
    return last


# ---------------------------------------------------------------- a run's srun step
# A run's own srun step: found by its name, cancelled at the end of the run.
#
# The Slurm launcher (jobs/launchers.py) names its step ``cpuaccel-<run id>``. When the
# job ends, for whatever reason, that step is scancelled if it is still there (srun killed
# by the teardown leaves its step behind), before the sweep by run id: Slurm ends the
# step's processes on every node itself, the sweep then checks that none is left.
TIMEOUT = 10.0  # seconds for each of squeue and scancel: the teardown is bounded


def named(job_id: str, name: str) -> list[str]:
    """The ids (``JOB.STEP``) of job ``job_id``'s steps named ``name``."""
    argv = ["squeue", "--steps", f"--jobs={job_id}", "--noheader", "--format=%i %j"]
    found = []
    for line in commands.run(argv, timeout=TIMEOUT).splitlines():
        step, _, step_name = line.strip().partition(" ")
        if step_name.strip() == name and step.startswith(f"{job_id}."):
            found.append(step)
    return found


def cancel_step(job_id: str, name: str) -> list[str]:
    """scancel job ``job_id``'s steps named ``name``; the steps it cancelled."""
    steps = named(job_id, name)
    if steps:
        commands.run(["scancel", "--quiet", *steps], timeout=TIMEOUT)
    return steps
