"""A run's records read as ps, logs, stop and the dashboard read them: a record nested
too deep (a status.json brought home by fetch, a line of metrics.jsonl) is left out
with a one-line reason, and the run is shown from the rest."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from cpuaccel.errors import EXIT_OK, UsageError
from cpuaccel.history import records
from cpuaccel.jobs import teardown
from testsupport.command import cpuaccel
from testsupport.fake_run import make_run

DEEP = "[" * 3000
WHY = "values nested more than 200 levels deep"


def test_a_status_json_too_deep_is_a_problem_of_the_run_not_a_traceback(tmp_path: Path) -> None:
    run = make_run(tmp_path / "runs", metrics=5, state="succeeded")
    (run.path / "status.json").write_text('{"state": ' + DEEP)
    loaded = records.load(run.path)
    assert loaded.status is None and loaded.record["run_id"] == run.run_id
    assert loaded.problems == (f"status.json: not read: {WHY}",)
    found = records.row(loaded, time.time())
    assert found["state"] == "succeeded"  # run.json's exit code and reason
    assert found["problems"] == [f"status.json: not read: {WHY}"] and found["step"] == 4


def test_the_last_metrics_line_too_deep_is_skipped(tmp_path: Path) -> None:
    run = make_run(tmp_path / "runs", metrics=5)
    with (run.path / "metrics.jsonl").open("a") as f:
        f.write(DEEP + "\n")
    assert records.last_metrics(run.path)[0] == 4
    (run.path / "metrics.jsonl").write_text("[" * 900 + "]" * 900 + "\n")  # json parses it
    assert records.last_metrics(run.path) == (None, None)


def test_stop_names_a_run_json_that_is_not_read(tmp_path: Path) -> None:
    run = make_run(tmp_path / "runs", metrics=1)
    (run.path / "run.json").write_text(DEEP)
    with pytest.raises(UsageError, match=f"run.json: not read: {WHY}: not a run record"):
        teardown.read_record(run.path)


def test_ps_shows_every_run_and_says_which_record_it_left_out(tmp_path: Path) -> None:
    """Before: one such run made `ps` a RecursionError traceback for all of them."""
    runs = tmp_path / "runs"
    deep_status = make_run(runs, "20250101-000000-aaaaaa", metrics=3, state="succeeded")
    deep_metrics = make_run(runs, "20250102-000000-bbbbbb", metrics=3, state="failed")
    fine = make_run(runs, "20250103-000000-cccccc", metrics=3, state="succeeded")
    (deep_status.path / "status.json").write_text(DEEP)
    with (deep_metrics.path / "metrics.jsonl").open("a") as f:
        f.write(DEEP + "\n")
    for args in ((), ("--json",)):
        proc = cpuaccel("ps", *args, cwd=tmp_path)
        assert proc.returncode == EXIT_OK, proc.stderr
        assert "Traceback" not in proc.stderr
        warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning:")]
        assert warnings == [f"warning: run {deep_status.run_id}: status.json: not read: {WHY}"]
    rows = {r["id"]: r for r in json.loads(proc.stdout)}
    assert set(rows) == {deep_status.run_id, deep_metrics.run_id, fine.run_id}
    assert rows[deep_metrics.run_id]["step"] == 2 and rows[deep_metrics.run_id]["problems"] == []
    assert rows[fine.run_id]["problems"] == []
