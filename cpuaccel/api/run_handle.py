"""``Run``: one recorded run, from Python — its status, logs, end, stop and results.

A ``Run`` names a folder ``runs/<id>/`` of the project and reads it as ``ps``,
``logs``, ``stop`` and ``fetch`` do (they call the same functions of
``cpuaccel.history``); a detached run's head node is asked what only it knows, each
question bounded in time. ``runs()`` lists the project's runs as ``ps`` does.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from cpuaccel.api.heads import HeadOptions, Heads, node_failed
from cpuaccel.api.output import quiet_unless
from cpuaccel.api.target import HostFlags, resolve_target
from cpuaccel.connectors import runfiles
from cpuaccel.errors import CpuaccelError, HostError, UsageError, WaitTimeout
from cpuaccel.executor import fan_out
from cpuaccel.history.metrics import read_metrics, read_restarts, read_run_info, summarize
from cpuaccel.history.rank_logs import LogLine, Reader, chosen_ranks, files_of, lines
from cpuaccel.history.records import (
    ENDED,
    RunRecord,
    find_run,
    load,
    read_json,
    row,
    run_ids,
    runs_folder,
    with_slurm,
)
from cpuaccel.inventory.host import Host
from cpuaccel.jobs import teardown
from cpuaccel.jobs.homecoming import Fetched, Homecoming
from cpuaccel.jobs.result import JobReport
from cpuaccel.jsonsource import describe, loads

P = ParamSpec("P")
R = TypeVar("R")


def quiet(method: Callable[P, R]) -> Callable[P, R]:
    """The method prints nothing (a Run's calls say what they found by returning it)."""

    @functools.wraps(method)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        with quiet_unless(False):
            return method(*args, **kwargs)

    return call


LIVE_TIMEOUT = 10.0  # seconds a head may take to give a detached run's status
POLL = 2.0  # seconds between two looks at a run being waited for
FETCH_TIMEOUT = 600.0  # seconds a fetch from the head may take


@dataclass(frozen=True)
class RunResult:
    """How a run ended: ``exit_code`` (the first failing rank's, 0 if all succeeded,
    as ``cpuaccel run`` exits), ``state`` (succeeded, failed, stopped, timeout,
    interrupted, lost), each rank's exit code (None: it reported none), the wall time
    in seconds, and the summary ``cpuaccel report --json`` gives of its metrics.jsonl
    (None when the script logged none)."""

    run_id: str
    exit_code: int | None
    state: str
    ranks: dict[int, int | None]
    seconds: float | None
    metrics: dict[str, Any] | None = None
    folder: Path | None = None
    # rank -> the signal that ended it, by name ("SIGTERM": a rank cpuaccel ended)
    signals: dict[int, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.state == "succeeded"


@dataclass
class Run:
    """A run of the project: ``id``, its ``folder`` (``runs/<id>/``), and how its head
    is reached (``heads``). ``report`` is the launch's own account, when this process
    started it."""

    id: str
    folder: Path
    heads: HeadOptions = field(default_factory=HeadOptions)
    report: JobReport | None = None

    @classmethod
    def of_report(cls, report: JobReport, heads: HeadOptions, runs: Path) -> Run:
        folder = Path(report.folder) if report.folder else runs / str(report.run_id)
        return cls(str(report.run_id), folder, heads, report)

    @classmethod
    def find(cls, spec: str = "last", *, heads: HeadOptions | None = None) -> Run:
        """The run ``spec`` names (``last``, an id, a unique prefix, or a folder) in
        ./runs; UsageError when none or several do."""
        folder = find_run(spec)
        return cls(folder.name, folder, heads or HeadOptions())

    def record(self) -> RunRecord:
        return load(self.folder)

    # ------------------------------------------------------------ status
    @quiet
    def status(self) -> dict[str, Any]:
        """The run's row of ``cpuaccel ps --json``: id, script, nodes, ppn, hosts, state,
        exit_code, detached, started, ended, seconds, step, loss, restarts, slurm,
        problems. A detached run that has not ended is asked of its head (within
        LIVE_TIMEOUT s; as recorded when it does not answer)."""
        heads = self.heads.open()
        try:
            run = live(self.record(), heads)
        finally:
            heads.close()
        if run.job_id is not None:
            run = with_slurm([run])[0]
        return row(run, time.time())

    # ------------------------------------------------------------ logs
    def logs(
        self, *, follow: bool = False, rank: int | list[int] | None = None, host: str | None = None
    ) -> Iterator[LogLine]:
        """The ranks' lines (``LogLine``: rank, host, text), rank by rank; with
        ``follow``, then each new one as it comes until the run ends. ``rank``: one rank
        or a list; ``host``: only the ranks of that node (its inventory name or
        hostname). A detached run's lines are read from its head while it runs."""
        ranks = _ranks(rank)
        run = self.record()
        reader = Reader(run, chosen_ranks(run, ranks, host))
        heads = self.heads.open()
        try:
            files = files_of(run, next(iter(reader.offsets)), lambda: heads.files(run))
            found = lines(reader, files, follow)
            while True:  # each step quiet, not the caller's code between two lines
                with quiet_unless(False):
                    line = next(found, None)
                if line is None:
                    return
                yield line
        except HostError as exc:
            raise node_failed(exc) from None
        finally:
            heads.close()

    # ------------------------------------------------------------ wait
    @quiet
    def wait(self, timeout: float | None = None, *, poll: float = POLL) -> RunResult:
        """Block until the run has ended, then its ``RunResult`` (a detached run's
        results are fetched from its head first, as ``fetch`` does). ``timeout``
        seconds at most: then ``cpuaccel.errors.WaitTimeout`` (a TimeoutError), and the
        job goes on."""
        if timeout is not None and not (isinstance(timeout, (int, float)) and timeout >= 0):
            raise UsageError(f"timeout={timeout!r}: expected seconds >= 0", hint="e.g. 3600")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            state = self.status()["state"]
            if state in ENDED:
                break
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(
                    f"run {self.id} is still {state} after {timeout:g} s",
                    hint="wait again, or end it with run.stop()",
                )
            pause = poll if deadline is None else min(poll, max(0.0, deadline - time.monotonic()))
            time.sleep(pause)
        run = self.record()
        if run.detached and not run.local:
            self.fetch()
        return self.result()

    @quiet
    def result(self) -> RunResult:
        """The ended run's result as recorded in its folder (``wait`` first)."""
        run = self.record()
        status = read_json(self.folder / "status.json") or run.status or {}
        record = run.record
        ranks_doc = status.get("ranks") if isinstance(status.get("ranks"), dict) else {}
        ranks: dict[int, int | None] = {}
        for key, code in (ranks_doc or {}).items():
            if str(key).isdigit():
                ranks[int(key)] = code if isinstance(code, int) else None
        if self.report is not None and self.report.ranks and not any(ranks.values()):
            ranks = dict(self.report.ranks)
        state = run.state()
        if state == "succeeded":  # mpirun exits 0 only when every rank did
            ranks = {rank: 0 if code is None else code for rank, code in ranks.items()}
        ranks = {rank: ranks.get(rank) for rank in range(run.world)} if run.world else ranks
        exit_code = run.exit_code()
        seconds = _seconds(status, record)
        signals_doc = status.get("signals") if isinstance(status.get("signals"), dict) else {}
        signals = {
            int(key): name[:32]
            for key, name in (signals_doc or {}).items()
            if str(key).isdigit() and isinstance(name, str)
        }
        return RunResult(
            self.id, exit_code, state, ranks, seconds, _metrics(self.folder), self.folder,
            signals,
        )  # fmt: skip

    # ------------------------------------------------------------ stop, fetch
    @quiet
    def stop(self) -> teardown.Stopped:
        """End the run on every node, as ``cpuaccel stop`` does (SIGTERM, SIGKILL, every
        node swept), and verify that nothing of it is left: ``Stopped`` says its state,
        whether it had ended already, what the sweep ended and what is left (``left``
        empty when nothing is). A queued Slurm job is cancelled (scancel)."""
        record = teardown.read_record(self.folder)
        job = load(self.folder).job_id
        if job is not None:
            return teardown.stop_submitted(self.folder, record, job)
        inventory = self.heads.inventory_path or record.get("inventory")
        given = HostFlags(
            str(inventory) if inventory else None,
            timeout=self.heads.connect_timeout,
            no_host_key_checking=self.heads.no_host_key_checking,
        )
        target = resolve_target(given)
        hosts = run_hosts(target.inventory.hosts, record, str(inventory or ""))
        return teardown.stop(self.folder, record, hosts, target.connect, target.forks)

    @quiet
    def fetch(self, *, checkpoints: bool = False) -> Fetched | None:
        """Copy the run's results from its head into its folder, as ``cpuaccel fetch``
        does: metrics.jsonl, checkpoints.json, a detached run's status.json and logs;
        the checkpoint files too with ``checkpoints``. None for a run of this machine
        (its files are in its folder already). HostError when the head cannot be
        reached; UsageError when its folder there is gone."""
        run = self.record()
        if run.local:
            return None
        where = run.head_run_dir
        if where is None:
            raise UsageError(
                f"{run.path}/run.json does not say where the run's folder is on its head",
                hint="the run was recorded by an older cpuaccel: copy its files by hand",
            )
        heads = self.heads.open()
        try:
            home = Homecoming(
                heads.connector(run),
                where,
                run.path,
                supervised_there=run.detached,
                timeout=FETCH_TIMEOUT,
            )
            fetched = home.once(checkpoints=checkpoints)
        except HostError as exc:
            raise node_failed(exc) from None
        finally:
            heads.close()
        if fetched is None:
            raise UsageError(
                f"{run.head}: no run folder {where}",
                hint="was it removed? the controller's copy is all there is",
            )
        return fetched


def runs(
    count: int | None = None, *, heads: HeadOptions | None = None, progress: bool = False
) -> list[dict[str, Any]]:
    """The project's runs (./runs), newest first, as ``cpuaccel ps --json`` lists them:
    one row each (see ``Run.status``). ``count``: only the newest ones. A detached run
    not known to have ended is asked of its head, at most LIVE_TIMEOUT s each."""
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
        raise UsageError(f"count={count!r}: expected a whole number of 1 or more", hint="e.g. 5")
    with quiet_unless(progress):
        return rows(count, heads or HeadOptions())


def rows(count: int | None, options: HeadOptions) -> list[dict[str, Any]]:
    """``ps``'s rows, newest first (``runs`` and ``cpuaccel ps``)."""
    ids = list(reversed(run_ids()))[:count]
    found = [load(runs_folder() / i) for i in ids]
    heads = options.open()
    try:
        found = fan_out(found, lambda run: live(run, heads), forks=8)
    finally:
        heads.close()
    try:
        found = with_slurm(found)
    except CpuaccelError as exc:  # Slurm cannot be asked: the runs as recorded
        found = [replace(r, problems=(*r.problems, f"Slurm's state unknown: {exc}")) if r.job_id
                 else r for r in found]  # fmt: skip
    now = time.time()
    return [row(run, now) for run in found]


def live(run: RunRecord, heads: Heads) -> RunRecord:
    """A detached run's status.json as its head has it now (a copy of ``run``); the
    record as it is when the head cannot say (within LIVE_TIMEOUT)."""
    if not run.detached or run.head_run_dir is None or run.state() in ENDED:
        return run
    try:
        conn = heads.connector(run)()
        data, _, _ = runfiles.read(conn, run.head_run_dir, "status.json", timeout=LIVE_TIMEOUT)
    except CpuaccelError:
        return run
    try:
        status = loads(data) if data else None
    except ValueError as exc:
        problem = f"status.json on {run.head}: not read: {describe(exc)}"
        return replace(run, problems=(*run.problems, problem))
    if not isinstance(status, dict):
        return run
    return RunRecord(run.run_id, run.path, run.record, status, problems=run.problems)


def run_hosts(known: dict[str, Host], record: dict[str, Any], source: str) -> list[Host]:
    """The run's nodes (head first), as the inventory names them."""
    names = [str(n) for n in record.get("hosts") or []]
    missing = [n for n in names if n not in known]
    if missing or not names:
        raise UsageError(
            f"run {record.get('run_id')}'s nodes {', '.join(missing or names)} are not in "
            f"the inventory {source or '(this machine)'}",
            hint="give the inventory the run was started with: -i INVENTORY",
        )
    return [known[n] for n in names]


def _ranks(rank: int | list[int] | None) -> tuple[int, ...]:
    given = [] if rank is None else [rank] if isinstance(rank, int) else list(rank)
    if any(isinstance(r, bool) or not isinstance(r, int) or r < 0 for r in given):
        raise UsageError(f"rank={rank!r}: expected a rank (0, 1, ...) or a list of them",
                         hint="e.g. rank=0")  # fmt: skip
    return tuple(given)


def _seconds(status: dict[str, Any], record: dict[str, Any]) -> float | None:
    for value in (record.get("seconds"),):
        if isinstance(value, (int, float)) and math.isfinite(value):
            return float(value)
    started, ended = status.get("started"), status.get("ended")
    if isinstance(started, (int, float)) and isinstance(ended, (int, float)):
        return round(float(ended) - float(started), 3)
    return None


def _metrics(folder: Path) -> dict[str, Any] | None:
    """``report --json``'s summary of the run's metrics.jsonl; None without one."""
    if not (folder / "metrics.jsonl").is_file():
        return None
    try:
        metrics = read_metrics(folder)
        info = read_run_info(folder)
        read_restarts(folder, metrics, info)
    except CpuaccelError:
        return None
    if not metrics.steps:
        return None
    return summarize(metrics, info, folder / "report.png")
