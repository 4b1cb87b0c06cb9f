"""``cpuaccel logs [RUN]``: a run's labelled output, merged or filtered, followed with -f."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

import click

from cpuaccel import ui
from cpuaccel.api.heads import Heads, node_failed
from cpuaccel.cli.options import head_options
from cpuaccel.connectors.base import Connector
from cpuaccel.errors import EXIT_OK, CpuaccelError, HostError, UsageError
from cpuaccel.history import node_files as runfiles
from cpuaccel.history.records import ENDED, RunRecord, find_run, load, with_slurm
from cpuaccel.jobs.foreground import COLOURS
from cpuaccel.jsonsource import Refused, loads
from cpuaccel.slurm.commands import SlurmError
from cpuaccel.ui import escape

EPILOG = """\b
Examples:
  cpuaccel logs                        # the newest run's output, rank by rank
  cpuaccel logs 20250101 -f --rank 0   # follow rank 0 of that run until it ends
  cpuaccel logs last --host node2 --rank 4 --rank 5

\b
RUN is `last` (the default), a run id, a prefix only one run has, or a run folder.
A detached run's output is read from its head node while it runs (-i, else the
inventory it recorded).
Ctrl-C stops following (exit 0); the job goes on.
"""
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


class Printer:
    """Each rank's new bytes as labelled lines; a line not ended yet waits for its end."""

    def __init__(self, run: RunRecord, ranks: list[int]) -> None:
        self.run = run
        self.offsets = dict.fromkeys(ranks, 0)
        self.partial = dict.fromkeys(ranks, b"")
        self.out = ui.stdout()

    def _print(self, rank: int, line: bytes) -> None:
        colour = COLOURS[rank % len(COLOURS)]
        host = escape(self.run.rank_host(rank))
        text = escape(line.decode(errors="replace"))
        self.out.print(f"[{colour}]\\[rank {rank} {host}][/] {text}", soft_wrap=True)

    def poll(self, files: LocalFiles | HeadFiles) -> bool:
        """Print what each rank added; whether anything was."""
        added = False
        for rank in self.offsets:
            while True:
                data, self.offsets[rank] = files.read(f"rank-{rank}.log", self.offsets[rank])
                if not data:
                    break
                added = True
                *lines, self.partial[rank] = (self.partial[rank] + data).split(b"\n")
                for line in lines:
                    self._print(rank, line)
                if len(data) < CHUNK:
                    break
        return added

    def flush(self) -> None:
        for rank, rest in self.partial.items():
            if rest:
                self._print(rank, rest)
            self.partial[rank] = b""


def _follow(printer: Printer, files: LocalFiles | HeadFiles) -> None:
    waiting = ""
    known = time.monotonic()  # when Slurm last listed the job (for a submitted run)
    while True:
        state = files.state()
        if isinstance(files, LocalFiles) and files.run.job_id is not None:
            printer.run = files.run  # its hosts, once the batch job's run has started
            waiting = _say_waiting(files.run, state, waiting)
            known = _check_known(files.run, known)
        printer.poll(files)
        if state in ENDED:
            printer.poll(files)  # what came between the look at the state and its end
            printer.flush()
            _batch_output(files, printer)
            ui.stderr().print(f"[dim]run {escape(printer.run.run_id)} ended: {escape(state)}[/]")
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


def _batch_output(files: LocalFiles | HeadFiles, printer: Printer) -> None:
    """A submitted run that ended without any rank's output (its batch job failed
    before the ranks started, or never ran): the batch job's own output says why."""
    job = printer.run.job_id
    if job is None or not isinstance(files, LocalFiles) or any(printer.offsets.values()):
        return
    data, _ = files.read(f"slurm-{job}.out", 0)
    if data:
        ui.stderr().print(f"[dim]slurm-{escape(job)}.out:[/]")
        ui.stderr().print(escape(data.decode(errors="replace").rstrip("\n")), soft_wrap=True)


@click.command(epilog=EPILOG)
@click.argument("run_spec", metavar="[RUN]", default="last")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new output until the run ends.")
@click.option(
    "--rank", "ranks", type=click.IntRange(0), multiple=True, help="Only this rank (repeatable)."
)
@click.option(
    "--host",
    metavar="NODE",
    help="Only the ranks that ran on this node (its inventory name, or its hostname).",
)
@head_options
def logs_command(
    run_spec: str,
    follow: bool,
    ranks: tuple[int, ...],
    host: str | None,
    inventory_path: str | None,
    connect_timeout: float,
    no_host_key_checking: bool,
) -> None:
    """Print a run's output, each line labelled [rank R node], rank by rank (or as it
    arrives, with -f)."""
    run = load(find_run(run_spec))
    printer = Printer(run, chosen_ranks(run, ranks, host))
    heads = Heads(inventory_path, connect_timeout, no_host_key_checking)
    files: LocalFiles | HeadFiles = LocalFiles(run)
    first = run.path / f"rank-{next(iter(printer.offsets))}.log"
    if run.detached and not run.local and (run.state() not in ENDED or not first.exists()):
        # Running, or ended but not fetched yet: the head's logs are the run's.
        files = HeadFiles(run, heads.connector(run))
    try:
        if follow:
            _follow(printer, files)
        else:
            printer.poll(files)
            printer.flush()
    except KeyboardInterrupt:
        printer.flush()
        ui.stderr().print("[dim]stopped following; the job goes on[/]")
        sys.exit(EXIT_OK)
    except CpuaccelError as exc:
        printer.flush()
        raise node_failed(exc) if isinstance(exc, HostError) else exc from None
    finally:
        heads.close()
