"""`cpuaccel report`'s figure (issue 14, item 8): steps not lines in the title, the run's
shape, markers for few points, throughput from zero, lr and sync-share panels."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from cpuaccel.runs import plot as report_plot
from cpuaccel.runs.metrics import read_metrics, read_run_info
from cpuaccel.testing.command import cpuaccel

TAB_ORANGE = (0xFF, 0x7F, 0x0E)  # the samples/s line
TAB_GREEN = (0x2C, 0xA0, 0x2C)  # the learning rate's
TAB_RED = (0xD6, 0x27, 0x28)  # the gradient-sync share's


def runtime_lines(steps: range, *, world: int = 4, sync: bool = True) -> list[dict[str, Any]]:
    """metrics.jsonl as cpuaccel's runtime writes it: precision and world on the first line."""
    lines = []
    for step in steps:
        line: dict[str, Any] = {
            "step": step,
            "loss": 3.0 * math.exp(-step / 300) + 0.5,
            "lr": 1e-3 * min(1.0, step / 100),
            "time": 1_700_000_000 + step * 0.1,
            "step_time": 0.1,
            "samples_per_s": 640 + 20 * math.sin(step),  # steady: 3% up and down
            "sync_time": 0.02 if sync else 0.0,
            "sync_share": 0.2 if sync else 0.0,
        }
        if not lines:
            line.update(precision="bf16", world_size=world)
        lines.append(line)
    return lines


def make_run(tmp_path: Path, lines: list[dict[str, Any]], **files: Any) -> Path:
    run_dir = tmp_path / "runs" / "20261130-101500-abc123"
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    for name, content in files.items():
        (run_dir / f"{name}.json").write_text(
            content if isinstance(content, str) else json.dumps(content)
        )
    return run_dir


RUN_JSON = {"run_id": "20261130-101500-abc123", "hosts": ["n1", "n2"], "ppn": 2, "world": 4,
            "started": 1_700_000_000.0, "seconds": 99.0}  # fmt: skip
STATUS_JSON = {"run_id": "20261130-101500-abc123", "state": "succeeded", "exit_code": 0,
               "started": 1_700_000_000.0, "ended": 1_700_000_192.5}  # fmt: skip


def colour_pixels(png: Path, colour: tuple[int, int, int]) -> int:
    """How many pixels of PNG are (nearly) COLOUR: the lines drawn in it."""
    image = pytest.importorskip("matplotlib.image").imread(png)
    import numpy

    rgb = (image[..., :3] * 255).astype(int)
    close = numpy.abs(rgb - numpy.array(colour)).max(axis=-1) <= 12
    return int(close.sum())


def test_few_points_have_markers_and_the_title_says_the_runs_shape(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, runtime_lines(range(10, 60, 10)), run=RUN_JSON,
                       status=STATUS_JSON)  # fmt: skip
    proc = cpuaccel("report", str(run_dir), "--json", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads(proc.stdout)
    title = "20261130-101500-abc123: 50 steps\n2 nodes × 2 ppn · bf16 · wall 3 min 12 s"
    assert summary["title"] == title
    # 5 lines logged every 10 steps are 50 steps; status.json's times beat run.json's seconds.
    assert (summary["steps"], summary["lines"], summary["first_step"]) == (50, 5, 10)
    assert (summary["nodes"], summary["ppn"], summary["world"]) == (2, 2, 4)
    assert (summary["precision"], summary["state"]) == ("bf16", "succeeded")
    assert summary["wall_seconds"] == pytest.approx(192.5)
    assert (summary["lr_first"], summary["lr_last"]) == (pytest.approx(1e-4), pytest.approx(5e-4))
    assert summary["panels"] == ["loss", "samples/s", "learning rate", "grad sync share"]

    png = run_dir / "report.png"
    figure = report_plot.build_figure(read_metrics(run_dir), read_run_info(run_dir), run_dir.name)
    described = report_plot.describe(figure)
    assert described["title"] == title and described["size"] == [800, 1050]
    assert [p["ylabel"] for p in described["panels"]] == [
        "loss", "samples/s", "learning rate", "grad sync share"]  # fmt: skip
    for panel in described["panels"]:
        assert panel["series"] == [{"points": 5, "marker": "o"}], panel
    rates = described["panels"][1]
    assert rates["ylim"][0] == 0.0 and rates["ylim"][1] > 660  # from zero, not 620 to 660
    assert described["panels"][3]["ylim"][0] == 0.0
    # The PNG itself: 800 x 1050, the throughput, lr and sync-share lines really drawn.
    from matplotlib.image import imread

    assert imread(png).shape[:2] == (1050, 800)
    for colour in (TAB_ORANGE, TAB_GREEN, TAB_RED):
        assert colour_pixels(png, colour) > 50, colour

    text = cpuaccel("report", str(run_dir), timeout=120).stdout.splitlines()
    assert "steps      50 (step 10 to 50, 5 lines)" in text
    assert "ranks      2 nodes x 2 ppn (4 ranks)" in text
    assert "precision  bf16" in text and "wall time  3 min 12 s (succeeded)" in text


def test_many_points_are_lines_and_panels_not_logged_are_left_out(tmp_path: Path) -> None:
    lines = runtime_lines(range(0, 2000, 10), world=1, sync=False)
    for line in lines:
        del line["lr"]
    run_dir = make_run(tmp_path, lines, run={"hosts": ["localhost"], "ppn": 1, "world": 1,
                                             "seconds": 4000.0})  # fmt: skip
    metrics, info = read_metrics(run_dir), read_run_info(run_dir)
    described = report_plot.describe(report_plot.build_figure(metrics, info, "r"))
    # No lr logged, and one rank's sync share is 0 throughout: loss and samples/s only.
    assert described["title"] == "r: 2000 steps\n1 node × 1 ppn · bf16 · wall 1 h 06 min"
    assert described["size"] == [800, 600]
    assert [p["series"] for p in described["panels"]] == [[{"points": 200, "marker": "None"}]] * 2
    assert described["panels"][1]["ylim"][0] == 0.0

    proc = cpuaccel("report", str(run_dir), "--json", timeout=120)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert (summary["steps"], summary["lines"]) == (2000, 200)
    assert summary["panels"] == ["loss", "samples/s"] and summary["lr_first"] is None
    png = run_dir / "report.png"
    assert colour_pixels(png, TAB_ORANGE) > 200
    assert colour_pixels(png, TAB_GREEN) == 0 and colour_pixels(png, TAB_RED) == 0


def test_without_a_record_the_runtime_line_gives_ranks_and_a_bad_record_is_said(
    tmp_path: Path,
) -> None:
    lines = runtime_lines(range(1, 4), world=8)
    lines[2]["loss"] = "nan"  # how the runtime writes a loss that went NaN
    run_dir = make_run(tmp_path, lines, run="{not json", status=["not", "an", "object"])
    proc = cpuaccel("report", str(run_dir), "--json", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["title"] == "20261130-101500-abc123: 3 steps\n8 ranks · bf16"
    assert summary["loss_last"] is None and summary["wall_seconds"] is None
    warnings = proc.stderr.splitlines()
    assert len(warnings) == 2, proc.stderr
    assert warnings[0].startswith(f"warning: {run_dir / 'run.json'}: left out, not readable")
    assert warnings[1] == f"warning: {run_dir / 'status.json'}: left out, not a JSON object"


@pytest.mark.parametrize(
    ("steps", "count"),
    [([1, 2, 3], 3), ([0, 1, 2, 3], 4), ([10, 20, 30], 30), ([510, 520, 1000], 500),
     ([7], 7), ([0], 1), ([5, 5, 6], 2), ([1, 5, 10, 15, 20, 25, 30], 30),
     (list(range(0, 2000, 10)), 2000), ([510, 520, 530, 540], 40)],
)  # fmt: skip
def test_steps_are_counted_from_the_step_numbers(steps: list[int], count: int) -> None:
    from cpuaccel.runs.metrics import steps_trained

    assert steps_trained([float(s) for s in steps]) == count


def test_a_running_run_says_its_wall_time_so_far(tmp_path: Path) -> None:
    import time

    status = {"state": "running", "started": time.time() - 125, "ended": None}
    run_dir = make_run(tmp_path, runtime_lines(range(1, 3)), status=status)
    info = read_run_info(run_dir)
    assert info.state == "running" and 125 <= (info.wall_seconds or 0) < 185
    title = report_plot.title("r", read_metrics(run_dir), info)
    assert title.startswith("r: 2 steps\n4 ranks · bf16 · wall 2 min ")
    assert title.endswith(" so far")
