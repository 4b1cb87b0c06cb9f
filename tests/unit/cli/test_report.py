"""`cpuaccel report RUN_DIR` as a user meets it: a PNG, a summary, clear errors."""

from __future__ import annotations

import json
import math
import statistics
import struct
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from cpuaccel.errors import EXIT_USAGE
from testsupport.command import cpuaccel as run_cpuaccel

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def cpuaccel(*args: str, prelude: str = "") -> subprocess.CompletedProcess[str]:
    """`cpuaccel ARGS` in a fresh interpreter; PRELUDE runs first (to hide a module)."""
    return run_cpuaccel(*args, prelude=prelude, timeout=120)


def training_records(steps: int = 50) -> list[dict[str, Any]]:
    """Metrics like a real run's: loss falling with noise, a slow first step, sync time."""
    records = []
    for step in range(1, steps + 1):
        wobble = math.sin(step * 1.7)
        step_time = (0.35 if step == 1 else 0.08) + 0.004 * wobble
        records.append(
            {
                "step": step,
                "loss": 5.5 * math.exp(-step / 12) + 2.0 + 0.05 * wobble,
                "samples_per_s": 32 / step_time,
                "step_time": step_time,
                "grad_sync_seconds": 0.003 + 0.0005 * wobble,
                "lr": 3e-4,  # other keys are allowed and ignored
            }
        )
    return records


def write_run(tmp_path: Path, lines: Sequence[str], name: str = "20250101-120000-abc123") -> Path:
    run_dir = tmp_path / "runs" / name
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(f"{line}\n" for line in lines))
    return run_dir


def assert_valid_png(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, data[:16]
    assert len(data) > 20_000, len(data)  # two panels of lines and labels, not a blank image
    assert data[12:16] == b"IHDR" and data[-8:-4] == b"IEND"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_report_writes_png_and_summary(tmp_path: Path) -> None:
    records = training_records()
    run_dir = write_run(tmp_path, [json.dumps(r) for r in records])
    proc = cpuaccel("report", str(run_dir))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr == ""
    png = run_dir / "report.png"
    # Four panels: loss, samples/s, and the logged learning rate and gradient-sync share.
    assert assert_valid_png(png) == (800, 1050)
    assert sorted(p.name for p in run_dir.iterdir()) == ["metrics.jsonl", "report.png"]

    losses = [r["loss"] for r in records]
    best = min(range(len(losses)), key=losses.__getitem__)
    # The first line is the warm-up (its slow first step): the medians leave it out.
    rate = statistics.median(r["samples_per_s"] for r in records[1:])
    step_ms = 1000 * statistics.median(r["step_time"] for r in records[1:])
    share = sum(r["grad_sync_seconds"] for r in records) / sum(r["step_time"] for r in records)
    lines = proc.stdout.splitlines()
    assert lines == [
        f"run        {run_dir}",
        "steps      50 (step 1 to 50)",
        f"loss       first {losses[0]:.4f}, last {losses[-1]:.4f}, "
        f"min {losses[best]:.4f} at step {best + 1}",
        f"samples/s  median {rate:.1f} (leaves out 1 warm-up step, as tune does)",
        f"step time  median {step_ms:.1f} ms (leaves out 1 warm-up step, as tune does)",
        f"grad sync  {share:.1%} of step time",
        "lr         first 0.0003, last 0.0003",
        f"plot       {png}",
    ]
    # The noise puts the minimum before the last step: min is not just "last".
    assert losses[best] < losses[-1]


def test_report_json(tmp_path: Path) -> None:
    records = training_records(30)
    run_dir = write_run(tmp_path, [json.dumps(r) for r in records])
    proc = cpuaccel("report", str(run_dir), "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads(proc.stdout)
    losses = [r["loss"] for r in records]
    assert summary == {
        "run_dir": str(run_dir),
        "metrics": str(run_dir / "metrics.jsonl"),
        "png": str(run_dir / "report.png"),
        "steps": 30,
        "first_step": 1,
        "last_step": 30,
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "loss_min": min(losses),
        "loss_min_step": losses.index(min(losses)) + 1,
        "samples_per_s_median": pytest.approx(
            statistics.median(r["samples_per_s"] for r in records[1:])
        ),
        "samples_per_s_warmup": 1,
        "step_time_median": pytest.approx(statistics.median(r["step_time"] for r in records[1:])),
        "step_time_warmup": 1,
        "sync_share": pytest.approx(
            sum(r["grad_sync_seconds"] for r in records) / sum(r["step_time"] for r in records)
        ),
        "lines": 30,
        "lr_first": 3e-4,
        "lr_last": 3e-4,
        # No run.json, status.json or runtime first line in this folder: not known.
        "nodes": None,
        "ppn": None,
        "world": None,
        "precision": None,
        "wall_seconds": None,
        "state": None,
        "title": "20250101-120000-abc123: 30 steps",
        "panels": ["loss", "samples/s", "learning rate", "grad sync share"],
        "skipped_partial_last_line": False,
    }
    assert_valid_png(run_dir / "report.png")


def test_report_with_loss_only_and_sync_time_name(tmp_path: Path) -> None:
    """Only step and loss are required; "sync_time" is the other name of the sync seconds."""
    plain = write_run(tmp_path, ['{"step": 1, "loss": 3.0}', '{"step": 2, "loss": 2.5}'], "a")
    proc = cpuaccel("report", str(plain), "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["samples_per_s_median"] is None and summary["step_time_median"] is None
    assert summary["sync_share"] is None
    assert (summary["loss_first"], summary["loss_last"], summary["loss_min"]) == (3.0, 2.5, 2.5)
    assert_valid_png(plain / "report.png")
    text = cpuaccel("report", str(plain)).stdout
    assert "samples/s  - (not in metrics)" in text and "grad sync" not in text

    timed = write_run(
        tmp_path,
        [json.dumps({"step": s, "loss": 1.0, "step_time": 0.5, "sync_time": 0.05}) for s in (1, 2)],
        "b",
    )
    summary = json.loads(cpuaccel("report", str(timed), "--json").stdout)
    assert summary["sync_share"] == pytest.approx(0.1)
    assert summary["step_time_median"] == 0.5


def test_a_warm_up_spike_does_not_move_the_median(tmp_path: Path) -> None:
    rates = [5000.0, 100.0, 110.0, 90.0]  # the first step: a warm-up measured oddly
    lines = [
        json.dumps({"step": s, "loss": 1.0, "samples_per_s": r, "step_time": 32 / r})
        for s, r in enumerate(rates, start=1)
    ]
    run_dir = write_run(tmp_path, lines)
    proc = cpuaccel("report", str(run_dir))
    assert proc.returncode == 0, proc.stderr
    assert "samples/s  median 100.0 (leaves out 1 warm-up step, as tune does)" in proc.stdout
    one = write_run(tmp_path, [lines[0]], "one")
    text = cpuaccel("report", str(one)).stdout
    assert "samples/s  median 5000.0\n" in text  # a single line is all there is


def test_report_keeps_a_run_whose_last_line_was_cut_short(tmp_path: Path) -> None:
    """A job killed while writing a line leaves it unfinished, without its newline."""
    run_dir = write_run(tmp_path, [json.dumps(r) for r in training_records(10)])
    with (run_dir / "metrics.jsonl").open("a") as metrics:
        metrics.write('{"step": 11, "loss": 2.')
    proc = cpuaccel("report", str(run_dir), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["steps"] == 10
    assert json.loads(proc.stdout)["skipped_partial_last_line"] is True
    assert "left out its last line, cut short" in proc.stderr


def _bad_metrics(tmp_path: Path, text: str) -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text(text)
    return run_dir


def _made(path: Path, text: str | None = None) -> Path:
    """A folder, or a file holding TEXT."""
    if text is None:
        path.mkdir()
    else:
        path.write_text(text)
    return path


GOOD = '{"step": 1, "loss": 2.0}\n'


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda t: t / "nope", "{run}: no such run directory"),
        (lambda t: _made(t / "file", "a file"), "{run}: not a directory"),
        (lambda t: _made(t / "run"), "{run}/metrics.jsonl: no such file"),
        (lambda t: _bad_metrics(t, ""), "{run}/metrics.jsonl: holds no metrics"),
        (lambda t: _bad_metrics(t, "\n\n"), "{run}/metrics.jsonl: holds no metrics"),
        (
            lambda t: _bad_metrics(t, GOOD * 2 + '{"step": 3, "loss": }\n' + GOOD),
            "{run}/metrics.jsonl:3: not valid JSON",
        ),
        (lambda t: _bad_metrics(t, GOOD + "[1, 2]\n"), "{run}/metrics.jsonl:2: expected a JSON"),
        (lambda t: _bad_metrics(t, '{"step": 1}\n'), '{run}/metrics.jsonl:1: no "loss"'),
        (lambda t: _bad_metrics(t, '{"loss": 1.0}\n'), '{run}/metrics.jsonl:1: no "step"'),
        (
            lambda t: _bad_metrics(t, GOOD + '{"step": 2, "loss": "high"}\n'),
            '{run}/metrics.jsonl:2: "loss" is "high", not a number',
        ),
        (
            lambda t: _bad_metrics(t, '{"step": 1, "loss": 2, "samples_per_s": true}\n'),
            '{run}/metrics.jsonl:1: "samples_per_s" is true, not a number',
        ),
        (  # json's parser recursed into a RecursionError: a traceback, before the bound
            lambda t: _bad_metrics(t, GOOD + "[" * 3000 + "\n" + GOOD),
            "{run}/metrics.jsonl:2: values nested more than 200 levels deep",
        ),
    ],
    ids=[
        "missing-folder", "a-file", "no-metrics-file", "empty-file", "blank-lines",
        "bad-json-line-3", "not-an-object", "no-loss", "no-step", "loss-a-string",
        "rate-a-bool", "line-nested-too-deep",
    ],
)  # fmt: skip
def test_bad_input_is_one_message_and_exit_64(tmp_path: Path, make: Any, message: str) -> None:
    run_dir = make(tmp_path)
    proc = cpuaccel("report", str(run_dir))
    assert proc.returncode == EXIT_USAGE, proc.stdout + proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.startswith(f"error: {message.format(run=run_dir)}"), proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.splitlines()) <= 2  # the message and at most one "fix:" line
    assert not (tmp_path / "run" / "report.png").exists()


def test_missing_matplotlib_says_how_to_install_it(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path, [json.dumps(r) for r in training_records(5)])
    hide = "import sys; sys.modules['matplotlib'] = None  # import matplotlib fails"
    proc = cpuaccel("report", str(run_dir), prelude=hide)
    assert proc.returncode == EXIT_USAGE, proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == [
        "error: cpuaccel report needs matplotlib, which is not installed",
        "  fix: pip install 'cpuaccel[report]'",
    ]
    assert not (run_dir / "report.png").exists()


def test_cli_does_not_import_matplotlib_until_report_runs() -> None:
    code = (
        "import sys, cpuaccel.cli.main; print(sorted(m for m in sys.modules if 'matplotlib' in m))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
    top = cpuaccel("--help")
    assert top.returncode == 0 and "report" in top.stdout and "cpuaccel report  " in top.stdout
    sub = cpuaccel("report", "--help")
    assert sub.returncode == 0 and "--json" in sub.stdout and "Exit codes" in sub.stdout


def test_records_nested_too_deep_are_left_out_with_a_warning(tmp_path: Path) -> None:
    """run.json and status.json too deep (a status.json brought home by fetch), and a
    line of checkpoints.jsonl and attempts.jsonl: the report is written from the rest."""
    run_dir = write_run(tmp_path, [json.dumps(r) for r in training_records(10)])
    (run_dir / "run.json").write_text('{"hosts": ' + "[" * 3000 + "}")
    (run_dir / "status.json").write_text("[" * 900 + "]" * 900)  # json parses it: too deep
    (run_dir / "attempts.jsonl").write_text("[" * 3000 + "\n")
    (run_dir / "checkpoints.jsonl").write_text("[" * 3000 + "\n")
    proc = cpuaccel("report", str(run_dir), "--json")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["steps"] == 10 and summary["nodes"] is None and summary["state"] is None
    for name in ("run.json", "status.json"):
        assert f"{run_dir / name}: left out, values nested more than 200 levels deep" in (
            proc.stderr
        ), proc.stderr


@pytest.mark.parametrize("detached", [False, True], ids=["run.json", "status.json"])
def test_report_names_a_failed_rank_s_root_cause(tmp_path: Path, detached: bool) -> None:
    run_dir = write_run(tmp_path, [json.dumps(r) for r in training_records(5)])
    # A node wrote it: a control character in it is shown as a space.
    failure = {"rank": 1, "host": "node2", "cause": "ValueError: no\x1b[31m data"}
    if detached:
        attempt = {"attempt": 0, "reason": "failed", "exit_code": 1, **failure}
        (run_dir / "status.json").write_text(json.dumps({"attempts": [attempt]}))
    else:
        (run_dir / "run.json").write_text(json.dumps({"first_failure": {**failure, "code": 1}}))
    proc = cpuaccel("report", str(run_dir))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "root cause ValueError: no [31m data: rank 1 on node2 (exit code 1)" in proc.stdout
    shown = json.loads(cpuaccel("report", str(run_dir), "--json").stdout)
    assert shown["root_cause"] == {
        "rank": 1, "host": "node2", "exit_code": 1, "cause": "ValueError: no [31m data"
    }  # fmt: skip
    # A failure without a cause (no @record) adds nothing.
    (run_dir / "run.json").write_text(json.dumps({"first_failure": {"rank": 1, "code": 1}}))
    (run_dir / "status.json").unlink(missing_ok=True)
    assert "root_cause" not in json.loads(cpuaccel("report", str(run_dir), "--json").stdout)
