"""What the dashboard reads of a run folder (dashboard/snapshot.py): metrics parsed
incrementally (a half line waits, a rewritten file starts again), decimated to at most
MAX_POINTS, log tails from the end of a large log, and the ranks' states from
status.json."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cpuaccel.dashboard.snapshot import MAX_POINTS, TAIL_BYTES, Metrics, RunView
from testsupport.fake_run import make_run, metric_line


def test_metrics_are_parsed_incrementally_a_half_line_waits(runs: Path) -> None:
    run = make_run(runs, metrics=100)
    metrics = Metrics(run.path)
    metrics.refresh()
    assert (metrics.count, metrics.precision) == (100, "bf16")
    size = metrics.offset
    assert size == (run.path / "metrics.jsonl").stat().st_size
    line = metric_line(100, 1.0)
    with open(run.path / "metrics.jsonl", "a") as f:
        f.write(line[:20])  # a line being written
    metrics.refresh()
    assert (metrics.count, metrics.offset) == (100, size)
    with open(run.path / "metrics.jsonl", "a") as f:
        f.write(line[20:] + "not json\n")
    metrics.refresh()
    assert metrics.count == 101 and metrics.columns["step"][-1] == 100
    assert metrics.offset == size + len(line) + len("not json\n")


def test_a_rewritten_or_shrunk_metrics_file_starts_again(runs: Path) -> None:
    run = make_run(runs, metrics=50)
    metrics = Metrics(run.path)
    metrics.refresh()
    path = run.path / "metrics.jsonl"
    path.write_text("".join(metric_line(s, 1.0) for s in range(1000, 1003)))  # shrunk
    metrics.refresh()
    assert metrics.columns["step"] == [1000, 1001, 1002]
    replacement = run.path / "new.jsonl"
    replacement.write_text("".join(metric_line(s, 1.0) for s in range(7, 12)))
    os.replace(replacement, path)  # replaced, though no smaller than what was read
    metrics.refresh()
    assert metrics.columns["step"] == [7, 8, 9, 10, 11]
    for had in (50, 3, 0):  # a page with the old file's points: fewer than the new one's too
        answer = metrics.since(had)
        assert answer["reset"] and answer["step"] == [7, 8, 9, 10, 11], had
    current = answer["next"]
    with open(path, "a") as f:
        f.write(metric_line(12, 1.0))
    metrics.refresh()
    assert metrics.since(current) == {**metrics.since(current), "reset": False, "step": [12]}
    assert metrics.since(current)["next"] == current + 1


def test_decimation_keeps_at_most_max_points_and_the_last(runs: Path) -> None:
    run = make_run(runs, metrics=MAX_POINTS * 3 + 7)
    metrics = Metrics(run.path)
    metrics.refresh()
    answer = metrics.since(0)
    assert answer["decimated"] and len(answer["step"]) <= MAX_POINTS
    assert answer["step"][0] == 0 and answer["step"][-1] == MAX_POINTS * 3 + 6
    assert answer["step"] == sorted(answer["step"])
    assert all(len(answer[name]) == len(answer["step"]) for name in ("loss", "lr"))
    exact = metrics.since(metrics.count - MAX_POINTS)
    assert not exact["decimated"] and len(exact["step"]) == MAX_POINTS


def test_log_tails_come_from_the_end_of_a_large_log(runs: Path) -> None:
    run = make_run(runs, nodes=1, ppn=2, metrics=1, log_lines=0)
    (run.path / "rank-0.log").unlink()  # a rank that has written nothing yet
    with open(run.path / "rank-1.log", "w") as f:
        f.write("x" * (TAIL_BYTES * 50) + "\n")  # a long first line, then many short
        f.write("".join(f"line {n}\n" for n in range(100_000)))
    doc = RunView(run.path).snapshot(0, tail=3)
    assert doc["ranks"][1]["log_tail"] == ["line 99997", "line 99998", "line 99999"]
    assert doc["ranks"][0]["log_tail"] == [] and doc["ranks"][0]["last_output"] is None
    assert doc["ranks"][1]["last_output"] == pytest.approx(
        (run.path / "rank-1.log").stat().st_mtime
    )


def test_rank_states_come_from_status_json(runs: Path) -> None:
    run = make_run(runs, nodes=2, ppn=2, metrics=3)
    doc = RunView(run.path).snapshot()
    assert [r["state"] for r in doc["ranks"]] == ["running"] * 4 and not doc["ended"]
    assert doc["nodes"] == [{"host": "node0", "ranks": [0, 1]}, {"host": "node1", "ranks": [2, 3]}]
    assert [r["host"] for r in doc["ranks"]] == ["node0", "node0", "node1", "node1"]
    run.end("failed", {0: 0, 1: 3})
    doc = RunView(run.path).snapshot()
    states = [(r["state"], r["exit_code"]) for r in doc["ranks"]]
    assert states == [("succeeded", 0), ("failed", 3), ("failed", None), ("failed", None)]
    assert doc["ended"] and doc["run"]["state"] == "failed" and doc["run"]["exit_code"] == 3
    stopped = make_run(runs, nodes=1, ppn=3, metrics=1)
    stopped.end("stopped", {0: 143, 1: 0, 2: 2})  # the stop's SIGTERM; one rank had failed
    states = [(r["state"], r["exit_code"]) for r in RunView(stopped.path).snapshot()["ranks"]]
    assert states == [("stopped", 143), ("succeeded", 0), ("failed", 2)]
