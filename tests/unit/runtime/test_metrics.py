"""ctx.log's metrics.jsonl (runtime/metrics.py): its lines, in the run folder or the
working folder, and the time spent in gradient sync."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import cpuaccel
from cpuaccel.runtime.context import Context
from cpuaccel.runtime.metrics import MetricsLog


def read_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_metrics_lines(ctx: Context, tmp_path: Path) -> None:
    model = nn.Linear(2, 1)
    ctx.prepare(model)
    for step in (1, 2):
        time.sleep(0.05)
        ctx.backward(model(torch.ones(1, 2)).sum())
        line = ctx.log(step=step, loss=torch.tensor(2.5 / step), samples=10)
    lines = read_lines(tmp_path / "metrics.jsonl")
    assert [x["step"] for x in lines] == [1, 2]
    assert lines[1]["loss"] == 1.25 and line == lines[1]
    for x in lines:
        assert {"time", "step_time", "samples_per_s", "sync_time", "sync_share"} <= set(x)
        assert 0.05 <= x["step_time"] < 1.0
        assert x["samples_per_s"] == pytest.approx(10 / x["step_time"])
        assert x["sync_time"] == 0.0 and x["sync_share"] == 0.0  # one rank: nothing to sync
    # Logging every 3 steps: per-step times, samples from samples_per_step.
    ctx.samples_per_step = 8
    for _ in range(3):
        time.sleep(0.02)
        ctx.backward(model(torch.ones(1, 2)).sum())
    third = ctx.log(step=5, loss=1.0)
    assert 0.02 <= third["step_time"] < 0.5
    assert third["samples_per_s"] == pytest.approx(8 / third["step_time"])


def test_metrics_go_to_the_run_dir_or_the_working_folder(
    clean_env: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with cpuaccel.init(verbose=False) as here:
        here.log(step=1, loss=1.0)
    assert read_lines(tmp_path / "metrics.jsonl")[0]["loss"] == 1.0
    run_dir = tmp_path / "runs" / "r1"
    monkeypatch.setenv("CPUACCEL_RUN_DIR", str(run_dir))
    with cpuaccel.init(verbose=False) as in_run:
        in_run.log(step=1, loss=2.0, epoch=0)
    assert read_lines(run_dir / "metrics.jsonl")[0]["loss"] == 2.0


def test_metrics_report_time_in_gradient_sync() -> None:
    log = MetricsLog("unused.jsonl", enabled=False)  # as on ranks other than 0
    time.sleep(0.1)
    line = log.record(
        {"step": 2}, steps_done=2, sync_seconds=0.05, samples=None, samples_per_step=None
    )
    assert line["sync_time"] == pytest.approx(0.025)
    assert 0.2 < line["sync_share"] <= 0.5
    assert "samples_per_s" not in line
    assert not Path("unused.jsonl").exists()
