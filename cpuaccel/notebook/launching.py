"""``cpuaccel.notebook.launch`` on the controller: the call pickled into a run file, a
job of ``cpuaccel.notebook.rank`` started as ``cpuaccel.launch`` starts a script, its
lines shown in the cell, its outcome read from the nodes and returned or raised.

The job takes ``cpuaccel run``'s own path (``jobs.launch.launch``): the preflight,
with one check of this caller's (the nodes' Python and cloudpickle are the kernel's),
the sync of the current folder, the launch and the supervision. An interrupt (the
kernel's is SIGINT in the main thread, as Ctrl-C) reaches the supervisor, which ends
the job on every node and sweeps them, as for ``cpuaccel run``; then it is raised
here as KeyboardInterrupt.
"""

from __future__ import annotations

import contextvars
import dataclasses
import linecache
import os
import re
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType, FunctionType
from typing import Any, TextIO

from cpuaccel.api.keywords import check_switches
from cpuaccel.api.launching import request, settle, start
from cpuaccel.api.output import quiet_unless
from cpuaccel.api.script import script_entry
from cpuaccel.api.target import HOST_OPTIONS, HostKeywords
from cpuaccel.config.settings import LaunchSettings, SecretEnv, Setting
from cpuaccel.connectors import runfiles
from cpuaccel.errors import CpuaccelError, PreflightError, UsageError
from cpuaccel.executor import run_on_hosts
from cpuaccel.facts.gather import Facts
from cpuaccel.facts.problems import ERROR, Problem
from cpuaccel.jobs.connections import Nodes
from cpuaccel.jobs.plan import RunPlan
from cpuaccel.jobs.result import PREFLIGHT, JobReport
from cpuaccel.jobs.rundir import PLAIN
from cpuaccel.jobs.tracebacks import ranks_text
from cpuaccel.notebook import payload
from cpuaccel.notebook.errors import JobError, RankError, ResultRefused
from cpuaccel.visible import visible

RANK_MODULE = "cpuaccel.notebook.rank"
# Settings that would make the ranks run something else than the function.
NOT_HERE = ("module", "no_python", "detach")
READ_TIMEOUT = 30.0  # seconds one read of a rank's file may take


def launch_function(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    *,
    nodes: int | str | None,
    ppn: int | None,
    inventory: str | os.PathLike[str] | None,
    gather: bool,
    progress: bool,
    settings: Mapping[str, Any],
) -> Any:
    """``cpuaccel.notebook.launch``: see there."""
    if not callable(fn):
        raise UsageError(f"{fn!r} is not a function", hint="e.g. launch(train, nodes=2)")
    check_switches(gather=gather)
    refused = [k for k in NOT_HERE if k in settings]
    if refused:
        raise UsageError(
            f"{', '.join(refused)}: not for a notebook's function, which every rank runs "
            "while this call waits",
            hint="use cpuaccel.launch for a script, a module or a detached run",
        )
    hosts = HostKeywords.of(inventory, {k: settings[k] for k in HOST_OPTIONS if k in settings})
    run_settings = {k: v for k, v in settings.items() if k not in HOST_OPTIONS}
    run_settings.update({k: v for k, v in (("nodes", nodes), ("ppn", ppn)) if v is not None})
    call = payload.dumps(payload.Call(fn, tuple(args), gather))  # before any node is asked
    sink = CellOutput(sys.stdout, sys.stderr)
    project = Path.cwd().resolve()
    with quiet_unless(progress):
        target, chosen, _ = settle(hosts, run_settings)
        key = payload.new_key()  # the ranks' seal of their values: in secret.env alone
        chosen = with_secret(chosen, payload.KEY_ENV, key)
        what = script_entry(RANK_MODULE, (), project, True, False)
        outcome = Outcome(key=key)
        report = start(
            request(
                target,
                chosen,
                what,
                project,
                extra_files={payload.CALL: (PLAIN, call)},
                show=sink,
                show_group=sink.group,
                collect=lambda plan, nodes: outcome.collect(plan, nodes, gather),
                require=lambda facts: version_problems(facts, *kernel_versions()),
            )
        )
    return finish(report, outcome, gather, fn)


def with_secret(settings: LaunchSettings, name: str, value: str) -> LaunchSettings:
    """``settings`` with one more variable of secret.env (the 0600 file of the nodes'
    0700 run folder, sent over ssh: never in argv, a log, a record or the controller's
    disk), which rank.sh sources."""
    old = settings.secret_env
    secret = SecretEnv({**old.value, name: value})
    setting = Setting(old.name, secret, old.source, old.where)
    return dataclasses.replace(settings, secret_env=setting)


# ---------------------------------------------------------------- the cell's output


class CellOutput:
    """The ranks' lines in the caller's output: rank 0's stdout as it comes, every
    rank's stderr labelled with its rank (rank 0's as it is), the launcher's labelled;
    the other ranks' stdout stays in their logs (runs/<id>/). The streams are those of
    the call (a notebook cell's), written in its context from the threads that read
    the job's output, one line at a time."""

    def __init__(self, out: TextIO, err: TextIO) -> None:
        self.out, self.err = out, err
        self.context = contextvars.copy_context()  # a kernel's output knows its cell by it
        self.lock = threading.Lock()  # a context is entered by one thread at a time

    def __call__(self, stream: str, rank: int | None, host: str, text: str) -> None:
        if stream == "out" and rank == 0:
            self.write(self.out, text)
        elif stream == "err" or rank is None:
            label = "[mpirun] " if rank is None else "" if rank == 0 else f"[rank {rank} {host}] "
            self.write(self.err, label + text)

    def group(self, ranks: Sequence[int], hosts: Sequence[str], lines: Sequence[str]) -> None:
        where = ",".join(hosts) if len(hosts) <= 2 else f"{len(hosts)} nodes"
        label = f"[ranks {ranks_text(ranks)} {where}] "
        for text in lines:
            self.write(self.err, label + text)

    def write(self, stream: TextIO, text: str) -> None:
        with self.lock:
            self.context.run(_write_line, stream, text)


def _write_line(stream: TextIO, text: str) -> None:
    try:
        stream.write(visible(text) + "\n")  # a rank's escapes shown, never obeyed
        stream.flush()
    except (OSError, ValueError):  # a closed stream: the lines are in the logs too
        pass


# ---------------------------------------------------------------- the preflight's check


def kernel_versions() -> tuple[str, str | None]:
    """This Python's major.minor and its cloudpickle's version (None: not installed)."""
    import importlib.metadata

    try:
        pickler: str | None = importlib.metadata.version("cloudpickle")
    except importlib.metadata.PackageNotFoundError:
        pickler = None
    return f"{sys.version_info[0]}.{sys.version_info[1]}", pickler


def version_problems(
    facts: Mapping[str, Facts], python: str, cloudpickle: str | None
) -> list[Problem]:
    """One error for each node whose Python (major.minor) or cloudpickle is not the
    caller's: a function pickled by one may not load, or not run, on the other."""
    problems = []
    for name, found in facts.items():
        version = str((found.get("python") or {}).get("version") or "")
        node_python = ".".join(version.split(".")[:2]) or "unknown"
        node_pickler = (found.get("packages") or {}).get("cloudpickle")
        if node_python == python and node_pickler == cloudpickle:
            continue
        problems.append(
            Problem(
                ERROR,
                name,
                f"Python {node_python} with cloudpickle {node_pickler or '(not installed)'}, "
                f"but this notebook runs Python {python} with cloudpickle "
                f"{cloudpickle or '(not installed)'}: the function pickled here must load "
                "there",
                hint=f"install cloudpickle=={cloudpickle} on the node's Python {python} "
                "(cpuaccel_python names it), or run the notebook with the nodes' versions",
            )
        )
    return problems


# ---------------------------------------------------------------- the outcome


@dataclass
class Outcome:
    """What the ranks left on their nodes: each return value's bytes and each
    traceback, by rank, with its node and when it was written (the first traceback
    written is the failure's cause; the others may follow from it). ``key``: the run's,
    which sealed each value (payload.seal)."""

    key: str = ""
    values: dict[int, bytes] = field(default_factory=dict)  # sealed, as read
    hosts: dict[int, str] = field(default_factory=dict)  # the node of each value
    errors: dict[int, tuple[str, str, float]] = field(default_factory=dict)  # host, text, mtime
    unread: list[str] = field(default_factory=list)  # a node that could not be read, why

    def collect(self, plan: RunPlan, nodes: Nodes, gather: bool) -> None:
        """Read the ranks' files on every node of the job (its last attempt's plan)."""
        ppn = plan.ppn or 1

        def read_node(conn: Any) -> None:
            index = next(i for i, h in enumerate(plan.hosts) if h.name == conn.host.name)
            ranks = range(index * ppn, (index + 1) * ppn)  # MPI's blocks of ppn, head first
            listing = runfiles.list_files(conn, plan.run_dir, timeout=READ_TIMEOUT) or []
            present = {f.name: f for f in listing}
            for rank in ranks:
                error = present.get(payload.error_name(rank))
                if error is not None:
                    data = read_whole(conn, plan.run_dir, error.name)
                    text = visible(data.decode("utf-8", errors="replace"))
                    self.errors[rank] = (conn.host.name, text, error.mtime)
                wanted = rank == 0 or gather
                if wanted and payload.result_name(rank) in present:
                    self.values[rank] = read_whole(conn, plan.run_dir, payload.result_name(rank))
                    self.hosts[rank] = conn.host.name

        for result in run_on_hosts(plan.hosts, read_node, forks=nodes.forks, pool=nodes.pool):
            if not result.ok:
                self.unread.append(f"{result.host.name}: {result.error}")


def read_whole(conn: Any, run_dir: str, name: str) -> bytes:
    """A run file of the node, chunk by chunk."""
    chunks, offset = [], 0
    while True:
        data, offset, size = runfiles.read(conn, run_dir, name, offset, timeout=READ_TIMEOUT)
        if data is None:
            raise CpuaccelError(f"{name} is gone from {run_dir} on {conn.host.name}")
        chunks.append(data)
        if size is None or offset >= size or not data:
            return b"".join(chunks)


def finish(
    report: JobReport, outcome: Outcome, gather: bool, fn: Callable[..., Any] | None = None
) -> Any:
    """The job's value, or what it ended with, raised (a traceback with the source lines
    of ``fn``'s notebook, where this process has them)."""
    run_id = str(report.run_id)
    if report.ended_by == PREFLIGHT:
        raise PreflightError(report.error or "preflight failed", problems=report.problems)
    if report.ended_by == "interrupted":
        raise KeyboardInterrupt
    if outcome.errors:  # the first traceback written: the others may follow from it
        rank = min(outcome.errors, key=lambda r: (outcome.errors[r][2], r))
        host, text, _ = outcome.errors[rank]
        text = with_source(text, fn) if fn is not None else text
        raise RankError(
            rank, host, text, exit_code=report.exit_code, run_id=run_id, folder=report.folder
        )
    world = report.world or 0
    wanted = list(range(world)) if gather else [0]
    missing = [r for r in wanted if r not in outcome.values]
    if report.exit_code != 0 or missing:
        raise JobError(
            _ended(report, missing, outcome.unread),
            reason=report.ended_by,
            exit_code=report.exit_code,
            run_id=run_id,
            folder=report.folder,
        )
    values = [payload.value_of(unsealed(outcome, r, report)) for r in wanted]
    return values if gather else values[0]


def unsealed(outcome: Outcome, rank: int, report: JobReport) -> bytes:
    """Rank ``rank``'s pickle, once its seal is the run key's; refused otherwise (never
    unpickled: a pickle can run anything where it is loaded)."""
    host = outcome.hosts.get(rank, "its node")
    try:
        return payload.unseal(outcome.key, rank, outcome.values[rank])
    except payload.Unsealed as exc:
        raise ResultRefused(
            f"the value of rank {rank} on {host} (run {report.run_id}) was refused, not "
            f"unpickled: {exc}; its result file was changed on {host} after the rank wrote it",
            rank=rank,
            host=host,
            exit_code=report.exit_code,
            run_id=str(report.run_id),
            folder=report.folder,
        ) from None


def _ended(report: JobReport, missing: list[int], unread: list[str]) -> str:
    failing = sorted(r for r, code in report.ranks.items() if code not in (0, None))
    says = f"the job {report.run_id} ended ({report.ended_by}, exit code {report.exit_code})"
    if failing:
        codes = ", ".join(f"rank {r}: {report.ranks[r]}" for r in failing)
        says += f"; exit codes {codes}"
    if missing:
        says += f"; no value from rank(s) {ranks_text(missing)}"
    if unread:
        says += "; not read: " + "; ".join(unread)
    if report.folder:
        says += f"; the ranks' logs are in {report.folder}"
    return says


# A frame of a function pickled by value: cloudpickle names no file, the rank has no
# source to print.
_DYNAMIC_FRAME = re.compile(r'^  File "<dynamic-code>", line (\d+), in (.+)$')


def with_source(text: str, fn: Callable[..., Any]) -> str:
    """``text`` (a rank's traceback) with the source line under each frame of a function
    pickled by value, read where it was defined: ``fn``, and the functions and classes
    of its module (a notebook's cells) that it may have called."""
    codes = _codes_of(fn)
    lines = text.splitlines(keepends=True)
    shown: list[str] = []
    for index, line in enumerate(lines):
        shown.append(line)
        match = _DYNAMIC_FRAME.match(line.rstrip("\n"))
        following = lines[index + 1] if index + 1 < len(lines) else ""
        if match is None or following.startswith("    "):
            continue
        number = int(match[1])
        for code in codes.get(match[2], ()):
            if number in {n for _, _, n in code.co_lines()}:
                source = linecache.getline(code.co_filename, number).strip()
                if source:
                    shown.append(f"    {source}\n")
                    break
    return "".join(shown)


def _codes_of(fn: Callable[..., Any]) -> dict[str, list[CodeType]]:
    """The code objects of ``fn``, of the functions and classes defined in its module,
    and those nested in them, by name."""
    found: dict[str, list[CodeType]] = {}
    seen: set[int] = set()

    def walk(code: CodeType) -> None:
        if id(code) in seen:
            return
        seen.add(id(code))
        found.setdefault(code.co_name, []).append(code)
        for const in code.co_consts:
            if isinstance(const, CodeType):
                walk(const)

    def add(value: Any) -> None:
        value = getattr(value, "__func__", value)  # a staticmethod's or classmethod's
        if isinstance(value, FunctionType):
            walk(value.__code__)

    add(fn)
    module = getattr(fn, "__module__", None)
    for value in list(getattr(fn, "__globals__", {}).values()):
        if getattr(value, "__module__", None) != module:
            continue
        if isinstance(value, type):
            for member in list(vars(value).values()):
                add(member)
        else:
            add(value)
    return found
