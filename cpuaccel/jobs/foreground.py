"""A foreground run: the supervisor (node/supervisor.py) on the controller.

``cpuaccel run`` without --detach supervises its job itself: the supervisor every run
has, with this module's side. launch.sh runs on the head node over the head's
connection (locally when that is the controller), in a process group of its own that
launch.sh records; the ranks' labelled lines stream back over it onto the terminal
and into runs/<id>/. Ending the job means signalling that process group on the head
(MPI passes it on), then sweeping every node over its connection for the processes
whose environment carries this run's id, and verifying none is left: nothing is
matched by command line. A node whose connection stops answering keepalives is lost.

Between attempts (--max-restarts), this side runs the preflight again (leaving out
failing nodes while --nodes MIN remain: a new plan, rendered anew), finds the newest
checkpoint every node holds through their connections, and copies attempt k's files
(CPUACCEL_RESTART, CPUACCEL_RESUME) to every node.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import socket
import time
from collections.abc import Iterator, Sequence
from typing import Any

from rich.console import Console

from cpuaccel import ui
from cpuaccel.connectors import programs, runfiles
from cpuaccel.connectors.base import Connector, Process
from cpuaccel.errors import CpuaccelError
from cpuaccel.executor import ConnectionPool, run_on_hosts
from cpuaccel.inventory.host import Host
from cpuaccel.jobs import elastic, homecoming, tracebacks
from cpuaccel.jobs.connections import JobFiles, Nodes, broadcast_note, copy_files
from cpuaccel.jobs.elastic import PreflightFailed
from cpuaccel.jobs.plan import RunPlan
from cpuaccel.jobs.request import GroupSink, LaunchRequest, LineSink
from cpuaccel.jobs.rundir import SECRET_FILES, RunDir, render_job_files
from cpuaccel.jobs.teardown import TEARDOWN, sweep_hosts
from cpuaccel.node import progress
from cpuaccel.node.checkpoints import RECORDS, TAIL, Found, HostCheckpoints, choose, host_of
from cpuaccel.node.supervisor import (
    RESTART_ENV,
    RESUME_ENV,
    Attempt,
    Launched,
    Limits,
    Outcome,
    Side,
    Supervised,
    start_time,
    status_doc,
)
from cpuaccel.slurm import queue
from cpuaccel.ui import escape

COLOURS = ("cyan", "magenta", "green", "yellow", "blue", "red")
_STYLES = {"error": "red", "warning": "yellow"}
# A node's answer with its ranks' stacks: py-spy's own bound, the program's start and
# reply, with room.
STACKS_TIMEOUT = progress.DUMP_TIMEOUT + 10


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


class _OverConnection(Launched):
    def __init__(self, proc: Process, side: ControllerSide) -> None:
        self.proc = proc
        self.side = side

    def lines(self) -> Iterator[tuple[str, str]]:
        return self.proc.lines()

    def wait(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout)
        except CpuaccelError as exc:
            self.side.say("warning", f"no exit status from the launcher: {exc}")
            return None

    def close(self) -> None:
        self.proc.close()


class ControllerSide(Side):
    """The attempt's plan, reached from the controller over the job's connections."""

    def __init__(self, plan: RunPlan, nodes: Nodes, run_dir: RunDir, err: Console) -> None:
        self.plan = plan
        self.nodes = nodes
        self.run_dir = str(run_dir.path)
        self.err = err

    @property
    def run_id(self) -> str:  # type: ignore[override]
        return self.plan.run_id

    @property
    def hosts(self) -> list[str]:  # type: ignore[override]
        return [h.name for h in self.plan.hosts]

    def say(self, level: str, text: str) -> None:
        style = _STYLES.get(level)
        self.err.print(f"[{style}]{escape(text)}[/]" if style else escape(text))

    def start(self) -> Launched:
        head = self.nodes.pool.get(self.plan.head)
        # setsid -w: a process group of its own (forking only if it must), whose exit
        # status it passes back.
        return _OverConnection(
            head.start(["setsid", "-w", "/bin/sh", self.plan.path("launch.sh")]), self
        )

    def signal_launcher(self, signum: int, lost: Sequence[str]) -> None:
        if self.plan.head.name in lost:
            return  # nothing can reach it; the sweep ends the job on the other nodes
        args = ["signal", self.plan.run_id, self.plan.path("launcher.pid"), str(int(signum))]
        try:
            programs.call(
                self.nodes.pool.get(self.plan.head),
                "jobctl",
                args,
                what="signalling the job",
                timeout=TEARDOWN,
            )
        except CpuaccelError as exc:
            # The sweep that follows still ends every process of the job, node by node.
            self.say("warning", f"could not signal the launcher: {exc}")

    def lost(self) -> list[str]:
        return self.nodes.pool.lost(self.plan.hosts)

    def stacks(self, pids: dict[str, list[Any]], lost: Sequence[str]) -> dict[str, str]:
        payload = json.dumps(pids).encode()

        def dump(conn: Connector) -> dict[str, Any]:
            words = ["stacks", self.plan.run_id, f"{progress.DUMP_TIMEOUT:g}"]
            return programs.call(
                conn, "jobctl", words, payload, what="dumping the ranks' stacks",
                timeout=STACKS_TIMEOUT,
            )  # fmt: skip

        hosts = [h for h in self.plan.hosts if h.name not in lost]
        dumps: dict[str, str] = {}
        for result in run_on_hosts(hosts, dump, forks=self.nodes.forks, pool=self.nodes.pool):
            if result.value is not None:  # a node that cannot answer: the sweep says so
                dumps.update(result.value.get("stacks", {}))
        return dumps

    def end_step(self, stopped: bool, launcher_exit: int | None) -> None:
        """Under Slurm, the run's srun step, if still there, is scancelled (the sweep
        follows); a Slurm that does not answer is said, and the sweep still runs. An
        srun that ended by itself took its step along: nothing to ask Slurm then."""
        job = self.plan.head.slurm_job
        if self.plan.launcher.name != "slurm" or job is None:
            return
        if not stopped and launcher_exit is not None:
            return
        from cpuaccel.jobs.launchers import step_name

        try:
            queue.cancel_step(job, step_name(self.plan.run_id))
        except CpuaccelError as exc:
            self.say("warning", f"could not end the job step: {exc}")

    def sweep(self, lost: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
        plan, nodes = self.plan, self.nodes
        return sweep_hosts(
            plan.hosts, plan.run_id, plan.run_dir, nodes.pool, nodes.forks, lost,
            timeout=TEARDOWN, kept=nodes.kept,
        )  # fmt: skip


class ForegroundRun(Supervised):
    """The attempts of one foreground job, run from here."""

    side: ControllerSide

    def __init__(
        self,
        plan: RunPlan,
        nodes: Nodes,
        run_dir: RunDir,
        limits: Limits,
        request: LaunchRequest,
        again: elastic.Check,
    ) -> None:
        err = ui.stderr()
        me = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "start_time": start_time(os.getpid()),
        }
        doc = status_doc(plan.run_id, time.time(), False, me, plan.world or 0)
        super().__init__(ControllerSide(plan, nodes, run_dir, err), limits, doc)
        self.rundir = run_dir
        self.nodes = nodes
        self.local = request.local_project is not None
        self.again = again  # the preflight (and sync), as before attempt 0
        # --nodes MIN:MAX: lost nodes may be left out
        self.min_nodes = request.settings.min_nodes.value
        # A traceback every rank raises is shown once (jobs/tracebacks.py).
        self.extra_files = dict(request.extra_files)  # every attempt's, with its own
        out = ui.stderr() if request.ranks_to_stderr else ui.stdout()
        self.folding = tracebacks.Folding(
            request.show or terminal(out, err), request.show_group or terminal_group(err)
        )
        self.show = self.folding

    @property
    def plan(self) -> RunPlan:
        return self.side.plan

    def files(self, plan: RunPlan) -> JobFiles:
        files = render_job_files(plan, self.nodes.connect, host_keys(plan, self.nodes))
        return {**files, **self.extra_files}

    def copy(self, plan: RunPlan, files: JobFiles) -> None:
        if not self.local or "secret.env" in files:  # the sweep took secret.env away
            copied = copy_files(plan, files, self.nodes, note=broadcast_note)
            if copied.record():  # where the large run files came from, by node
                self.rundir.record(**copied.record())

    def run(self, k: int, resume: str | None) -> Outcome:
        plan, nodes = self.plan, self.nodes
        head = functools.partial(nodes.kept.get, plan.head.name)  # its kept program
        with homecoming.brought_home(plan, self.rundir, nodes.pool, head):  # metrics.jsonl ...
            try:
                return super().run(k, resume)
            finally:
                self.folding.flush()  # the attempt's tracebacks, before its summary

    def prepare(self, k: int, resume: str | None) -> bool:
        plan = plan_for(self.plan, k, resume)
        files = self.files(plan)
        for name, (mode, text) in files.items():
            if name not in SECRET_FILES:
                self.rundir.write(name, text, mode)
        self.copy(plan, files)
        self.side.plan = plan
        return True

    def preflight(self) -> bool:
        for host in self.plan.hosts:  # a lost node: a fresh connection, if it answers
            if host.name in self.nodes.pool.lost([host]):
                self.nodes.pool.discard(host)
        try:  # a node failing it is left out while MIN remain: a new plan, fewer ranks
            _, plan = elastic.preflight_leaving_out(self.plan, self.min_nodes, self.again)
        except PreflightFailed as exc:
            self.side.say("error", f"error: {exc}")
            return False
        self.side.plan = plan
        return True

    def newest_checkpoint(self) -> str | None:
        return newest_complete(self.nodes.pool, self.plan.hosts, self.plan.run_dir, TEARDOWN)

    def recorded(self, history: Sequence[Attempt]) -> None:
        super().recorded(history)
        self.rundir.record(attempts=[a.to_json() for a in history])


def find_complete(pool: ConnectionPool, hosts: list[Host], run_dir: str, timeout: float) -> Found:
    """The newest checkpoint every node of ``hosts`` holds whole (node/checkpoints.py's
    judgement), each node read through its connection (the ``jobctl`` program's ``list``
    and ``read``, bounded); a host that cannot be read has none."""
    results = run_on_hosts(
        hosts, lambda conn: read_host(conn, run_dir, timeout), forks=max(1, len(hosts)), pool=pool
    )
    told = []
    for result in results:
        if result.ok and result.value is not None:
            told.append(result.value)
        else:
            told.append(HostCheckpoints(result.host.name, reasons=[f"not read: {result.error}"]))
    return choose(told, run_dir)


def newest_complete(
    pool: ConnectionPool, hosts: list[Host], run_dir: str, timeout: float
) -> str | None:
    """The absolute path (on the nodes) of :func:`find_complete`'s checkpoint, or None;
    what was ignored or incomplete is said (stderr)."""
    found = find_complete(pool, hosts, run_dir, timeout)
    for host, why in found.reasons:
        ui.detail(0, host, why)
    return found.path


def read_host(conn: Connector, run_dir: str, timeout: float) -> HostCheckpoints:
    """One host's listing and the tail of its checkpoints.jsonl (two bounded calls)."""
    listing = runfiles.list_files(conn, run_dir, timeout=timeout)
    files = None if listing is None else [[f.name, f.size, f.mtime] for f in listing]
    size = next((f.size for f in listing or () if f.name == RECORDS), 0)
    tail = None
    if size:
        data, _, _ = runfiles.read(conn, run_dir, RECORDS, max(0, size - TAIL), TAIL, timeout)
        tail = (data or b"").decode("utf-8", errors="replace")
    return host_of(conn.host.name, run_dir, files, tail)


def host_keys(plan: RunPlan, nodes: Nodes) -> dict[str, str]:
    """The key each node's connection verified (they are open since preflight)."""
    keys = {h.name: nodes.pool.get(h).host_key() for h in plan.hosts}
    return {name: key for name, key in keys.items() if key}


def terminal(out: Console, err: Console) -> LineSink:
    """Each line onto the terminal, labelled (coloured on a TTY)."""

    def show(stream: str, rank: int | None, host: str, text: str) -> None:
        if rank is None:  # the launcher's own words
            err.print(f"[dim]\\[mpirun][/] {escape(text)}")
            return
        colour = COLOURS[rank % len(COLOURS)]
        console = out if stream == "out" else err
        console.print(f"[{colour}]\\[rank {rank} {escape(host)}][/] {escape(text)}")

    return show


def terminal_group(err: Console) -> GroupSink:
    """One traceback that several ranks raised, each line labelled with all of them:
    ``[ranks 0-3 node0]`` (``[ranks 0-15 4 nodes]`` over more than two nodes)."""

    def show(ranks: Sequence[int], hosts: Sequence[str], lines: Sequence[str]) -> None:
        where = ",".join(hosts) if len(hosts) <= 2 else f"{len(hosts)} nodes"
        colour = COLOURS[ranks[0] % len(COLOURS)]
        label = f"[{colour}]\\[ranks {tracebacks.ranks_text(ranks)} {escape(where)}][/]"
        for text in lines:
            err.print(f"{label} {escape(text)}")

    return show


def supervise(run: ForegroundRun, inventory: str | None) -> tuple[Outcome, list[Attempt]]:
    """The run recorded, its attempts supervised, its end recorded in run.json."""
    run.rundir.record_start(run.plan, detached=False, inventory=inventory)
    outcome, history = run.supervise()
    run.rundir.record(
        exit_code=outcome.exit_code,
        reason=outcome.reason,
        seconds=round(outcome.seconds, 3),
        launcher_exit=outcome.launcher_exit,
        first_failure=outcome.first_failure.__dict__ if outcome.first_failure else None,
        swept=outcome.swept,
        left=outcome.left,
    )
    return outcome, history
