"""``cpuaccel report RUN_DIR``: a run's metrics.jsonl as a PNG and a short summary.

matplotlib is imported only inside the command (it is an optional extra, and importing
it would slow every ``cpuaccel`` invocation down).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import click

from cpuaccel import ui
from cpuaccel.errors import SourceError, UsageError
from cpuaccel.sourcefile import read_source

METRICS = "metrics.jsonl"
PNG = "report.png"
# What the runtime (or a script of one's own) may call the seconds spent in gradient sync.
SYNC_KEYS = ("sync_time", "grad_sync_seconds")
# Escaped for rich: cpuaccel.cli.main prints error messages as console markup, where
# "[report]" would be taken for a style and vanish.
INSTALL_HINT = "pip install 'cpuaccel[report]'"

EPILOG = """\b
Examples:
  cpuaccel report runs/20250101-120000-abc123
  cpuaccel report "$(ls -d runs/*/ | sort | tail -n 1)"     # the newest run
  cpuaccel report runs/20250101-120000-abc123 --json | jq .loss_last

\b
Reads RUN_DIR/metrics.jsonl (one JSON object a line with "step" and "loss", and
optionally "samples_per_s", "step_time", "sync_time" or "grad_sync_seconds"), writes
RUN_DIR/report.png (loss and samples/s over steps) and prints a summary. Needs
matplotlib: pip install 'cpuaccel[report]'.

\b
Exit codes: 0 report written; 64 no such run directory, no metrics, a malformed line,
or matplotlib missing.
"""


class Metrics:
    """The records of one metrics.jsonl, column by column.

    A plain class, not a dataclass: this module is imported by every `cpuaccel` command.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.steps: list[float] = []
        self.loss: list[float] = []
        self.samples_per_s: list[tuple[float, float]] = []  # (step, value)
        self.step_time: list[float] = []
        self.sync_of_timed_steps: list[float] = []  # of the steps whose both are known
        self.time_of_synced_steps: list[float] = []
        self.skipped_partial_last_line = False


def _number(record: dict[str, Any], key: str, where: str) -> float | None:
    """record[key] as a float; None when absent or null; UsageError when not a number."""
    value = record.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UsageError(f'{where}: "{key}" is {json.dumps(value)}, not a number')
    return float(value)


def read_metrics(run_dir: Path) -> Metrics:
    """Parse RUN_DIR/metrics.jsonl; an error naming the file (and line) when it is bad."""
    if not run_dir.exists():
        raise UsageError(f"{run_dir}: no such run directory", hint="pass a folder like runs/<id>")
    if not run_dir.is_dir():
        raise UsageError(
            f"{run_dir}: not a directory", hint="pass the run directory that holds metrics.jsonl"
        )
    path = run_dir / METRICS
    if not os.path.lexists(path):
        raise UsageError(
            f"{path}: no such file; this run logged no metrics",
            hint='the training script appends {"step": ..., "loss": ...} lines to '
            "$CPUACCEL_RUN_DIR/metrics.jsonl on rank 0",
        )
    # Unbounded: it grows with the run. A FIFO or device there is refused, not read.
    text = read_source(path, SourceError, "metrics file", "pass a run's folder", limit=None)
    metrics = Metrics(path)
    lines = text.split("\n")
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            if number == len(lines) and not text.endswith("\n"):
                # The last line of a job killed while writing it: keep the rest.
                metrics.skipped_partial_last_line = True
                continue
            raise UsageError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
        if not isinstance(record, dict):
            raise UsageError(f"{path}:{number}: expected a JSON object, got {line.strip()[:60]}")
        _add(metrics, record, f"{path}:{number}")
    if not metrics.steps:
        raise UsageError(f"{path}: holds no metrics (no line with a record)")
    return metrics


def _add(metrics: Metrics, record: dict[str, Any], where: str) -> None:
    step, loss = _number(record, "step", where), _number(record, "loss", where)
    if step is None or loss is None:
        raise UsageError(f'{where}: no "{"step" if step is None else "loss"}" in this record')
    rate = _number(record, "samples_per_s", where)
    seconds = _number(record, "step_time", where)
    syncs = [_number(record, key, where) for key in SYNC_KEYS]
    sync = next((value for value in syncs if value is not None), None)
    metrics.steps.append(step)
    metrics.loss.append(loss)
    if rate is not None:
        metrics.samples_per_s.append((step, rate))
    if seconds is not None:
        metrics.step_time.append(seconds)
        if sync is not None:
            metrics.sync_of_timed_steps.append(sync)
            metrics.time_of_synced_steps.append(seconds)


def median(values: list[float]) -> float:
    import statistics

    return statistics.median(values)


def _finite_or_none(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _int_if_whole(value: float) -> float | int:
    return int(value) if value.is_integer() else value


def summarize(metrics: Metrics, png: Path) -> dict[str, Any]:
    pairs = zip(metrics.steps, metrics.loss, strict=True)
    finite = [(loss, step) for step, loss in pairs if math.isfinite(loss)]
    best = min(finite) if finite else (math.nan, math.nan)
    rates = [rate for _, rate in metrics.samples_per_s]
    synced_time = sum(metrics.time_of_synced_steps)
    return {
        "run_dir": str(metrics.path.parent),
        "metrics": str(metrics.path),
        "png": str(png),
        "steps": len(metrics.steps),
        "first_step": _int_if_whole(metrics.steps[0]),
        "last_step": _int_if_whole(metrics.steps[-1]),
        "loss_first": metrics.loss[0],
        "loss_last": metrics.loss[-1],
        "loss_min": best[0] if finite else None,
        "loss_min_step": _int_if_whole(best[1]) if finite else None,
        "samples_per_s_median": median(rates) if rates else None,
        "step_time_median": median(metrics.step_time) if metrics.step_time else None,
        "sync_share": sum(metrics.sync_of_timed_steps) / synced_time if synced_time > 0 else None,
        "skipped_partial_last_line": metrics.skipped_partial_last_line,
    }


def plot(metrics: Metrics, png: Path, title: str) -> None:
    """Two panels over steps, loss above and samples/s below, written atomically."""
    try:
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        raise UsageError(
            "cpuaccel report needs matplotlib, which is not installed", hint=INSTALL_HINT
        ) from None

    figure = Figure(figsize=(8, 6), dpi=100, layout="constrained")
    loss_axes, rate_axes = figure.subplots(2, 1, sharex=True)
    loss_axes.plot(metrics.steps, metrics.loss, color="tab:blue", linewidth=1.2)
    loss_axes.set_ylabel("loss")
    loss_axes.set_title(title)
    loss_axes.grid(alpha=0.3)
    if metrics.samples_per_s:
        steps = [step for step, _ in metrics.samples_per_s]
        rates = [rate for _, rate in metrics.samples_per_s]
        rate_axes.plot(steps, rates, color="tab:orange", linewidth=1.0)
        middle = median(rates)
        rate_axes.axhline(middle, color="gray", linestyle="--", linewidth=1.0)
        rate_axes.annotate(
            f"median {middle:.1f}",
            xy=(1, middle),
            xycoords=("axes fraction", "data"),
            xytext=(-4, 4),
            textcoords="offset points",
            ha="right",
            color="gray",
        )
    else:
        rate_axes.text(
            0.5, 0.5, "no samples_per_s in metrics.jsonl", ha="center", va="center",
            transform=rate_axes.transAxes, color="gray",
        )  # fmt: skip
        rate_axes.set_yticks([])
    rate_axes.set_ylabel("samples/s")
    rate_axes.set_xlabel("step")
    rate_axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    rate_axes.grid(alpha=0.3)
    # Beside the PNG, then renamed over it: never a half-written report.png.
    temporary = png.with_name(f".{png.name}.{os.getpid()}.tmp")
    try:
        figure.savefig(temporary, format="png")
        os.replace(temporary, png)
    except BaseException as exc:
        temporary.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise UsageError(f"{png}: cannot write it: {exc.strerror or exc}") from None
        raise


def print_summary(summary: dict[str, Any]) -> None:
    out = ui.stdout()

    def line(label: str, text: str) -> None:
        out.print(f"{label:<11}{text}", markup=False)

    line("run", summary["run_dir"])
    line("steps", f"{summary['steps']} (step {summary['first_step']} to {summary['last_step']})")
    best = (
        f"{summary['loss_min']:.4f} at step {summary['loss_min_step']}"
        if summary["loss_min"] is not None
        else "-"
    )
    line("loss", f"first {summary['loss_first']:.4f}, last {summary['loss_last']:.4f}, min {best}")
    rate = summary["samples_per_s_median"]
    line("samples/s", f"median {rate:.1f}" if rate is not None else "- (not in metrics)")
    seconds = summary["step_time_median"]
    line("step time", f"median {seconds * 1000:.1f} ms" if seconds is not None else "-")
    share = summary["sync_share"]
    if share is not None:
        line("grad sync", f"{share:.1%} of step time")
    line("plot", summary["png"])


@click.command(epilog=EPILOG)
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON object.")
def report_command(run_dir: Path, as_json: bool) -> None:
    """Plot a run's metrics (loss and samples/s over steps) and summarize them.

    RUN_DIR is a run directory of `cpuaccel run`, runs/<id>/, holding the metrics.jsonl
    the training script wrote on rank 0.
    """
    metrics = read_metrics(run_dir)
    png = run_dir / PNG
    plot(metrics, png, title=f"{run_dir.resolve().name}: {len(metrics.steps)} steps")
    summary = summarize(metrics, png)
    if metrics.skipped_partial_last_line:
        ui.stderr().print(
            f"warning: {metrics.path}: left out its last line, cut short (a job ended "
            "while writing it)",
            markup=False,
        )
    if as_json:
        # Strict JSON for jq and friends: a loss that went NaN or infinite becomes null.
        ui.print_json({k: _finite_or_none(v) for k, v in summary.items()})
    else:
        print_summary(summary)
