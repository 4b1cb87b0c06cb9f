"""A run's rank logs, as lines: from the controller's copy of its folder, or from its
head node while a detached run runs there (``cpuaccel logs``, ``Run.logs``)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from cpuaccel import ui
from cpuaccel.connectors.base import Connector
from cpuaccel.errors import HostError, UsageError
from cpuaccel.history import node_files as runfiles
from cpuaccel.history.records import ENDED, RunRecord, load, with_slurm
from cpuaccel.jsonsource import Refused, loads
from cpuaccel.slurm.commands import SlurmError
from cpuaccel.ui import escape

POLL = 1.0  # seconds between two looks at a followed run
# A submitted run whose job Slurm has not listed (squeue, sacct, scontrol) for this long
# was purged from a cluster without accounting, or its id is wrong: following it would
# wait forever. A queued job Slurm lists is followed as long as Slurm queues it.
UNKNOWN_JOB_LIMIT = 120.0
CHUNK = 1024 * 1024


class LocalFiles:
    """The controller's copy of the run folder."""

    def __init__(self, run: RunRecord) -> None:
        self.run = run

    def read(self, name: str, offset: int) -> tuple[bytes, int]:
        try:
            fd = os.open(self.run.path / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            return b"", offset
        try:
            os.lseek(fd, offset, os.SEEK_SET)
            data = os.read(fd, CHUNK)
        finally:
            os.close(fd)
        return data, offset + len(data)

    def state(self) -> str:
        run = load(self.run.path)
        if run.job_id is not None:  # submitted: Slurm says whether it is queued or ended
            run = with_slurm([run])[0]
            self.run = run
        return run.state()


class HeadFiles:
    """The run folder on the head of a detached run, read with the ``read`` operation."""

    def __init__(self, run: RunRecord, conn: Callable[[], Connector]) -> None:
        self.run = run
        self.conn = conn
        assert run.head_run_dir is not None
        self.where = run.head_run_dir

    def read(self, name: str, offset: int) -> tuple[bytes, int]:
        return runfiles.read_new(self.conn(), self.where, name, offset)

    def state(self) -> str:
        data, _, _ = runfiles.read(self.conn(), self.where, "status.json")
        try:
            status = loads(data) if data else None
        except Refused as exc:  # too large or nested too deep: not the supervisor's
            raise HostError(
                self.run.head or "the head",
                f"{self.where}/status.json: not read: {exc}",
                hint="check the run folder on the head: cpuaccel never writes it so",
            ) from None
        except ValueError:
            status = None  # being written: running still, as far as anyone knows
        return str(status.get("state", "running")) if isinstance(status, dict) else "running"


def chosen_ranks(run: RunRecord, ranks: tuple[int, ...], host: str | None) -> list[int]:
    world = run.world
    if world <= 0:
        raise UsageError(f"{run.path}/run.json names no ranks", hint="is it a run folder?")
    for rank in ranks:
        if not 0 <= rank < world:
            raise UsageError(
                f"--rank {rank}: run {run.run_id} has ranks 0 to {world - 1}",
                hint="give a rank of the run",
            )
    chosen = sorted(set(ranks)) if ranks else list(range(world))
    if host is not None:
        nodes = run.nodes_named(host)
        if not nodes:
            raise UsageError(
                f"--host {host}: run {run.run_id} ran on {', '.join(run.hosts)}",
                hint="give one of its nodes, by its inventory name or its hostname",
            )
        chosen = [r for r in chosen if run.rank_host(r) in nodes]
        if not chosen:
            raise UsageError(
                f"--host {host} --rank {' --rank '.join(map(str, ranks))}: none of these "
                f"ranks ran on {host}",
                hint="leave out --rank, or give ranks of that node",
            )
    return chosen


@dataclass(frozen=True)
class LogLine:
    """One line a rank wrote (without its newline), and the node it ran on."""

    rank: int
    host: str
    text: str


class Reader:
    """Each rank's new bytes as lines; a line not ended yet waits for its end."""

    def __init__(self, run: RunRecord, ranks: list[int]) -> None:
        self.run = run
        self.offsets = dict.fromkeys(ranks, 0)
        self.partial = dict.fromkeys(ranks, b"")

    def _line(self, rank: int, line: bytes) -> LogLine:
        return LogLine(rank, self.run.rank_host(rank), line.decode(errors="replace"))

    def poll(self, files: LocalFiles | HeadFiles) -> list[LogLine]:
        """What each rank added, rank by rank."""
        added: list[LogLine] = []
        for rank in self.offsets:
            while True:
                data, self.offsets[rank] = files.read(f"rank-{rank}.log", self.offsets[rank])
                if not data:
                    break
                *lines, self.partial[rank] = (self.partial[rank] + data).split(b"\n")
                added += [self._line(rank, line) for line in lines]
                if len(data) < CHUNK:
                    break
        return added

    def flush(self) -> list[LogLine]:
        """The lines not ended yet, as they are."""
        rest = [self._line(rank, tail) for rank, tail in self.partial.items() if tail]
        self.partial = dict.fromkeys(self.partial, b"")
        return rest


def lines(reader: Reader, files: LocalFiles | HeadFiles, follow: bool) -> Iterator[LogLine]:
    """The run's lines so far; with ``follow``, then each new one until the run ends
    (polled every POLL s; what it says meanwhile goes to ui.stderr())."""
    if not follow:
        yield from reader.poll(files)
        yield from reader.flush()
        return
    waiting = ""
    known = time.monotonic()  # when Slurm last listed the job (for a submitted run)
    while True:
        state = files.state()
        if isinstance(files, LocalFiles) and files.run.job_id is not None:
            reader.run = files.run  # its hosts, once the batch job's run has started
            waiting = _say_waiting(files.run, state, waiting)
            known = _check_known(files.run, known)
        yield from reader.poll(files)
        if state in ENDED:
            yield from reader.poll(files)  # what came between the look at the state and its end
            yield from reader.flush()
            _batch_output(files, reader)
            ui.stderr().print(f"[dim]run {escape(reader.run.run_id)} ended: {escape(state)}[/]")
            return
        time.sleep(POLL)


def _say_waiting(run: RunRecord, state: str, said: str) -> str:
    """A submitted run that Slurm has not started: one line each time its state
    changes (queued, with Slurm's reason), until the batch job writes."""
    if state not in ("queued", "submitted") or run.status is not None:
        return said
    now = run.slurm.describe() if run.slurm is not None else "not known to Slurm yet"
    if now != said:
        job = escape(run.job_id or "?")
        ui.stderr().print(f"[dim]waiting for Slurm job {job} to start: {escape(now)}[/]")
    return now


def _check_known(run: RunRecord, known: float) -> float:
    """When Slurm last listed a submitted run's job; a SlurmError once it has not for
    UNKNOWN_JOB_LIMIT while the run itself has written nothing."""
    now = time.monotonic()
    if run.slurm is not None or run.status is not None:
        return now
    if now - known > UNKNOWN_JOB_LIMIT:
        raise SlurmError(
            f"run {run.run_id}: Slurm has not listed job {run.job_id} for "
            f"{UNKNOWN_JOB_LIMIT:.0f} s (squeue, sacct, scontrol), and the run wrote no status",
            hint=f"ask Slurm (sacct -j {run.job_id}); cpuaccel ps shows what is recorded",
        )
    return known


def _batch_output(files: LocalFiles | HeadFiles, reader: Reader) -> None:
    """A submitted run that ended without any rank's output (its batch job failed
    before the ranks started, or never ran): the batch job's own output says why."""
    job = reader.run.job_id
    if job is None or not isinstance(files, LocalFiles) or any(reader.offsets.values()):
        return
    data, _ = files.read(f"slurm-{job}.out", 0)
    if data:
        ui.stderr().print(f"[dim]slurm-{escape(job)}.out:[/]")
        ui.stderr().print(escape(data.decode(errors="replace").rstrip("\n")), soft_wrap=True)


def files_of(
    run: RunRecord, first_rank: int, head: Callable[[], Callable[[], Connector]]
) -> LocalFiles | HeadFiles:
    """Where the run's logs are read: the head's folder while a detached run runs there
    (or has ended but was not fetched yet: the head's logs are the run's), else the
    controller's copy. ``head()`` gives how to reach the head."""
    first = run.path / f"rank-{first_rank}.log"
    if run.detached and not run.local and (run.state() not in ENDED or not first.exists()):
        return HeadFiles(run, head())
    return LocalFiles(run)
