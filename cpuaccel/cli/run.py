"""``cpuaccel run``: parse the flags, settle them (config/effective.py), hand them to
launch/job.py (preflight, render, launch with MPI, end cleanly), and print."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

import click
from rich.markup import escape

from cpuaccel import ui
from cpuaccel.cli.launch_aliases import EPILOG as ALIASES_EPILOG
from cpuaccel.cli.launch_aliases import launch_options
from cpuaccel.cli.options import Target, host_options, list_hosts_and_exit, parse_env
from cpuaccel.cli.script_kind import check_script_kind
from cpuaccel.config.effective import resolve
from cpuaccel.errors import UsageError
from cpuaccel.launch import job
from cpuaccel.launch.plan import RunPlan, Script

EPILOG = """\b
Examples:
  cpuaccel run --nodes 1 --ppn 2 examples/train.py        # this machine, 2 ranks
  cpuaccel run -i inventory.yaml --nodes 4 --ppn 4 train.py --epochs 3
  cpuaccel run -i inventory.yaml --dry-run train.py       # print hostfile, env, command
  cpuaccel run -i inventory.yaml --env FI_PROVIDER=tcp --timeout 3600 train.py
  cpuaccel run --config default_config.yaml train.py      # Accelerate's config + hostfile
  cpuaccel run --num_processes 8 --master_addr node0 train.py   # accelerate's spellings
  cpuaccel run --env HF_TOKEN train.py     # this shell's value; *TOKEN* stays secret

\b
Defaults come from ./cpuaccel.yaml (or --config FILE, which may be Accelerate's
default_config.yaml; without either, Accelerate's own default config, if any: one
line says so); flags override it. `cpuaccel config show` prints each setting
and where it came from.

\b
Everything after SCRIPT goes to the script untouched. Before launching, every node is
checked (reachable, same Python/torch/cpuaccel, names resolve, project in sync: synced
now unless --no-sync, master port free). Output of each rank is labelled and logged in
runs/<id>/. Ctrl-C, SIGTERM, --timeout or a failing rank end the job on every node.

\b
Exit codes: the first failing rank's exit code, 0 if all ranks succeeded; 64 bad input;
69 a node failed preflight; 124 --timeout; 130 interrupted; 143 terminated; 255 a node
lost.

"""
EPILOG += ALIASES_EPILOG


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


@click.command(
    epilog=EPILOG,
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@launch_options
@host_options(settles_hosts=True)
# No click defaults below: a value that is None was not given, so the project file or
# the inventory may set it (cpuaccel.config.effective).
@click.option(
    "--launcher",
    type=click.Choice(["auto", "impi", "mpich", "openmpi"]),
    help="MPI launcher.  [default: auto]",
)
@click.option(
    "--env",
    "env_items",
    multiple=True,
    metavar="KEY=VALUE|NAME",
    help="Set in every rank; NAME alone passes this shell's value (secret when NAME has "
    "TOKEN, KEY, SECRET or PASSWORD in it).",
)
@click.option(
    "--sync/--no-sync",
    "allow_sync",
    default=True,
    show_default=True,
    help="Sync a stale project first.",
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
    launch_flags: dict[str, Any],
    launcher: str | None,
    env_items: tuple[str, ...],
    allow_sync: bool,
    dry_run: bool,
    job_timeout: float | None,
    script: str,
    script_args: tuple[str, ...],
) -> None:
    """Launch SCRIPT with MPI across the nodes, the bundled runtime on every rank."""
    project = Path.cwd().resolve()
    check_script_kind(script)
    env = parse_env(env_items)
    flags = {**launch_flags, "launcher": launcher, "env": env, "secret_env": env.secret}
    settings = resolve(flags, target.project, target.inventory, target.hosts, target.cli_vars)
    list_hosts_and_exit(target, settings.hosts.value)  # --nodes and the head decide
    what = Script(_script_in_project(script, project), script_args, project.name)
    if dry_run:
        _print_dry_run(*job.dry_run(settings, what, project, target.connect))
        return
    code = job.launch(
        settings,
        what,
        project,
        connect=target.connect,
        forks=target.forks,
        allow_sync=allow_sync,
        timeout=job_timeout,
    )
    sys.exit(code)
