"""``cpuaccel report [RUN]``: a run's metrics.jsonl as a PNG and a short summary.

Reading the run folder is :mod:`cpuaccel.history.metrics`'s, the figure
:mod:`cpuaccel.history.plot`'s (which imports matplotlib only when drawing: it is an
optional extra, and importing it would slow every ``cpuaccel`` invocation down).
"""

from __future__ import annotations

import math
from typing import Any

import click

from cpuaccel import ui
from cpuaccel.history import plot as report_plot
from cpuaccel.history.metrics import (
    read_metrics,
    read_restarts,
    read_run_info,
    summarize,
)
from cpuaccel.history.plot import duration
from cpuaccel.history.records import find_run
from cpuaccel.visible import visible

PNG = "report.png"

EPILOG = """\b
Examples:
  cpuaccel report                        # the newest run in ./runs (last)
  cpuaccel report 20250101-1200          # an id, or a prefix only one run has
  cpuaccel report runs/20250101-120000-abc123 --json | jq .loss_last

\b
RUN is `last` (the default), a run id, a prefix only one run has, or a run folder.
Reads the folder's metrics.jsonl (one JSON object a line with "step" and "loss", and
optionally "samples_per_s", "step_time", "sync_time" or "grad_sync_seconds",
"sync_share", "lr" or "learning_rate"), writes report.png beside it (loss and samples/s
over steps, and panels for the learning rate and the gradient-sync share when they were
logged) and prints a summary; its medians leave out the warm-up (the first line), as
tune does. The title counts the steps and, from the folder's run.json, status.json and
the metrics' first line, says nodes x ppn, precision and wall time.
Needs matplotlib: pip install 'cpuaccel[report]'.

\b
Exit codes: 0 report written; 64 no such run directory, no metrics, a malformed line,
or matplotlib missing.
"""


def _finite_or_none(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def print_summary(summary: dict[str, Any]) -> None:
    out = ui.stdout()

    def line(label: str, text: str) -> None:
        out.print(visible(f"{label:<11}{text}"), markup=False)

    line("run", summary["run_dir"])
    span = f"step {summary['first_step']} to {summary['last_step']}"
    if summary["lines"] != summary["steps"]:
        span += f", {summary['lines']} lines"
    line("steps", f"{summary['steps']} ({span})")
    shape = _shape(summary)
    if shape:
        line("ranks", shape)
    if summary["precision"]:
        line("precision", summary["precision"])
    if summary["wall_seconds"] is not None:
        state = f" ({summary['state']})" if summary["state"] else ""
        line("wall time", duration(summary["wall_seconds"]) + state)
    best = (
        f"{summary['loss_min']:.4f} at step {summary['loss_min_step']}"
        if summary["loss_min"] is not None
        else "-"
    )
    line("loss", f"first {summary['loss_first']:.4f}, last {summary['loss_last']:.4f}, min {best}")
    rate = summary["samples_per_s_median"]
    if rate is None:
        line("samples/s", "- (not in metrics)")
    else:
        line("samples/s", f"median {rate:.1f}{_warmup(summary['samples_per_s_warmup'])}")
    seconds = summary["step_time_median"]
    if seconds is None:
        line("step time", "-")
    else:
        line("step time", f"median {seconds * 1000:.1f} ms{_warmup(summary['step_time_warmup'])}")
    share = summary["sync_share"]
    if share is not None:
        line("grad sync", f"{share:.1%} of step time")
    if summary["lr_first"] is not None:
        line("lr", f"first {summary['lr_first']:.3g}, last {summary['lr_last']:.3g}")
    if summary.get("restarts"):
        marks = ", ".join(
            f"attempt {r['attempt']} from step {r['step']}" for r in summary["restarts"]
        )
        line("restarts", marks)
    failure = summary.get("root_cause")
    if failure:
        where = f"rank {failure['rank']}" + (f" on {failure['host']}" if failure["host"] else "")
        code = f" (exit code {failure['exit_code']})" if failure["exit_code"] is not None else ""
        line("root cause", f"{failure['cause']}: {where}{code}")
    line("plot", summary["png"])


def _warmup(count: int) -> str:
    """What a median left out, as tune's do: the warm-up's first line(s)."""
    if not count:
        return ""
    return f" (leaves out {count} warm-up step{'' if count == 1 else 's'}, as tune does)"


def _shape(summary: dict[str, Any]) -> str:
    """'2 nodes x 2 ppn (4 ranks)', or '4 ranks' when only the world size is known."""
    world = summary["world"]
    ranks = f"{world} rank{'' if world == 1 else 's'}" if world else ""
    if summary["nodes"] and summary["ppn"]:
        nodes = summary["nodes"]
        text = f"{nodes} node{'' if nodes == 1 else 's'} x {summary['ppn']} ppn"
        return f"{text} ({ranks})" if ranks else text
    return ranks


@click.command(epilog=EPILOG, short_help="Plot a run's metrics into report.png and summarize them.")
@click.argument("run_spec", metavar="[RUN]", default="last")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON object.")
def report_command(run_spec: str, as_json: bool) -> None:
    """Plot a run's metrics (loss and samples/s over steps, learning rate and
    gradient-sync share when logged) and summarize them.

    RUN (default last) names a run folder of `cpuaccel run`, runs/<id>/, holding the
    metrics.jsonl the training script wrote on rank 0 (and run.json, status.json: the
    run's record).
    """
    run_dir = find_run(run_spec)
    metrics = read_metrics(run_dir)
    info = read_run_info(run_dir)
    read_restarts(run_dir, metrics, info)
    png = run_dir / PNG
    figure = report_plot.build_figure(metrics, info, run_dir.resolve().name)
    report_plot.save(figure, png)
    summary = summarize(metrics, info, png)
    summary["title"] = figure.get_suptitle()
    summary["panels"] = report_plot.panels(metrics)
    warn = ui.stderr()
    for warning in info.warnings:
        warn.print(visible(f"warning: {warning}"), markup=False)
    if metrics.skipped_partial_last_line:
        warn.print(
            visible(
                f"warning: {metrics.path}: left out its last line, cut short (a job ended "
                "while writing it)"
            ),
            markup=False,
        )
    if as_json:
        # Strict JSON for jq and friends: a loss that went NaN or infinite becomes null.
        ui.print_json({k: _finite_or_none(v) for k, v in summary.items()})
    else:
        print_summary(summary)
