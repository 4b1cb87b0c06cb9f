"""``cpuaccel tune``: run the user's script for a few steps at each setting of a small
grid (ranks per node x threads per rank, then the allocator), print what each measured,
and with --write keep the best in cpuaccel.yaml. Each trial is a real ``cpuaccel run``
(jobs/launch.py); the grid, the measures and the file are ``cpuaccel/tuning/``'s."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import click

from cpuaccel import ui
from cpuaccel.api import launching
from cpuaccel.api.keywords import FlagValues, Seconds
from cpuaccel.api.script import check_script_kind, script_entry
from cpuaccel.api.target import Target
from cpuaccel.cli.options import (
    bundled,
    host_options,
    list_hosts_and_exit,
    setting_options,
    shown_option,
)
from cpuaccel.config.project import PROJECT_FILE
from cpuaccel.config.project_choice import accelerate_default
from cpuaccel.config.settings import TUNE, LaunchSettings
from cpuaccel.errors import EXIT_PROBLEMS, CpuaccelError, UsageError
from cpuaccel.executor import ConnectionPool
from cpuaccel.jobs.plan import Script
from cpuaccel.jobs.request import LaunchRequest
from cpuaccel.node.endings import COMPLETED, STOPPED
from cpuaccel.node.supervisor import EXIT_INTERRUPTED
from cpuaccel.tuning import grid, measure, write
from cpuaccel.tuning import survey as nodes
from cpuaccel.tuning.measure import OK, Ranking, Row
from cpuaccel.ui import escape

EPILOG = """\b
Examples:
  cpuaccel tune -i inventory.yaml train.py                # the grid from the nodes' cores
  cpuaccel tune -i inventory.yaml --steps 30 --write train.py --batch 32
  cpuaccel tune --nodes 2 --grid 'ppn=1,2 threads=1,2' train.py
  cpuaccel tune --grid ppn=2 --grid allocator=none,tcmalloc --json train.py > tune.json
  cpuaccel config show                                    # what --write set, and where

\b
Each trial is a real `cpuaccel run` of SCRIPT (preflight, sync, launch, teardown) with
`--steps N` added to the script's arguments (--steps 0: none added), bounded by
--trial-timeout. Its throughput is the median samples_per_s of the run's metrics.jsonl
(ctx.log(samples=...) or ctx.samples_per_step), else steps/s from the lines' step_time;
the first line (start-up) is left out. A failed trial is a row with its reason.
The grid: ranks per node = the powers of two dividing the physical cores, the sockets
and the cores; threads per rank = cores / ranks and half of that; then, at the best of
those, the allocator: none and each of tcmalloc / jemalloc that every node has.
--write sets ppn, env: OMP_NUM_THREADS (and allocator, when tried) in ./cpuaccel.yaml
(or --config FILE), every other line and comment kept.
Ctrl-C ends the current trial on every node and prints what was measured (exit 130).

\b
ipexrun and torch.backends.xeon.run_cpu choose ranks and threads by fixed rules;
tune measures your script on your nodes instead.

\b
Exit codes: 0 a best setting found; 1 no trial measured; 64 bad input; 69 a node
failed; 130 interrupted.
"""

REFUSED = {  # run's flags that the grid sets itself
    "ppn": "the grid tries ranks per node: give them with --grid ppn=1,2",
    "num_processes": "the grid tries ranks per node: give them with --grid ppn=1,2",
    "max_restarts": "a failed trial is a row of the table, never restarted: leave it out",
}


def _refuse_grid_flags(flags: FlagValues) -> None:
    names = flags.get("flag_names") or {}
    for setting, why in REFUSED.items():
        if flags.get(setting) is not None:
            raise UsageError(f"{names.get(setting, '--' + setting)}: not for tune", hint=why)
    if flags.get("min_nodes") is not None:
        raise UsageError(
            "--nodes MIN:MAX: not for tune",
            hint="every trial runs on the same nodes: give --nodes N",
        )
    if "OMP_NUM_THREADS" in (flags.get("env") or {}):
        raise UsageError(
            "--env OMP_NUM_THREADS: the grid tries threads per rank",
            hint="give them with --grid threads=4,8",
        )


def _refuse_axis_as_script(script: str) -> None:
    """`--grid ppn=1,2 threads=4` unquoted: the second word would be taken as SCRIPT."""
    axis = script.partition("=")[0]
    if "=" in script and axis in grid.AXES:
        raise UsageError(
            f"--grid: {script} was read as SCRIPT",
            hint=f"quote the axes together (--grid 'ppn=1,2 {script}') or repeat --grid",
        )


def _write_path(target: Target) -> Path:
    project = target.project
    if project is None:
        return Path(PROJECT_FILE)
    if project.kind == "accelerate" and project.path == accelerate_default():
        return Path(PROJECT_FILE)  # found, not given: cpuaccel's own file beside it
    return write.target_file(project.path, project.kind)


@dataclass(frozen=True)
class Trials:
    """--steps, --trial-timeout and --grid: what each trial runs, how long it may take,
    and the values tried."""

    steps: int
    trial_timeout: float
    grid_items: tuple[str, ...]


@click.command(
    epilog=EPILOG,
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@setting_options(TUNE, hidden=REFUSED)  # run's flags that tune refuses: not in its --help
@host_options(settles_hosts=True)
@shown_option(
    "--steps",
    type=click.IntRange(0, 1_000_000),
    default=20,
    help="Passed to SCRIPT as --steps N in each trial (0: nothing added).",
)
@shown_option(
    "--trial-timeout",
    type=Seconds(1, 86400),
    default=300.0,
    metavar="SECONDS",
    help="End a trial after this long (a row 'timeout').",
)
@click.option(
    "--grid",
    "grid_items",
    multiple=True,
    metavar="'AXIS=V,V ...'",
    help="Values to try instead of the nodes' (AXIS: ppn, threads, allocator).",
)
@click.option("--write", "write_best", is_flag=True, help="Write the best into cpuaccel.yaml.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout.")
@click.argument("script")
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@bundled("trials", Trials, "steps", "trial_timeout", "grid_items")
def tune_command(
    target: Target,
    flags: FlagValues,
    trials: Trials,
    write_best: bool,
    as_json: bool,
    script: str,
    script_args: tuple[str, ...],
) -> None:
    """Measure SCRIPT at a few ranks per node x threads per rank; keep the fastest."""
    _refuse_axis_as_script(script)
    check_script_kind(script, no_python=False)
    spec = grid.parse_grid(trials.grid_items)
    _refuse_grid_flags(flags)
    settings = target.settings(flags)
    list_hosts_and_exit(target, settings.hosts.value)
    project = Path.cwd().resolve()
    steps = trials.steps
    args = (*script_args, "--steps", str(steps)) if steps else script_args
    what = script_entry(script, args, project, False, False)
    path = _write_path(target) if write_best else None
    if path is not None:
        write.check_target(path)  # refused before any trial, not after an hour of them
    with ConnectionPool(target.connect) as pool:
        found = nodes.survey(settings, what, pool, target.forks)
    tuner = _Tuner(settings, what, project, target, trials.trial_timeout)
    ranking = tuner.run(spec, found)
    written, failure = None, None
    if path is not None and ranking.best is not None and not tuner.interrupted:
        try:  # the table is printed whatever the write does: an hour of trials is kept
            written = write.write_best(path, ranking.best.trial, tuner.tried_allocators)
        except CpuaccelError as exc:
            failure = exc
    _print(ranking, found, written, tuner.interrupted, as_json, failure)
    if failure is not None:
        raise failure
    if tuner.interrupted:
        sys.exit(EXIT_INTERRUPTED)
    if ranking.best is None:
        sys.exit(EXIT_PROBLEMS)


class _Tuner:
    """The trials, one after the other, each a whole run through jobs/launch.py."""

    def __init__(
        self,
        settings: LaunchSettings,
        what: Script,
        project: Path,
        target: Target,
        timeout: float,
    ) -> None:
        self.settings, self.what, self.project = settings, what, project
        self.target, self.timeout = target, timeout
        self.interrupted = False
        self.tried_allocators = False
        self.rows: list[Row] = []

    def run(self, spec: grid.GridSpec, found: nodes.Survey) -> Ranking:
        first = grid.build_grid(spec, found.cores, found.sockets, self.settings.allocator.value)
        grid.check_size(first, len(spec.allocator or ()) or 1 + len(found.allocators))
        ui.stderr().print(
            f"tune: {len(first)} trial(s) on {len(self.settings.chosen)} node(s) of "
            f"{found.cores} core(s); allocators found: {', '.join(found.allocators) or 'none'}"
        )
        self.rows = [Row(t) for t in first]
        self._trials(self.rows)
        ranking = measure.rank_rows(self.rows)
        if ranking.best is None or self.interrupted:
            return ranking
        more = grid.allocator_trials(spec, ranking.best.trial, found.allocators, first)
        if more:
            self.tried_allocators = True
            extra = [Row(t) for t in more]
            self.rows += extra
            self._trials(extra)
        return measure.rank_rows(self.rows)

    def _trials(self, rows: list[Row]) -> None:
        for row in rows:
            if self.interrupted:
                row.status, row.reason = "skipped", "interrupted before it"
                continue
            self._one(row)
            number = self.rows.index(row) + 1
            ui.stderr().print(
                f"[bold]tune {number}/{len(self.rows)}[/] {escape(row.trial.label())}: "
                f"{escape(_measured(row))} ({row.seconds:.1f} s)"
            )

    def _one(self, row: Row) -> None:
        settings = nodes.trial_settings(self.settings, row.trial, "cpuaccel tune")
        started = time.monotonic()
        try:
            report = launching.start(
                LaunchRequest(
                    settings,
                    self.what,
                    self.project,
                    self.target.connect,
                    self.target.forks,
                    timeout=self.timeout,
                    ranks_to_stderr=True,  # stdout is the table's
                )
            )
        except KeyboardInterrupt:
            self.interrupted = True
            row.status, row.reason = "interrupted", "Ctrl-C before the job started"
            return
        except CpuaccelError as exc:
            row.status, row.reason = "error", str(exc)
            return
        finally:
            row.seconds = time.monotonic() - started
        row.run_id, row.folder = report.run_id, report.folder
        _judge(row, report.ended_by, report.exit_code, report.error)
        self.interrupted = report.ended_by in STOPPED


def _judge(row: Row, ended_by: str, code: int, error: str | None) -> None:
    if ended_by != COMPLETED.word or code != 0:
        row.status = ended_by
        row.reason = error or f"exit code {code}"
        return
    row.rates = measure.read_rates(row.folder) if row.folder else None
    if row.rates is None:
        row.status = "no metrics"
        row.reason = "no metrics.jsonl line with samples_per_s, step_time or time (ctx.log)"
        return
    row.status = OK


def _number(value: float) -> str:
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"


def _measured(row: Row) -> str:
    rates = row.rates
    if row.status != OK or rates is None:
        return f"{row.status}: {row.reason}"
    if rates.samples_per_s is not None:
        return f"{_number(rates.samples_per_s)} samples/s"
    return f"{_number(rates.steps_per_s or 0)} steps/s"


def _print(
    ranking: Ranking,
    found: nodes.Survey,
    written: Path | None,
    interrupted: bool,
    as_json: bool,
    failure: CpuaccelError | None = None,
) -> None:
    best = ranking.best
    if as_json:
        ui.print_json(
            {
                "unit": ranking.unit,
                "cores": found.cores,
                "allocators_found": found.allocators,
                "best": best.to_json() if best else None,
                "rows": [row.to_json() for row in ranking.rows],
                "written": str(written) if written else None,
                "write_error": str(failure) if failure else None,
                "interrupted": interrupted,
            }
        )
        return
    out = ui.stdout()
    cells = [("setting", ranking.unit, "ratio", "status")]
    for row in ranking.rows:
        value = _number(row.value) if row.value is not None else "-"
        ratio = f"{row.ratio:.2f}" if row.ratio is not None else "-"
        status = row.status if row.status == OK else f"{row.status}: {row.reason}"
        cells.append((row.trial.label(), value, ratio, status + (" (best)" if row is best else "")))
    widths = [max(len(c[i]) for c in cells) for i in range(3)]
    for cell in cells:
        line = "  ".join(cell[i].ljust(widths[i]) for i in range(3)) + "  " + cell[3]
        out.print(escape(line.rstrip()), highlight=False)
    if ranking.unit == measure.STEPS and best is not None:
        out.print(
            "steps/s: the script logged no samples/s; compare only if a step is the "
            "same work at every ppn (ctx.log(samples=...) says it)"
        )
    if written is not None and best is not None:
        out.print(escape(f"wrote {best.trial.label()} to {written}"))
