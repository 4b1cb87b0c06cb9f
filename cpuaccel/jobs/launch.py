"""One job of ``cpuaccel run``, from settled settings to its end.

The line a value follows, e.g. ``--ppn 4``:

1. ``cli/run.py`` parses the flags (and prints); nothing else happens there;
2. ``config.effective.resolve`` settles them into ``LaunchSettings`` (flag, else project
   file, else inventory, else default; each value with its source), with the chosen
   hosts, head first: ``settings.ppn.value == 4``;
3. ``launch.plan.build_plan(settings, script, facts)`` decides the ``RunPlan``:
   ``plan.ppn == 4``, the world size, threads per rank;
4. ``RunPlan.command()`` is the mpirun argv (``jobs/launchers.py``: ``-ppn 4``),
   rendered into the run's launch.sh (``jobs/rundir.py``);
5. here: every node is checked (and synced when stale), the files are copied to the
   nodes, launch.sh starts on the head node (``jobs/supervise.py`` watches it), and
   the run's record and summary are written.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from pathlib import Path

from cpuaccel import ui
from cpuaccel.config.settings import LaunchSettings
from cpuaccel.connectors.connect_options import ConnectOptions
from cpuaccel.errors import EXIT_NODE_FAILED, CpuaccelError
from cpuaccel.executor import ConnectionPool
from cpuaccel.facts.gather import Facts
from cpuaccel.facts.problems import ERROR, Problem
from cpuaccel.inventory.host import Host
from cpuaccel.jobs import attempts, detached, elastic
from cpuaccel.jobs import connections as nodes_
from cpuaccel.jobs.connections import JobFiles, Nodes
from cpuaccel.jobs.elastic import PreflightFailed
from cpuaccel.jobs.launcher_reach import LauncherReach
from cpuaccel.jobs.plan import RunPlan, Script, build_plan, new_run_id
from cpuaccel.jobs.preflight import run_preflight
from cpuaccel.jobs.result import PREFLIGHT, JobReport
from cpuaccel.jobs.resume import newest_complete
from cpuaccel.jobs.rundir import SECRET_FILES, HostKeys, RunDir, render_job_files
from cpuaccel.jobs.supervise import Job, Outcome, OutputRouter, end_status, foreground_status
from cpuaccel.node.supervisor import mark_ended
from cpuaccel.runs import homecoming as results
from cpuaccel.runs.fanout import TEARDOWN
from cpuaccel.sync.engine import SyncOptions, sync
from cpuaccel.sync.manifest import SourceManifest, build
from cpuaccel.ui import escape


def _local_project(settings: LaunchSettings, project: Path) -> str | None:
    """The project folder, when every chosen host is this machine: used where it is."""
    return str(project) if all(h.is_local for h in settings.chosen) else None


def dry_run(
    settings: LaunchSettings, script: Script, project: Path, connect: ConnectOptions, run_id: str
) -> tuple[RunPlan, JobFiles]:
    """The plan and files of a run, without the facts: no node is contacted."""
    plan = build_plan(settings, script, None, run_id, _local_project(settings, project))
    return plan, render_job_files(plan, connect, ssh_files=False)


def launch(
    settings: LaunchSettings,
    script: Script,
    project: Path,
    *,
    connect: ConnectOptions,
    forks: int,
    allow_sync: bool,
    timeout: float | None,
    ranks_to_stderr: bool = False,
    detach: bool = False,
    inventory: str | None = None,
    run_id: str | None = None,
) -> JobReport:
    """Preflight (and sync), copy, launch and supervise the job; how it ended.

    ``ranks_to_stderr`` (run --json): the ranks' stdout goes to stderr too, labelled,
    leaving stdout to the one JSON object. ``detach`` (run --detach): a supervisor on
    the head watches the job; this returns once it has started (jobs/detached.py).
    ``inventory``: the inventory file (absolute), kept in run.json for later verbs.
    ``run_id``: given from outside (jobs/given_id.py), else a new one."""
    started = time.monotonic()
    run_id = run_id or new_run_id()
    local = _local_project(settings, project)
    with ConnectionPool(connect) as pool, Nodes(connect, forks, pool) as nodes:
        draft = build_plan(settings, script, None, run_id, local_project=local)

        def check(draft: RunPlan) -> dict[str, Facts]:
            return _preflight_and_sync(settings, draft, allow_sync, local is not None, nodes)

        try:  # --nodes MIN:MAX: failing nodes left out while MIN remain (jobs/elastic.py)
            facts, draft = elastic.preflight_leaving_out(draft, settings.min_nodes.value, check)
        except PreflightFailed as exc:
            ui.stderr().print(f"[red]error:[/] {escape(str(exc))}")
            seconds = time.monotonic() - started
            report = JobReport.of_plan(draft, EXIT_NODE_FAILED, PREFLIGHT, seconds)
            report.error = str(exc)
            return report
        settings = elastic.settings_on(settings, draft.hosts)
        plan = build_plan(settings, script, facts, run_id, local_project=local)
        if plan.precision_note:
            ui.stderr().print(escape(plan.precision_note))
        plan = attempts.plan_for(plan, 0, None)  # a detached run's restarts: its supervisor's
        if detach:
            limits = (timeout, settings.max_restarts.value, settings.restart_delay.value)
            return _detach(plan, project, local is not None, limits, nodes, inventory, started)
        job = _Foreground(plan, nodes, local is not None, check)
        job.min_nodes = settings.min_nodes.value
        job.timeout, job.out = timeout, ui.stderr() if ranks_to_stderr else ui.stdout()
        outcome, folder, history = _run(job, project, inventory, settings)
    plan = job.plan  # the last attempt's: fewer nodes when some were left out
    report = JobReport.of_plan(plan, outcome.exit_code, outcome.reason, time.monotonic() - started)
    report.add_outcome(outcome, folder)
    report.attempts = [a.to_json() for a in history]
    return report


def _detach(
    plan: RunPlan,
    project: Path,
    local: bool,
    limits: tuple[float | None, int, float],  # --timeout, --max-restarts, --restart-delay
    nodes: Nodes,
    inventory: str | None,
    started: float,
) -> JobReport:
    """Copy the run's files with the supervisor's, start it on the head, and return.
    secret.env stays for the ranks to read; the supervisor's sweep removes it from every
    node when the job ends (as a foreground run's sweep does), or `cpuaccel stop`'s."""
    files = render_job_files(plan, nodes.connect, _host_keys(plan.hosts, nodes.pool))
    files.update(detached.supervisor_files(plan, *limits))
    run_dir = RunDir.create(project / "runs", plan, files)
    if not local or "secret.env" in files:
        nodes_.copy_files(plan, files, nodes)
    try:
        supervisor = detached.start(plan, nodes.pool.get(plan.head), run_dir, inventory)
    except CpuaccelError:
        if "secret.env" in files:  # no job started: take the secrets back off the nodes
            nodes_.forget_secrets(plan, plan.hosts, nodes)
        raise
    report = JobReport.of_plan(plan, 0, "detached", time.monotonic() - started)
    report.folder = str(run_dir.path)
    report.ranks = {rank: None for rank in range(plan.world or 0)}
    report.detached = {
        "state": "running",
        "head": plan.head.name,
        "head_run_dir": plan.run_dir,
        "supervisor": supervisor,
    }
    return report


def _host_keys(hosts: list[Host], pool: ConnectionPool) -> HostKeys:
    """The key each node's connection verified (they are open since preflight)."""
    keys = {h.name: pool.get(h).host_key() for h in hosts}
    return {name: key for name, key in keys.items() if key}


class _Foreground:
    """The job's attempts, run from here (jobs/attempts.py decides when to restart)."""

    def __init__(self, plan: RunPlan, nodes: Nodes, local: bool, again: elastic.Check):
        self.plan, self.nodes, self.local = plan, nodes, local  # plan: attempt 0's
        self.again = again  # the preflight (and sync), as before attempt 0
        self.min_nodes: int | None = None  # --nodes MIN:MAX: lost nodes may be left out
        self.hosts = [h.name for h in plan.hosts]
        self.run_dir = RunDir(Path())  # _run creates it
        self.timeout: float | None = None
        self.out = ui.stdout()

    def files(self, plan: RunPlan) -> JobFiles:
        return render_job_files(plan, self.nodes.connect, _host_keys(plan.hosts, self.nodes.pool))

    def copy(self, plan: RunPlan, files: JobFiles) -> None:
        if not self.local or "secret.env" in files:  # the sweep took secret.env away
            nodes_.copy_files(plan, files, self.nodes)

    def run(self, k: int, resume: str | None) -> Outcome:
        plan = self.plan
        if k:  # the files again, with CPUACCEL_RESTART and CPUACCEL_RESUME
            plan = attempts.plan_for(self.plan, k, resume)
            files = self.files(plan)
            for name, (mode, text) in files.items():
                if name not in SECRET_FILES:
                    self.run_dir.write(name, text, mode)
            self.copy(plan, files)
        router = OutputRouter(self.run_dir, self.out, ui.stderr())
        job = Job(plan, self.nodes.connect, self.run_dir, router, self.nodes.forks, self.nodes.pool)
        job.kept = self.nodes.kept  # the sweep's requests on the preflight's channels
        head = functools.partial(self.nodes.kept.get, plan.head.name)  # its kept program
        with results.brought_home(plan, self.run_dir, self.nodes.pool, head):  # metrics.jsonl ...
            return job.run(self.timeout)

    def preflight(self) -> bool:
        for host in self.plan.hosts:  # a lost node: a fresh connection, if it answers
            if host.name in self.nodes.pool.lost([host]):
                self.nodes.pool.discard(host)
        try:  # a node failing it is left out while MIN remain: a new plan, fewer ranks
            _, plan = elastic.preflight_leaving_out(self.plan, self.min_nodes, self.again)
        except PreflightFailed as exc:
            ui.stderr().print(f"[red]error:[/] {escape(str(exc))}")
            return False
        self.plan, self.hosts = plan, [h.name for h in plan.hosts]
        return True

    def newest_checkpoint(self) -> str | None:
        return newest_complete(self.nodes.pool, self.plan.hosts, self.plan.run_dir, TEARDOWN)


def _run(
    job: _Foreground, project: Path, inventory: str | None, settings: LaunchSettings
) -> tuple[Outcome, str, list[attempts.Attempt]]:
    """Render and copy the files, run the attempts, keep the record, print the summary."""
    plan = job.plan
    files = job.files(plan)
    job.run_dir = run_dir = RunDir.create(project / "runs", plan, files)
    try:
        job.copy(plan, files)
        log = attempts.AttemptLog(run_dir, plan.world or 0, settings.max_restarts.value > 0)
        restarts = attempts.Settings(
            settings.max_restarts.value, settings.restart_delay.value, ui.stderr()
        )
        outcome = _supervise(
            plan, run_dir, inventory, lambda: attempts.run_attempts(job, log, restarts)
        )
        _summary(job.plan, outcome, run_dir, log.history)  # the last attempt's nodes
        return outcome, str(run_dir.path), log.history
    finally:
        run_dir.forget_secrets()  # a run on this machine: the nodes' folder is this one


def _supervise(
    plan: RunPlan,
    run_dir: RunDir,
    inventory: str | None,
    run: Callable[[], Outcome],
) -> Outcome:
    """Start the job, watch it to its end (attempt after attempt), and keep its record."""
    run_dir.record_start(plan, detached=False, inventory=inventory)
    status = foreground_status(plan, run_dir)
    try:
        outcome = run()
    except BaseException:  # no outcome (the head refused the launch): not "running" forever
        mark_ended(str(run_dir.path), "failed", "error")
        raise
    end_status(status, run_dir, outcome)
    run_dir.record(
        exit_code=outcome.exit_code,
        reason=outcome.reason,
        seconds=round(outcome.seconds, 3),
        launcher_exit=outcome.launcher_exit,
        first_failure=outcome.first_failure.__dict__ if outcome.first_failure else None,
        swept=outcome.swept,
        left=outcome.left,
    )
    return outcome


def _preflight_and_sync(
    settings: LaunchSettings,
    draft: RunPlan,
    allow_sync: bool,
    local: bool,
    nodes: Nodes,
) -> dict[str, Facts]:
    """Check every node; sync a stale project (or refuse with --no-sync). Returns facts.
    The project file's sync excludes, as `cpuaccel sync` uses them: the same manifest."""
    source = build([str(Path.cwd())], excludes=settings.exclude.value)
    nodes.kept.close()  # an earlier pass's (a restart's, --nodes MIN:MAX's): new ones come
    try:
        return _checked(settings, draft, allow_sync, local, nodes, source)
    except BaseException:  # no job starts: EOF ends every kept program, nothing written
        nodes.kept.close()
        raise


def _checked(
    settings: LaunchSettings,
    draft: RunPlan,
    allow_sync: bool,
    local: bool,
    nodes: Nodes,
    source: SourceManifest,
) -> dict[str, Facts]:
    launcher = settings.launcher.value
    reach = LauncherReach(draft, nodes.connect, nodes.pool, keep_masters=True)
    with ui.progress("preflight", len(draft.hosts)) as bar:  # one step a host
        found = run_preflight(
            draft.hosts,
            draft.project_dir,
            source,
            master_port=settings.master_port.value,
            forks=nodes.forks,
            connect=nodes.connect,
            launcher_flavour=None if launcher in ("auto", "slurm") else launcher,
            check_project=not local,
            pool=nodes.pool,
            reach=reach,
            on_host=bar.advance,
            kept=nodes.kept,
        )
        reached = reach.problems()
    problems = list(found.errors) + reached
    if found.stale and not allow_sync:
        problems += [
            Problem(
                ERROR,
                name,
                f"holds a different copy of the project at {draft.project_dir}",
                hint="run cpuaccel sync, or leave out --no-sync",
            )
            for name in found.stale
        ]
    if problems:
        reach.end_masters()
        _print_problems(problems)
        raise PreflightFailed(
            f"{len(problems)} problem(s) found before launch; no job was started", problems
        )
    source.save_cache()  # the nodes passed: keep the hashes for the next run
    if found.stale:
        _sync_stale(draft, [h for h in draft.hosts if h.name in found.stale], source, nodes)
    return found.facts


def _sync_stale(draft: RunPlan, stale: list[Host], source: SourceManifest, nodes: Nodes) -> None:
    names = escape(", ".join(h.name for h in stale))
    ui.stderr().print(f"project differs on {names}: syncing it first")
    results = sync(
        stale,
        source,
        SyncOptions(draft.project_dir),
        forks=nodes.forks,
        connect=nodes.connect,
        pool=nodes.pool,
    )
    failed = [r for r in results if not r.ok]
    if failed:
        raise PreflightFailed("; ".join(f"sync to {r.host.name} failed: {r.error}" for r in failed))


def _print_problems(problems: list[Problem]) -> None:
    err = ui.stderr()
    for p in problems:
        err.print(f"[red]preflight[/] {escape(p.host or '-')}: {escape(p.message)}")
        if p.hint:
            err.print(f"          [dim]fix: {escape(p.hint)}[/]")


def _summary(
    plan: RunPlan, outcome: Outcome, run_dir: RunDir, history: list[attempts.Attempt]
) -> None:
    err = ui.stderr()
    if len(history) > 1:  # the restarts, one line each
        for a in history:
            start = f" from {escape(a.resume)}" if a.resume else ""
            err.print(f"attempt {a.attempt}{start}: {escape(a.why())}, {a.ended - a.started:.1f} s")
    colour = "green" if outcome.exit_code == 0 else "red"
    detail = ""
    if outcome.first_failure is not None:
        f = outcome.first_failure
        detail = f"; first failing rank {f.rank} on {escape(f.host)} (exit code {f.code})"
    err.print(
        f"[{colour}]{outcome.reason}[/]: {plan.world} rank(s) on {len(plan.hosts)} node(s), "
        f"{outcome.seconds:.1f} s, exit code {outcome.exit_code}{detail}"
    )
    if outcome.swept:
        ended = ", ".join(f"{host} ({len(p)})" for host, p in outcome.swept.items())
        err.print(f"ended leftover processes of the job on: {escape(ended)}")
    for host, procs in outcome.left.items():
        err.print(f"[red]still running on {escape(host)}[/]: {escape(str(procs))}")
    err.print(f"run directory: {escape(str(run_dir.path))}")
