"""One job of ``cpuaccel run``, from settled settings to its end.

The line a value follows, e.g. ``--ppn 4``:

1. ``cli/run.py`` parses the flags (and prints); nothing else happens there;
2. ``config.effective.resolve`` settles them into ``LaunchSettings`` (flag, else project
   file, else inventory, else default; each value with its source), with the chosen
   hosts, head first: ``settings.ppn.value == 4``;
3. ``jobs.plan.build_plan(settings, script, facts)`` decides the ``RunPlan``:
   ``plan.ppn == 4``, the world size, threads per rank;
4. ``RunPlan.command()`` is the mpirun argv (``jobs/launchers.py``: ``-ppn 4``),
   rendered into the run's launch.sh (``jobs/rundir.py``);
5. here: every node is checked (and synced when stale), the files are copied to the
   nodes, and the supervisor (``node/supervisor.py``) starts launch.sh on the head node
   and watches it, from here (jobs/foreground.py) or, detached, from the head
   (node/detached.py); the run's record and summary are written.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

from cpuaccel import node, ui
from cpuaccel.config.settings import LaunchSettings
from cpuaccel.connectors import programs
from cpuaccel.connectors.base import Connector
from cpuaccel.errors import EXIT_NODE_FAILED, CpuaccelError
from cpuaccel.executor import ConnectionPool, in_one_step
from cpuaccel.facts.gather import Facts
from cpuaccel.facts.problems import ERROR, Problem
from cpuaccel.inventory.host import Host
from cpuaccel.jobs import elastic, master_port
from cpuaccel.jobs.connections import (
    JobFiles,
    Nodes,
    broadcast_note,
    copy_files,
    forget_secrets,
)
from cpuaccel.jobs.elastic import PreflightFailed
from cpuaccel.jobs.foreground import ForegroundRun, host_keys, plan_for, supervise
from cpuaccel.jobs.launcher_reach import LauncherReach
from cpuaccel.jobs.plan import (
    RunPlan,
    build_plan,
    job_network,
    network_wanted,
)
from cpuaccel.jobs.preflight import Checks, run_preflight
from cpuaccel.jobs.request import LaunchRequest
from cpuaccel.jobs.result import PREFLIGHT, JobReport
from cpuaccel.jobs.rundir import (
    EXECUTABLE,
    PLAIN,
    RunDir,
    render_hostfile,
    render_job_files,
    render_launch,
)
from cpuaccel.network.choice import JobNetwork
from cpuaccel.node.supervisor import Attempt, Limits, Outcome
from cpuaccel.projectsync.engine import SyncOptions, sync
from cpuaccel.projectsync.manifest import SourceManifest, build
from cpuaccel.ui import escape


def dry_run(request: LaunchRequest) -> tuple[RunPlan, JobFiles, dict[str, str]]:
    """The plan and files of a run, without the facts: no node is contacted; and what
    each node's address on the job's network will be, in words."""
    settings = request.settings
    plan = build_plan(settings, request.script, None, request.run_id, request.local_project)
    files = render_job_files(plan, request.connect, ssh_files=False)
    return plan, files, network_wanted(settings, plan.hosts)


def launch(request: LaunchRequest) -> JobReport:
    """Preflight (and sync), copy, launch and supervise the job; how it ended. A
    detached one (``request.detach``) returns once its supervisor has started."""
    started = time.monotonic()
    run_id, script, project = request.run_id, request.script, request.project
    local = request.local_project
    # A foreground run on this machine alone holds a free port of its own for the whole
    # run (restarts included); a detached one ends this call, and keeps the given port.
    own_port = (
        contextlib.nullcontext(request.settings)
        if request.detach
        else master_port.held_for(request.settings)
    )
    with (
        own_port as settings,
        ConnectionPool(request.connect) as pool,
        Nodes(request.connect, request.forks, pool) as nodes,
    ):
        draft = build_plan(settings, script, None, run_id, local_project=local)

        def check(draft: RunPlan) -> dict[str, Facts]:
            return _preflight_and_sync(settings, draft, request, nodes)

        min_nodes = settings.min_nodes.value
        try:  # --nodes MIN:MAX: failing nodes left out while MIN remain (jobs/elastic.py)
            facts, draft = elastic.preflight_leaving_out(draft, min_nodes, check)
        except PreflightFailed as exc:
            ui.stderr().print(f"[red]error:[/] {escape(str(exc))}")
            seconds = time.monotonic() - started
            report = JobReport.of_plan(draft, EXIT_NODE_FAILED, PREFLIGHT, seconds)
            report.error = str(exc)
            report.problems = [_problem_line(p) for p in exc.problems]
            return report
        settings = elastic.settings_on(settings, draft.hosts)
        plan = build_plan(settings, script, facts, run_id, local_project=local)
        if plan.precision_note:
            ui.stderr().print(escape(plan.precision_note))
        plan = plan_for(plan, 0, None)
        limits = Limits(
            timeout=request.timeout,
            hang_timeout=plan.hang_timeout,
            rendezvous_timeout=plan.rendezvous_timeout,
            max_restarts=settings.max_restarts.value,
            restart_delay=settings.restart_delay.value,
            ppn=plan.ppn,
        )
        if request.detach:
            return _detach(request, plan, limits, nodes, started)
        files = {
            **render_job_files(plan, nodes.connect, host_keys(plan, nodes)),
            **request.extra_files,
        }
        run_dir = RunDir.create(project / "runs", plan, files)
        run = ForegroundRun(plan, nodes, run_dir, limits, request, check)
        try:
            run.copy(plan, files)
            outcome, history = supervise(run, request.inventory)
            _summary(run.plan, outcome, run_dir, history)  # the last attempt's nodes
            if request.collect is not None:
                request.collect(run.plan, nodes)
        finally:
            run_dir.forget_secrets()  # a run on this machine: the nodes' folder is this one
    plan = run.plan  # the last attempt's: fewer nodes when some were left out
    report = JobReport.of_plan(plan, outcome.exit_code, outcome.reason, time.monotonic() - started)
    report.add_outcome(outcome, str(run_dir.path))
    report.attempts = [a.to_json() for a in history]
    return report


def _detach(
    request: LaunchRequest, plan: RunPlan, limits: Limits, nodes: Nodes, started: float
) -> JobReport:
    """Copy the run's files with the supervisor's, start it on the head, and return.
    secret.env stays for the ranks to read; the supervisor's sweep removes it from every
    node when the job ends (as a foreground run's sweep does), or `cpuaccel stop`'s."""
    files = render_job_files(plan, nodes.connect, host_keys(plan, nodes))
    files.update(request.extra_files)
    files.update(supervisor_files(plan, limits, request.settings.min_nodes.value))
    run_dir = RunDir.create(request.project / "runs", plan, files)
    if request.local_project is None or "secret.env" in files:
        copied = copy_files(plan, files, nodes, note=broadcast_note)
        if copied.record():  # where the large run files came from, by node
            run_dir.record(**copied.record())
    head = nodes.pool.get(plan.head)
    try:
        supervisor = _start_supervisor(plan, head, run_dir, request.inventory)
    except CpuaccelError:
        if "secret.env" in files:  # no job started: take the secrets back off the nodes
            forget_secrets(plan, plan.hosts, nodes)
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


def supervisor_files(plan: RunPlan, limits: Limits, min_nodes: int | None) -> JobFiles:
    """The supervisor's program and settings, copied with the run's other files (to every
    node: the others run its ``end`` through ssh.sh when the job ends, and its ``ready``
    and ``attempt`` between two attempts). With --nodes MIN:MAX, launch.sh for each
    smaller count of nodes and each node's hostfile line: the head leaves out a node
    that does not answer by rewriting the hostfile and starting the launch.sh of the
    count that remains (node/detached.py)."""
    config: dict[str, Any] = {
        "run_id": plan.run_id,
        "head": plan.head.name,
        "world": plan.world or 0,
        "timeout": limits.timeout,
        "python": plan.head.python,  # the other nodes' guards call it on the head
        "nodes": {h.name: h.python for h in plan.hosts[1:]},  # swept through ssh.sh
        "hang_timeout": limits.hang_timeout,
        "rendezvous_timeout": limits.rendezvous_timeout,
        "hosts": [h.name for h in plan.hosts],
        "ppn": plan.ppn,
        "max_restarts": limits.max_restarts,
        "restart_delay": limits.restart_delay,
    }
    files: JobFiles = {"supervisor.py": (EXECUTABLE, node.program("detached").decode())}
    if min_nodes is not None and min_nodes < len(plan.hosts):
        config["min_nodes"] = min_nodes
        config["hostfile_lines"] = {
            h.name: render_hostfile(elastic.plan_on(plan, [h])) for h in plan.hosts
        }
        config["launch_files"] = {}
        for count in range(max(1, min_nodes), len(plan.hosts)):
            name = f"launch-{count}.sh"
            files[name] = (EXECUTABLE, render_launch(elastic.plan_on(plan, plan.hosts[:count])))
            config["launch_files"][str(count)] = name
    files["supervisor.json"] = (PLAIN, json.dumps(config, indent=2) + "\n")
    return files


def _start_supervisor(
    plan: RunPlan, head: Connector, run_dir: RunDir, inventory: str | None
) -> dict[str, Any]:
    """Start the supervisor on the head; record the detached run in run.json. Returns
    the supervisor's {"host", "pid", "start_time"}."""
    run_dir.record_start(plan, detached=True, inventory=inventory)
    found = programs.call(
        head, "detached", ["start", plan.run_dir], what="starting the run's supervisor"
    )
    supervisor = {"host": plan.head.name, "pid": found["pid"], "start_time": found["start_time"]}
    run_dir.record(supervisor=supervisor)
    return supervisor


def inventory_path(setting_value: str | None) -> str | None:
    """The inventory file as an absolute path, for later verbs (None for a host list)."""
    if not setting_value or "," in setting_value or not Path(setting_value).is_file():
        return None
    return str(Path(setting_value).resolve())


def _preflight_and_sync(
    settings: LaunchSettings, draft: RunPlan, request: LaunchRequest, nodes: Nodes
) -> dict[str, Facts]:
    """Check every node; sync a stale project (or refuse with --no-sync). Returns facts.
    The project file's sync excludes, as `cpuaccel sync` uses them: the same manifest."""
    source = build([str(request.project)], excludes=settings.exclude.value)
    nodes.kept.close()  # an earlier pass's (a restart's, --nodes MIN:MAX's): new ones come
    try:
        return _checked(settings, draft, request, nodes, source)
    except BaseException:  # no job starts: EOF ends every kept program, nothing written
        nodes.kept.close()
        raise


def _checked(
    settings: LaunchSettings,
    draft: RunPlan,
    request: LaunchRequest,
    nodes: Nodes,
    source: SourceManifest,
) -> dict[str, Facts]:
    launcher = settings.launcher.value
    reach = LauncherReach(draft, nodes.connect, nodes.pool, keep_masters=True)
    with ui.progress("preflight", len(draft.hosts)) as bar:  # one step a host
        checks = Checks(
            master_port=settings.master_port.value,
            launcher_flavour=None if launcher in ("auto", "slurm") else launcher,
            check_project=request.local_project is None,
            network=lambda facts: job_network(settings, draft.hosts, facts),
            runs=request.project / "runs",
        )
        found = run_preflight(
            draft.hosts,
            draft.project_dir,
            source,
            nodes,
            checks,
            reach=reach,
            on_host=bar.advance,
        )
    for host, line in found.swept:  # said whether this run starts or not: it was done
        ui.stderr().print(escape(f"{host}: {line}"), highlight=False)
    problems = list(found.errors)
    # Every node answered alike: try the connections the job will make. A fault of the
    # network (found there, or in choosing it) is the cause the launcher's ssh check
    # would only time out on: that check is not waited for.
    network = found.network
    faults = network.errors if network is not None else []
    if not problems:
        faults = _network_doctor(settings, draft, network, nodes)
        problems += faults
    if faults:
        reach.leave()
    else:
        problems += reach.problems()
    if request.require is not None:  # the caller's checks, of the nodes that answered
        problems += [p for p in request.require(found.facts) if p.severity == ERROR]
    if found.stale and not request.allow_sync:
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
    for note in found.notes:  # what cpuaccel did about the network, once a run
        where = f" {note.host}" if note.host else ""
        ui.stderr().print(f"[dim]note{escape(where)}: {escape(note.message)}[/]")
    source.save_cache()  # the nodes passed: keep the hashes for the next run
    if found.stale:
        _sync_stale(draft, [h for h in draft.hosts if h.name in found.stale], source, nodes)
    return found.facts


def _network_doctor(
    settings: LaunchSettings, draft: RunPlan, network: JobNetwork | None, nodes: Nodes
) -> list[Problem]:
    """The network doctor's errors for the job's own connections (each node to the
    head's master port, each to the next node), over the addresses the job will use.
    Nothing to try on one node, this machine alone, or an allocation's nodes (reached
    through srun, not ssh)."""
    if network is None or not network.complete or in_one_step(draft.hosts):
        return []
    from cpuaccel.network import doctor  # only for several nodes: off run's start-up

    found = doctor.diagnose_job(
        draft.hosts,
        network,
        master_port=settings.master_port.value,
        connect=nodes.connect,
        forks=nodes.forks,
        pool=nodes.pool,
    )
    return [p for p in found.problems if p.severity == ERROR]


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


def _summary(plan: RunPlan, outcome: Outcome, run_dir: RunDir, history: list[Attempt]) -> None:
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
        if f.cause:  # what torch's @record wrote, as torchrun's ChildFailedError shows it
            detail += f"; root cause: {escape(f.cause)}"
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


def _problem_line(problem: Problem) -> str:
    fix = f" (fix: {problem.hint})" if problem.hint else ""
    return f"{problem.host or '-'}: {problem.message}{fix}"
