"""A run's rank logs, as lines: from the controller's copy of its folder, or from its
head node while a detached run runs there (``cpuaccel logs``, ``Run.logs``)."""

from __future__ import annotations

import errno
import os
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from cpuaccel import ui
from cpuaccel.errors import NotALog, UsageError
from cpuaccel.history.records import ENDED, RunRecord, load, with_slurm
from cpuaccel.slurm.commands import SlurmError
from cpuaccel.ui import escape

POLL = 1.0  # seconds between two looks at a followed run
# A submitted run whose job Slurm has not listed (squeue, sacct, scontrol) for this long
# was purged from a cluster without accounting, or its id is wrong: following it would
# wait forever. A queued job Slurm lists is followed as long as Slurm queues it.
UNKNOWN_JOB_LIMIT = 120.0
CHUNK = 1024 * 1024
# The longest line shown whole: a longer one is shown cut, with how many bytes were left
# out, so that a line without end takes neither unbounded memory nor time.
LINE_BYTES = 64 * 1024
_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _kind(mode: int) -> str:
    for test, kind in (
        (stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a device"),
        (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket"),
    ):  # fmt: skip
        if test(mode):
            return kind
    return "not a regular file"


class Files(Protocol):
    """Where a run's logs are read: the controller's copy (:class:`LocalFiles`) or the
    head's folder of a detached run (connectors/runfiles.HeadFiles)."""

    def read(self, name: str, offset: int) -> tuple[bytes, int]: ...

    def state(self) -> str: ...


class LocalFiles:
    """The controller's copy of the run folder."""

    def __init__(self, run: RunRecord) -> None:
        self.run = run

    def read(self, name: str, offset: int) -> tuple[bytes, int]:
        """Up to CHUNK bytes of ``name`` from ``offset``: a regular file alone, opened
        without following a link and without waiting (a FIFO would block); NotALog
        for anything else."""
        path = self.run.path / name
        try:
            fd = os.open(path, _OPEN)
        except FileNotFoundError:
            return b"", offset
        except OSError as exc:
            kind = "a symbolic link" if exc.errno == errno.ELOOP else exc.strerror
            raise NotALog(f"{path}: {kind}, not a log: not read") from None
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                raise NotALog(f"{path}: {_kind(mode)}, not a log: not read")
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
    """Each rank's new bytes as lines; a line not ended yet waits for its end. Of a line
    longer than LINE_BYTES, its first LINE_BYTES are kept and the rest counted: it is
    shown cut, saying how many bytes were left out. A rank whose log is not a regular
    file is named once on stderr and left out; the others go on."""

    def __init__(self, run: RunRecord, ranks: list[int]) -> None:
        self.run = run
        self.offsets = dict.fromkeys(ranks, 0)
        self.partial = dict.fromkeys(ranks, b"")
        self.dropped = dict.fromkeys(ranks, 0)  # bytes of the partial line left out
        self.refused: set[int] = set()

    def _line(self, rank: int, line: bytes, dropped: int = 0) -> LogLine:
        text = line.decode(errors="replace")
        if dropped:
            text += f" [... {dropped} more bytes of this line left out]"
        return LogLine(rank, self.run.rank_host(rank), text)

    def _add(self, rank: int, data: bytes) -> Iterator[LogLine]:
        """The lines ``data`` ends, the rank's partial line first."""
        start = 0
        while (end := data.find(b"\n", start)) >= 0:
            self._keep(rank, data[start:end])
            yield self._line(rank, self.partial[rank], self.dropped[rank])
            self.partial[rank], self.dropped[rank] = b"", 0
            start = end + 1
        self._keep(rank, data[start:])

    def _keep(self, rank: int, piece: bytes) -> None:
        room = LINE_BYTES - len(self.partial[rank])
        if room > 0:
            self.partial[rank] += piece[:room]
        self.dropped[rank] += max(0, len(piece) - max(room, 0))

    def poll(self, files: Files) -> Iterator[LogLine]:
        """What each rank added, rank by rank, a chunk at a time."""
        for rank in self.offsets:
            if rank in self.refused:
                continue
            while True:
                try:
                    data, self.offsets[rank] = files.read(f"rank-{rank}.log", self.offsets[rank])
                except NotALog as exc:
                    self.refused.add(rank)
                    ui.stderr().print(f"[yellow]warning:[/] rank {rank}: {escape(str(exc))}")
                    break
                if not data:
                    break
                yield from self._add(rank, data)
                if len(data) < CHUNK:
                    break

    def flush(self) -> list[LogLine]:
        """The lines not ended yet, as they are."""
        rest = [
            self._line(rank, tail, self.dropped[rank])
            for rank, tail in self.partial.items()
            if tail or self.dropped[rank]
        ]
        self.partial = dict.fromkeys(self.partial, b"")
        self.dropped = dict.fromkeys(self.dropped, 0)
        return rest


def lines(reader: Reader, files: Files, follow: bool) -> Iterator[LogLine]:
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


def _batch_output(files: Files, reader: Reader) -> None:
    """A submitted run that ended without any rank's output (its batch job failed
    before the ranks started, or never ran): the batch job's own output says why."""
    job = reader.run.job_id
    if job is None or not isinstance(files, LocalFiles) or any(reader.offsets.values()):
        return
    try:
        data, _ = files.read(f"slurm-{job}.out", 0)
    except NotALog as exc:
        ui.stderr().print(f"[yellow]warning:[/] {escape(str(exc))}")
        return
    if data:
        ui.stderr().print(f"[dim]slurm-{escape(job)}.out:[/]")
        ui.stderr().print(escape(data.decode(errors="replace").rstrip("\n")), soft_wrap=True)


def files_of(run: RunRecord, first_rank: int, head: Callable[[], Files]) -> Files:
    """Where the run's logs are read: the head's folder while a detached run runs there
    (or has ended but was not fetched yet: the head's logs are the run's), else the
    controller's copy. ``head()`` gives the head's folder."""
    first = run.path / f"rank-{first_rank}.log"
    if run.detached and not run.local and (run.state() not in ENDED or not first.exists()):
        return head()
    return LocalFiles(run)
