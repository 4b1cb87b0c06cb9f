"""``cpuaccel report``'s figure: loss and samples/s over steps, learning rate and
gradient-sync share when they were logged, the run's shape in the title.

matplotlib is imported inside the functions: it is an optional extra, and the verb's
module is loaded for ``cpuaccel report --help`` too.
"""

from __future__ import annotations

import os
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cpuaccel.errors import UsageError
from cpuaccel.history.metrics import Metrics, Point, RunInfo, steps_trained

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

INSTALL_HINT = "pip install 'cpuaccel[report]'"
# Up to this many points a series shows a marker at each: with a few, a bare line hides
# where the measurements are (two points drawn as one segment look like a trend).
FEW_POINTS = 40
WIDTH_IN, PANEL_IN, TITLE_IN, DPI = 8.0, 2.25, 1.5, 100  # two panels: 800 x 600 px


def title(run_name: str, metrics: Metrics, info: RunInfo) -> str:
    """'<id>: 100 steps' and, on a second line, nodes × ppn, precision and wall time."""
    steps = steps_trained(metrics.steps)
    head = f"{run_name}: {steps:g} step{'' if steps == 1 else 's'}"
    details = []
    if info.hosts and info.ppn:
        nodes = len(info.hosts)
        details.append(f"{nodes} node{'' if nodes == 1 else 's'} × {info.ppn} ppn")
    elif info.world or metrics.world_size:
        ranks = info.world or metrics.world_size
        details.append(f"{ranks} rank{'' if ranks == 1 else 's'}")
    if metrics.precision:
        details.append(metrics.precision)
    if info.wall_seconds is not None:
        so_far = " so far" if info.state == "running" else ""
        details.append(f"wall {duration(info.wall_seconds)}{so_far}")
    return head + ("\n" + " · ".join(details) if details else "")


def duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, second = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {second:02d} s"
    hours, minute = divmod(minutes, 60)
    return f"{hours} h {minute:02d} min"


def panels(metrics: Metrics) -> list[str]:
    """The panels drawn, top to bottom: loss and samples/s always, the others if logged."""
    names = ["loss", "samples/s"]
    if metrics.lr:
        names.append("learning rate")
    # A world of one logs a share of 0 at every step: a flat line says nothing.
    if any(share > 0 for _, share in metrics.sync_share):
        names.append("grad sync share")
    return names


def build_figure(metrics: Metrics, info: RunInfo, run_name: str) -> Figure:
    try:
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator, PercentFormatter
    except ImportError:
        raise UsageError(
            "cpuaccel report needs matplotlib, which is not installed", hint=INSTALL_HINT
        ) from None
    names = panels(metrics)
    height = TITLE_IN + PANEL_IN * len(names)
    figure = Figure(figsize=(WIDTH_IN, height), dpi=DPI, layout="constrained")
    axes_list: list[Axes] = list(figure.subplots(len(names), 1, sharex=True))
    figure.suptitle(title(run_name, metrics, info))
    loss_axes = axes_list[0]
    _series(loss_axes, list(zip(metrics.steps, metrics.loss, strict=True)), "tab:blue")
    loss_axes.set_ylabel("loss")
    for attempt, step in info.restarts:  # run --max-restarts: where each attempt resumed
        loss_axes.axvline(step, color="gray", linestyle=":", linewidth=1.0, gid="restart")
        loss_axes.annotate(
            f"restart {attempt}", xy=(step, 1), xycoords=("data", "axes fraction"),
            xytext=(3, -12), textcoords="offset points", color="gray", fontsize="small",
        )  # fmt: skip
    _rates(axes_list[1], metrics.samples_per_s)
    for axes, name in zip(axes_list[2:], names[2:], strict=True):
        if name == "learning rate":
            _series(axes, metrics.lr, "tab:green")
            axes.set_ylabel("learning rate")
            axes.ticklabel_format(axis="y", style="sci", scilimits=(-3, 4))
        else:
            _series(axes, [(s, share * 100) for s, share in metrics.sync_share], "tab:red")
            axes.set_ylabel("grad sync share")
            axes.yaxis.set_major_formatter(PercentFormatter(100))
            axes.set_ylim(bottom=0)
    for axes in axes_list:
        axes.grid(alpha=0.3)
    axes_list[-1].set_xlabel("step")
    axes_list[-1].xaxis.set_major_locator(MaxNLocator(integer=True))
    return figure


def _series(axes: Axes, points: list[Point], color: str) -> None:
    few = len(points) <= FEW_POINTS
    axes.plot(
        [step for step, _ in points],
        [value for _, value in points],
        color=color,
        linewidth=1.2,
        marker="o" if few else "None",
        markersize=3.5,
        gid="series",  # what describe() counts (not the median's guide line)
    )


def _rates(axes: Axes, samples_per_s: list[Point]) -> None:
    axes.set_ylabel("samples/s")
    if not samples_per_s:
        axes.text(
            0.5, 0.5, "no samples_per_s in metrics.jsonl", ha="center", va="center",
            transform=axes.transAxes, color="gray",
        )  # fmt: skip
        axes.set_yticks([])
        return
    _series(axes, samples_per_s, "tab:orange")
    middle = statistics.median(rate for _, rate in samples_per_s)
    axes.axhline(middle, color="gray", linestyle="--", linewidth=1.0)
    axes.annotate(
        f"median {middle:.1f}",
        xy=(1, middle),
        xycoords=("axes fraction", "data"),
        xytext=(-4, 4),
        textcoords="offset points",
        ha="right",
        color="gray",
    )
    # From zero: a throughput that moves 3% must not look like it halves.
    axes.set_ylim(bottom=0, top=max(rate for _, rate in samples_per_s) * 1.1 or 1.0)


def describe(figure: Figure) -> dict[str, Any]:
    """What the figure shows, for tests: title, size, each panel's series and limits."""
    import numpy  # matplotlib's own dependency

    width, height = figure.get_size_inches() * figure.dpi
    suptitle = figure.get_suptitle()
    return {
        "title": suptitle,
        "size": [round(width), round(height)],
        "panels": [
            {
                "ylabel": axes.get_ylabel(),
                "ylim": [float(limit) for limit in axes.get_ylim()],
                "series": [
                    {"points": int(numpy.size(line.get_xdata())), "marker": line.get_marker()}
                    for line in axes.get_lines()
                    if line.get_gid() == "series"
                ],
                "restarts": [
                    float(numpy.asarray(line.get_xdata())[0])
                    for line in axes.get_lines()
                    if line.get_gid() == "restart"
                ],
            }
            for axes in figure.axes
        ],
    }


def save(figure: Figure, png: Path) -> None:
    """Beside the PNG, then renamed over it: never a half-written report.png."""
    temporary = png.with_name(f".{png.name}.{os.getpid()}.tmp")
    try:
        figure.savefig(temporary, format="png")
        os.replace(temporary, png)
    except BaseException as exc:
        temporary.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise UsageError(f"{png}: cannot write it: {exc.strerror or exc}") from None
        raise
