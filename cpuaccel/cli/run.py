"""``cpuaccel run``: parse the flags, settle them (config/effective.py), hand them to
jobs/launch.py (preflight, render, launch with MPI, end cleanly), and print."""

from __future__ import annotations

import functools
import shlex
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

from cpuaccel import ui
from cpuaccel.api import launching
from cpuaccel.api.keywords import FlagValues
from cpuaccel.api.target import Target
from cpuaccel.cli.dashboard import (
    DEFAULT_PORT,
    Page,
    Wiring,
    can_open_browser,
    serve_until_interrupted,
)
from cpuaccel.cli.options import EPILOG as ALIASES_EPILOG
from cpuaccel.cli.options import host_options, list_hosts_and_exit, setting_options
from cpuaccel.config.settings import RUN
from cpuaccel.errors import EXIT_USAGE, CpuaccelError, UsageError
from cpuaccel.history import records
from cpuaccel.jobs import given_id
from cpuaccel.jobs import launch as job
from cpuaccel.jobs.plan import RunPlan
from cpuaccel.jobs.result import ERROR, JobReport
from cpuaccel.node.endings import INTERRUPTED
from cpuaccel.node.supervisor import EXIT_INTERRUPTED
from cpuaccel.ui import escape

EPILOG = """\b
Examples:
  cpuaccel run --nodes 1 --ppn 2 examples/train.py        # this machine, 2 ranks
  cpuaccel run -i inventory.yaml --nodes 4 --ppn 4 train.py --epochs 3
  cpuaccel run -i inventory.yaml --dry-run train.py       # print hostfile, env, command
  cpuaccel run --config default_config.yaml train.py      # Accelerate's config + hostfile
  cpuaccel run --env HF_TOKEN -m pkg.train --lr 0.1       # a module; *TOKEN* stays secret
  cpuaccel run -i inventory.yaml --detach train.py        # prints the run id, returns
  cpuaccel run -i inv.yaml --nodes 2:3 --max-restarts 1 train.py  # a lost node left out
  salloc -N 2 cpuaccel run --ppn 2 train.py  # in a Slurm job: its nodes, srun launches

\b
Defaults: ./cpuaccel.yaml, or --config FILE (Accelerate's default_config.yaml too);
flags override them; `cpuaccel config show` says where each came from. Everything after
SCRIPT goes to the script (a note names cpuaccel's options found there). Every node is
checked before launch (and the project synced unless --no-sync); each rank's output is
labelled and logged in runs/<id>/. Ctrl-C, --timeout, --hang-timeout or a failing rank
end the job on every node; with --detach the head node's supervisor does (`cpuaccel stop
RUN`). Host options: cpuaccel help hosts.

\b
Exit codes: the first failing rank's, 0 if all succeeded; 64 bad input; 69 preflight;
124 --timeout/--hang-timeout/--rendezvous-timeout; 130 interrupted; 143 terminated;
255 a node lost.

"""
EPILOG += ALIASES_EPILOG


def _print_dry_run(
    plan: RunPlan, files: dict[str, tuple[int, str]], wanted: dict[str, str], as_json: bool
) -> None:
    if as_json:
        report = JobReport.of_plan(plan, 0, "dry-run", 0.0)
        ui.print_json({**report.to_json(), "command": plan.command(), "network": wanted})
        return
    out = ui.stdout()
    unknown = plan.ppn is None
    out.print(f"# run {plan.run_id} (dry run: no node was contacted)")
    if unknown:
        out.print("# ppn and threads come from the nodes' facts: pass --ppn to fix them here")
    for name in ("hostfile", "env.sh"):
        out.print(f"\n## {name}\n{escape(files[name][1].rstrip())}")
    if wanted:  # each node's address and interface come from its facts, at the launch
        out.print("\n## network (each node's address and interface, set at the launch)")
        for host, what in wanted.items():
            out.print(f"{escape(host)}: {escape(what)}")
    if "secret.env" in files:
        out.print(f"\n## secret.env (mode 0600): {', '.join(plan.secret_env)} (values hidden)")
    out.print(
        f"\n## command (on {plan.head.name}, from launch.sh)\n{escape(shlex.join(plan.command()))}"
    )


# ---------------------------------------------------------------- run --json
# ``run --json``: the one JSON object on stdout, on every path, a bad flag included.
#
# A script that runs ``cpuaccel run --json ...`` reads stdout as one object whatever
# happened. A value click refuses (``--ppn 0``) fails before ``run_command`` runs, so
# ``RunCommand`` catches click's usage errors when ``--json`` is among run's own options
# (before SCRIPT: after it, ``--json`` is the script's) and prints the object first;
# ``cli/main.py`` then prints the error line and exits 64 as for any bad flag.
def failure(exc: BaseException, seconds: float) -> JobReport:
    """The object of a run that ended before any job: bad input, or Ctrl-C."""
    if isinstance(exc, CpuaccelError):
        return JobReport(exc.exit_code, ERROR, seconds, error=exc.message, fix=exc.hint)
    if isinstance(exc, click.ClickException):
        hint = "see 'cpuaccel run --help'"
        return JobReport(EXIT_USAGE, ERROR, seconds, error=exc.format_message(), fix=hint)
    return JobReport(EXIT_INTERRUPTED, INTERRUPTED.word, seconds, error="interrupted")


def wants_json(command: click.Command, args: Sequence[str]) -> bool:
    """Whether ``--json`` is one of run's own options in ``args`` (it may be a value, or
    the script's own flag after SCRIPT, and then it is not)."""
    takes_value = {
        opt
        for param in command.params
        if isinstance(param, click.Option) and not param.is_flag and not param.count
        for opt in param.opts
    }
    words = iter(args)
    for word in words:
        if word == "--json":
            return True
        if word == "--" or not word.startswith("-"):
            return False  # SCRIPT: the rest is the script's
        if word in takes_value:
            next(words, None)  # its value
    return False


class RunCommand(click.Command):
    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        json_wanted = wants_json(self, args)
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            if json_wanted:
                ui.print_json(failure(exc, 0.0).to_json())
            raise


# ---------------------------------------------------------------- run --dashboard
# ``cpuaccel run --dashboard``: the page of the run being started, served from this
# ``cpuaccel run``.
#
# The server starts before the launch (a port in use is refused before anything
# starts); the run's id is known once its folder appears in ./runs, so a thread waits
# for the first new folder and then prints (and opens) its page. A foreground run's page
# closes with the run: the server stays a few seconds after the end, so that the page
# shows it, and says so. A detached run's page is served after the start until Ctrl-C:
# the job goes on without it.
LINGER = 3.0  # seconds served after a foreground run ends: the page's last polls
WAIT = 0.2  # seconds between two looks for the run's folder


class RunPage:
    def __init__(self, target: Target, port: int) -> None:
        setting = target.inventory_setting
        wiring = Wiring(
            job.inventory_path(setting.value if setting else None),
            target.connect.connect_timeout,
            target.connect.host_key_checking is False,
        )
        self.runs = records.runs_folder()
        self.before = set(records.run_ids(self.runs))
        try:
            self.page = Page("127.0.0.1", port, wiring, self.runs)
        except BaseException:
            wiring.close()
            raise
        self.done = threading.Event()
        self.announced = False
        self.thread = threading.Thread(target=self._announce, name="run-page", daemon=True)
        self.thread.start()

    def _announce(self) -> None:
        """Print the page of the first run folder that was not there before."""
        while not self.done.wait(WAIT):
            new = sorted(set(records.run_ids(self.runs)) - self.before)
            if new:
                self.show(new[0])
                return

    def show(self, run_id: str) -> None:
        self.announced = True
        self.page.announce(f"/run/{run_id}", browser=can_open_browser())

    def around(self, launch: Callable[[], JobReport], detach: bool) -> JobReport:
        """``launch()`` (job.launch) with the page served; a foreground run's page
        closes with the run, a detached one's is left to ``ended`` after the report."""
        try:
            report = launch()
        except BaseException:
            self.ended(None, detach)
            raise
        if not detach:
            self.ended(report, detach)
        return report

    def ended(self, report: JobReport | None, detach: bool) -> None:
        """After job.launch: a started detached job is served until Ctrl-C; otherwise
        the page closes now (after LINGER s when a run was shown)."""
        self.done.set()
        self.thread.join()
        started = report is not None and report.detached is not None and report.exit_code == 0
        if detach and started and report is not None:
            if not self.announced:  # a detached start records its run at its end
                self.show(str(report.run_id))
            ui.stderr().print(
                f"dashboard: serving the page of {escape(str(report.run_id))} until Ctrl-C "
                "(the job goes on without it)"
            )
            serve_until_interrupted(self.page)
            return
        if report is not None and not detach:
            time.sleep(LINGER)
        self.page.close()
        ui.stderr().print("dashboard: the run has ended; its page is closed")


def start(target: Target) -> RunPage:
    """The page on the dashboard's usual port, else (taken: a `cpuaccel dashboard` may
    be running) on any free one: the URL printed says which."""
    try:
        return RunPage(target, DEFAULT_PORT)
    except UsageError:
        return RunPage(target, 0)


def json_failures(func: Callable[..., None]) -> Callable[..., None]:
    """With --json, an error on the way (a flag's value, the hosts, the script) is the
    one object on stdout too; ``cli/main.py`` prints it on stderr as for any error."""

    @functools.wraps(func)
    def command(**kwargs: Any) -> None:
        started = time.monotonic()
        try:
            func(**kwargs)
        except (CpuaccelError, KeyboardInterrupt) as exc:
            if kwargs.get("as_json"):
                ui.print_json(failure(exc, time.monotonic() - started).to_json())
            raise

    return command


@click.command(
    cls=RunCommand,  # --json: the one object on a bad flag too
    epilog=EPILOG,
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@json_failures
@setting_options(RUN)
@host_options(settles_hosts=True)
@click.option("--dry-run", is_flag=True, help="Print hostfile, env and command; contact no node.")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="One JSON object at the end on stdout; the ranks' output goes to stderr.",
)
@click.option(
    "--detach",
    is_flag=True,
    help="Start the job under a supervisor on the head node, print its run id and return.",
)
@click.option(
    "--dashboard",
    is_flag=True,
    help="Serve the run's live page (cpuaccel dashboard) while it runs; with --detach, "
    "until Ctrl-C.",
)
@click.argument("script")
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
def run_command(
    target: Target,
    flags: FlagValues,
    dry_run: bool,
    as_json: bool,
    detach: bool,
    dashboard: bool,
    script: str,
    script_args: tuple[str, ...],
) -> None:
    """Launch SCRIPT with MPI across the nodes, the bundled runtime on every rank."""
    project = Path.cwd().resolve()
    _refuse_with_dry_run(dry_run, detach=detach, dashboard=dashboard)
    settings = target.settings(flags)
    list_hosts_and_exit(target, settings.hosts.value)  # --nodes and the head decide
    what = launching.script_for(script, script_args, project, flags)
    given = given_id.given(project / "runs") or ""  # CPUACCEL_RUN_ID
    request = launching.request(
        target, settings, what, project, detach=detach, ranks_to_stderr=as_json, run_id=given
    )
    if dry_run:
        _print_dry_run(*job.dry_run(request), as_json)
        return
    page = _run_page(target) if dashboard else None
    launch = functools.partial(launching.start, request)
    report = page.around(launch, detach) if page is not None else launch()
    _finish(report, as_json, page if detach else None)


def _finish(report: JobReport, as_json: bool, page: RunPage | None) -> None:
    _print_report(report, as_json)
    if page is not None:
        page.ended(report, detach=True)  # a started job's page: served until Ctrl-C
    sys.exit(report.exit_code)


def _refuse_with_dry_run(dry_run: bool, **flags: bool) -> None:
    for name, given in flags.items():
        if dry_run and given:
            raise UsageError(
                f"--{name} and --dry-run together",
                hint=f"--dry-run starts nothing: leave out --{name} to see the files",
            )


def _run_page(target: Target) -> RunPage:
    from cpuaccel.cli import run as run_dashboard  # the server's imports only for --dashboard

    return run_dashboard.start(target)


def _print_report(report: JobReport, as_json: bool) -> None:
    if as_json:
        ui.print_json(report.to_json())
    elif report.detached is not None and report.exit_code == 0:
        ui.stdout().print(escape(str(report.run_id)), highlight=False)
        ui.stderr().print(
            f"detached: supervised on {escape(str(report.detached['head']))} "
            f"(pid {report.detached['supervisor']['pid']}); run directory: "
            f"{escape(str(report.folder))}; cpuaccel stop {escape(str(report.run_id))} ends it"
        )
