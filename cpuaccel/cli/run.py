"""``cpuaccel run``: preflight every node, render the job, launch it with MPI, end it cleanly."""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path

import click
from rich.markup import escape

from cpuaccel import ui
from cpuaccel.cli.options import Target, host_options
from cpuaccel.config.effective import order_hosts, resolve, run_env
from cpuaccel.connectors import programs
from cpuaccel.connectors.base import Connector
from cpuaccel.errors import EXIT_USAGE, CpuaccelError, UsageError
from cpuaccel.executor import ConnectionPool, run_on_hosts
from cpuaccel.facts.gather import Facts
from cpuaccel.facts.problems import ERROR, Problem
from cpuaccel.inventory.host import Host
from cpuaccel.launch.plan import RunPlan, RunRequest, build_plan, choose_hosts, new_run_id
from cpuaccel.launch.preflight import run_preflight
from cpuaccel.launch.rundir import RunDir, render_job_files
from cpuaccel.launch.supervise import Job, Outcome, OutputRouter
from cpuaccel.sync.engine import SyncOptions, sync
from cpuaccel.sync.manifest import build


class PreflightFailed(CpuaccelError):
    """A node is not ready; the problems were printed one per line."""


EPILOG = """\b
Examples:
  cpuaccel run --nodes 1 --ppn 2 examples/train.py        # this machine, 2 ranks
  cpuaccel run -i inventory.yaml --nodes 4 --ppn 4 train.py --epochs 3
  cpuaccel run -i inventory.yaml --dry-run train.py       # print hostfile, env, command
  cpuaccel run -i inventory.yaml --env FI_PROVIDER=tcp --timeout 3600 train.py
  cpuaccel run --config default_config.yaml train.py      # Accelerate's config + hostfile

\b
Defaults come from ./cpuaccel.yaml (or --config FILE, which may be Accelerate's
default_config.yaml); flags override it. `cpuaccel config show` prints each setting
and where it came from.

\b
Everything after SCRIPT goes to the script untouched. Before launching, every node is
checked (reachable, same Python/torch/cpuaccel, names resolve, project in sync: synced
now unless --no-sync, master port free). Output of each rank is labelled and logged in
runs/<id>/. Ctrl-C, SIGTERM, --timeout or a failing rank end the job on every node.

\b
Exit codes: the first failing rank's exit code, 0 if all ranks succeeded; 2 bad input or
a node failed preflight; 124 --timeout; 130 interrupted; 143 terminated.
"""


def _parse_env(items: tuple[str, ...]) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.isidentifier():
            raise UsageError(
                f"--env {item!r}: expected KEY=VALUE", hint="e.g. --env FI_PROVIDER=tcp"
            )
        env[key] = value
    return env


def _script_in_project(script: str, project: Path) -> str:
    path = Path(script).resolve()
    if not path.is_file():
        raise UsageError(f"{script}: no such script", hint="check the path to your training script")
    try:
        return path.relative_to(project).as_posix()
    except ValueError:
        raise UsageError(
            f"{script} is outside the project folder {project}",
            hint="run cpuaccel from the folder that holds your script (it is what gets synced)",
        ) from None


def _print_dry_run(plan: RunPlan, files: dict[str, tuple[int, str]]) -> None:
    out = ui.stdout()
    unknown = plan.ppn is None
    out.print(f"# run {plan.run_id} (dry run: no node was contacted)")
    if unknown:
        out.print("# ppn and threads come from the nodes' facts: pass --ppn to fix them here")
    for name in ("hostfile", "env.sh"):
        out.print(f"\n## {name}\n{escape(files[name][1].rstrip())}")
    if "secret.env" in files:
        out.print(f"\n## secret.env (mode 0600): {', '.join(plan.secret_env)} (values hidden)")
    out.print(
        f"\n## command (on {plan.head.name}, from launch.sh)\n{escape(shlex.join(plan.command()))}"
    )


def _copy_files(
    target: Target, plan: RunPlan, files: dict[str, tuple[int, str]], pool: ConnectionPool
) -> None:
    payload = json.dumps(files).encode()

    def write(conn: Connector) -> dict[str, object]:
        return programs.call(
            conn, "jobs", ["write", plan.run_dir], payload, what="writing the run's files"
        )

    failed = [r for r in run_on_hosts(plan.hosts, write, forks=target.forks, pool=pool) if not r.ok]
    if failed:
        raise UsageError(
            "; ".join(f"{r.host.name}: {r.error}" for r in failed),
            hint="check free disk and permissions at cpuaccel_workdir",
        )


@click.command(
    epilog=EPILOG,
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@host_options
@click.option("--nodes", type=click.IntRange(1), help="How many hosts (default: all selected).")
@click.option("--ppn", type=click.IntRange(1), help="Ranks per node (default: sockets, or 1).")
# No click defaults below: a value that is None was not given, so the project file or
# the inventory may set it (cpuaccel.config.effective).
@click.option(
    "--launcher",
    type=click.Choice(["auto", "impi", "mpich", "openmpi"]),
    help="MPI launcher.  [default: auto]",
)
@click.option(
    "--master-port", type=click.IntRange(1, 65535), help="Rendezvous port.  [default: 29500]"
)
@click.option(
    "--mixed-precision",
    type=click.Choice(["bf16", "no"]),
    help="Exported as ACCELERATE_MIXED_PRECISION / CPUACCEL_MIXED_PRECISION.",
)
@click.option("--env", "env_items", multiple=True, metavar="KEY=VALUE", help="Set in every rank.")
@click.option(
    "--sync/--no-sync", default=True, show_default=True, help="Sync a stale project first."
)
@click.option("--dry-run", is_flag=True, help="Print hostfile, env and command; contact no node.")
@click.option(
    "--timeout",
    "job_timeout",
    type=click.FloatRange(0.1),
    metavar="SECONDS",
    help="End the job after this long.",
)
@click.argument("script")
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
def run_command(
    target: Target,
    nodes: int | None,
    ppn: int | None,
    launcher: str | None,
    master_port: int | None,
    mixed_precision: str | None,
    env_items: tuple[str, ...],
    sync: bool,
    dry_run: bool,
    job_timeout: float | None,
    script: str,
    script_args: tuple[str, ...],
) -> None:
    """Launch SCRIPT with MPI across the nodes, the bundled runtime on every rank."""
    project = Path.cwd().resolve()
    flags = {
        "nodes": nodes,
        "ppn": ppn,
        "launcher": launcher,
        "master_port": master_port,
        "mixed_precision": mixed_precision,
        "env": _parse_env(env_items),
    }
    settings = resolve(flags, target.project, target.inventory, target.hosts, target.cli_vars)
    request = RunRequest(
        script=_script_in_project(script, project),
        args=script_args,
        nodes=settings["nodes"].value,
        ppn=int(settings["ppn"].value) if settings["ppn"].value is not None else None,
        launcher=str(settings["launcher"].value),
        master_port=int(settings["master_port"].value),
        env=run_env(settings),
        project_name=project.name,
    )
    chosen = choose_hosts(order_hosts(target.hosts, settings["head"]), request.nodes)
    run_id = new_run_id()
    if dry_run:
        local = str(project) if all(h.is_local for h in chosen) else None
        plan = build_plan(request, chosen, None, run_id, local_project=local)
        _print_dry_run(plan, render_job_files(plan, target.connect))
        return
    # One connection per node for every phase: preflight, sync, copy, launch, sweep.
    with ConnectionPool(target.connect) as pool:
        code = _launch(target, request, chosen, run_id, sync, job_timeout, pool)
    sys.exit(code)


def _preflight_and_sync(
    target: Target,
    request: RunRequest,
    draft: RunPlan,
    allow_sync: bool,
    local: bool,
    pool: ConnectionPool,
) -> dict[str, Facts]:
    """Check every node; sync a stale project (or refuse with --no-sync). Returns facts."""
    err = ui.stderr()
    # The project file's sync excludes, as `cpuaccel sync` uses them: the same manifest.
    excludes = (target.project.get("exclude") if target.project else None) or []
    source = build([str(Path.cwd())], excludes=excludes)
    with ui.progress("preflight", 1):
        found = run_preflight(
            draft.hosts,
            draft.project_dir,
            source,
            master_port=request.master_port,
            forks=target.forks,
            connect=target.connect,
            launcher_flavour=None if request.launcher == "auto" else request.launcher,
            check_project=not local,
            pool=pool,
        )
    problems = list(found.errors)
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
        for p in problems:
            err.print(f"[red]preflight[/] {escape(p.host or '-')}: {escape(p.message)}")
            if p.hint:
                err.print(f"          [dim]fix: {escape(p.hint)}[/]")
        raise PreflightFailed(f"{len(problems)} problem(s) found before launch; no job was started")
    if found.stale:
        err.print(f"project differs on {', '.join(found.stale)}: syncing it first")
        stale = [h for h in draft.hosts if h.name in found.stale]
        results = sync(
            stale,
            source,
            SyncOptions(draft.project_dir),
            forks=target.forks,
            connect=target.connect,
            pool=pool,
        )
        failed = [r for r in results if not r.ok]
        if failed:
            raise PreflightFailed(
                "; ".join(f"sync to {r.host.name} failed: {r.error}" for r in failed)
            )
    return found.facts


def _summary(plan: RunPlan, outcome: Outcome, run_dir: RunDir) -> None:
    err = ui.stderr()
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
        err.print(f"ended leftover processes of the job on: {ended}")
    for host, procs in outcome.left.items():
        err.print(f"[red]still running on {host}[/]: {escape(str(procs))}")
    err.print(f"run directory: {run_dir.path}")


def _launch(
    target: Target,
    request: RunRequest,
    chosen: list[Host],
    run_id: str,
    allow_sync: bool,
    job_timeout: float | None,
    pool: ConnectionPool,
) -> int:
    project = Path.cwd().resolve()
    local = str(project) if all(h.is_local for h in chosen) else None
    draft = build_plan(request, chosen, None, run_id, local_project=local)
    try:
        facts = _preflight_and_sync(target, request, draft, allow_sync, local is not None, pool)
    except PreflightFailed as exc:
        ui.stderr().print(f"[red]error:[/] {escape(str(exc))}")
        return EXIT_USAGE
    plan = build_plan(request, chosen, facts, run_id, local_project=local)
    files = render_job_files(plan, target.connect)
    run_dir = RunDir.create(project / "runs", plan, files)
    if local is None or "secret.env" in files:
        _copy_files(target, plan, files, pool)
    run_dir.record(
        run_id=run_id,
        hosts=[h.name for h in plan.hosts],
        ppn=plan.ppn,
        world=plan.world,
        launcher=plan.launcher.name,
        command=plan.command(),
        env_names=sorted(plan.env),
        secret_names=sorted(plan.secret_env),
        started=time.time(),
    )
    router = OutputRouter(run_dir, ui.stdout(), ui.stderr())
    outcome = Job(plan, target.connect, run_dir, router, target.forks, pool).run(job_timeout)
    run_dir.record(
        exit_code=outcome.exit_code,
        reason=outcome.reason,
        seconds=round(outcome.seconds, 3),
        launcher_exit=outcome.launcher_exit,
        first_failure=outcome.first_failure.__dict__ if outcome.first_failure else None,
        swept=outcome.swept,
        left=outcome.left,
    )
    _summary(plan, outcome, run_dir)
    return outcome.exit_code
