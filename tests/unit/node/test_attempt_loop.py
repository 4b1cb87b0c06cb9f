"""The attempt loop of `run --max-restarts` without nodes (node/supervisor.py, which
foreground and detached runs share): its decisions (pure), the records it keeps, the
settings it reads, and a stop between attempts. The real restarts are in
tests/cluster/test_restart.py and tests/cluster/test_detach_restart.py."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

from cpuaccel.config.effective import resolve
from cpuaccel.config.project import parse_project
from cpuaccel.inventory.inventory import Inventory
from cpuaccel.jobs.foreground import plan_for
from cpuaccel.node import supervisor as attempts
from cpuaccel.node.supervisor import Attempt, AttemptLog, Failure, Outcome, decide


def attempt(k: int, reason: str = "failed", code: int | None = 3, rank: int | None = 0,
            host: str | None = "n1", resume: str | None = None) -> Attempt:  # fmt: skip
    return Attempt(k, 0.0, 1.0, reason, code, rank, host, ["n1", "n2"], resume)


def outcome(reason: str, code: int, rank: int | None = 0) -> Outcome:
    first = Failure(rank, "n1", code) if rank is not None else None
    return Outcome(code, reason, 1.0, code, first)


# ---------------------------------------------------------------- decide (pure)


@pytest.mark.parametrize("reason", ["failed", "lost", "hang"])
def test_a_failure_is_restarted_while_restarts_remain(reason: str) -> None:
    assert decide([attempt(0, reason)], 1, None).restart
    assert not decide([attempt(0, reason), attempt(1, reason, code=4)], 1, None).restart


@pytest.mark.parametrize("reason", ["completed", "interrupted", "terminated", "timeout"])
def test_an_ending_that_is_no_failure_is_never_restarted(reason: str) -> None:
    verdict = decide([attempt(0, reason, code=0)], 5, None)
    assert not verdict.restart and verdict.why is None


def test_without_restarts_nothing_is_said() -> None:
    verdict = decide([attempt(0)], 0, None)
    assert not verdict.restart and verdict.why is None


def test_the_last_restart_used_is_said() -> None:
    verdict = decide([attempt(0), attempt(1, code=4)], 1, None)
    assert not verdict.restart
    assert verdict.why == "attempt 1 failed (exit code 4, rank 0 on n1): no restart left"


def test_an_identical_failure_before_any_checkpoint_stops() -> None:
    verdict = decide([attempt(0), attempt(1)], 3, None)
    assert not verdict.restart
    assert verdict.why == (
        "attempt 1 failed as attempt 0 did (exit code 3, rank 0 on n1) before any "
        "checkpoint: not restarting it again"
    )


@pytest.mark.parametrize(
    ("second", "resume"),
    [
        (attempt(1, rank=1), None),  # another rank
        (attempt(1, code=137), None),  # another code
        (attempt(1, host="n2"), None),  # another node
        (attempt(1, "lost", code=255, rank=None), None),  # another way of failing
        (attempt(1, resume="/w/runs/x/ckpt-10.pt"), None),  # it resumed from a checkpoint
        (attempt(1), "/w/runs/x/ckpt-10.pt"),  # a checkpoint since: progress was made
    ],
)
def test_a_failure_that_differs_or_follows_progress_is_restarted(
    second: Attempt, resume: str | None
) -> None:
    assert decide([attempt(0), second], 3, resume).restart


def test_attempt_records_name_the_first_failing_rank_or_the_lost_node() -> None:
    failed = attempts.attempt_of(2, 10.0, outcome("failed", 3, rank=1), ["n1"], "/c.pt")
    assert (failed.attempt, failed.reason, failed.exit_code, failed.rank) == (2, "failed", 3, 1)
    assert failed.host == "n1" and failed.resume == "/c.pt" and failed.started == 10.0
    lost = Outcome(255, "lost", 1.0, None, None, lost=["n2"])
    record = attempts.attempt_of(0, 0.0, lost, ["n1", "n2"], None)
    assert (record.rank, record.host, record.why()) == (None, "n2", "lost, node n2")
    assert set(record.to_json()) == {
        "attempt", "started", "ended", "reason", "exit_code", "rank", "host", "hosts", "resume",
        "cause",
    }  # fmt: skip
    # The failing rank's root cause (torch's @record) goes with it.
    recorded = outcome("failed", 1, rank=1)
    assert recorded.first_failure is not None
    recorded.first_failure.cause = "ValueError: no data"
    assert attempts.attempt_of(0, 0.0, recorded, ["n1"], None).cause == "ValueError: no data"
    assert failed.cause is None and record.cause is None


# ---------------------------------------------------------------- the loop, with a fake job


class FakeJob(attempts.Attempts):
    """Attempts that end as scripted; records what the loop asked of it."""

    def __init__(self, endings: list[Outcome], ready: bool = True) -> None:
        self.endings = endings
        self.ready = ready
        self.hosts = ["n1", "n2"]
        self.calls: list[tuple[str, Any]] = []
        self.checkpoints = iter(["/w/runs/x/ckpt-10.pt", "/w/runs/x/ckpt-20.pt"])

    def run(self, k: int, resume: str | None) -> Outcome:
        self.calls.append(("run", (k, resume)))
        return self.endings[k]

    def preflight(self) -> bool:
        self.calls.append(("preflight", None))
        return self.ready

    def newest_checkpoint(self) -> str | None:
        return next(self.checkpoints)

    def recorded(self, history: Any) -> None:
        self.told = [a.to_json() for a in history]


class Said:
    """The loop's lines, as a side says them."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, level: str, text: str) -> None:
        self.lines.append(text)

    def text(self) -> str:
        return "".join(line + "\n" for line in self.lines)


def loop(job: FakeJob, tmp_path: Path, max_restarts: int) -> tuple[Outcome, str, AttemptLog]:
    said = Said()
    log = AttemptLog(str(tmp_path), world=2, restarts=max_restarts > 0)
    settings = attempts.Settings(max_restarts, 0.0, said)
    result = attempts.run_attempts(job, log, settings)
    return result, said.text(), log


def test_the_loop_restarts_from_the_newest_checkpoint(tmp_path: Path) -> None:
    job = FakeJob([outcome("failed", 3), outcome("failed", 3), outcome("completed", 0, None)])
    result, said, log = loop(job, tmp_path, 3)
    assert result.reason == "completed" and result.exit_code == 0
    assert job.calls == [
        ("run", (0, None)), ("preflight", None),
        ("run", (1, "/w/runs/x/ckpt-10.pt")), ("preflight", None),
        ("run", (2, "/w/runs/x/ckpt-20.pt")),
    ]  # fmt: skip
    assert "attempt 0 failed (exit code 3, rank 0 on n1): restarting in 0 s from " in said
    lines = (tmp_path / "attempts.jsonl").read_text().splitlines()
    assert [json.loads(line)["resume"] for line in lines] == [
        None, "/w/runs/x/ckpt-10.pt", "/w/runs/x/ckpt-20.pt"
    ]  # fmt: skip
    assert job.told == [a.to_json() for a in log.history]  # the run's record (run.json)
    assert (tmp_path / "rank-1.log").read_text() == "".join(
        f"--- attempt {k} ---\n" for k in range(3)
    )
    assert sorted(p.name for p in tmp_path.glob("attempt-*")) == [f"attempt-{k}" for k in range(3)]


def test_the_last_attempts_code_is_the_runs(tmp_path: Path) -> None:
    job = FakeJob([outcome("failed", 3), outcome("failed", 7, rank=1)])
    result, said, _ = loop(job, tmp_path, 1)
    assert result.exit_code == 7
    assert "attempt 1 failed (exit code 7, rank 1 on n1): no restart left" in said


def test_without_restarts_the_logs_are_as_before(tmp_path: Path) -> None:
    result, said, _ = loop(FakeJob([outcome("failed", 3)]), tmp_path, 0)
    assert result.exit_code == 3 and said == ""
    assert not list(tmp_path.glob("attempt-*")) and not (tmp_path / "rank-0.log").exists()
    assert len((tmp_path / "attempts.jsonl").read_text().splitlines()) == 1


def test_a_failed_preflight_ends_the_run_with_the_last_attempts_code(tmp_path: Path) -> None:
    job = FakeJob([outcome("lost", 255, None)], ready=False)
    result, said, _ = loop(job, tmp_path, 2)
    assert result.exit_code == 255 and result.reason == "lost"
    assert "not restarting: attempt 1's preflight failed" in said
    assert [c[0] for c in job.calls] == ["run", "preflight"]


def test_ctrl_c_during_the_delay_ends_the_run_cleanly(tmp_path: Path) -> None:
    job = FakeJob([outcome("failed", 3), outcome("completed", 0, None)])
    said = Said()
    log = AttemptLog(str(tmp_path), world=2, restarts=True)
    settings = attempts.Settings(2, 30.0, said)
    # Python's own handler, as a terminal starts it: a shell that runs pytest in the
    # background starts it with SIGINT ignored.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        result = attempts.run_attempts(job, log, settings)
        given_back = signal.getsignal(signal.SIGINT)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    assert (result.reason, result.exit_code) == ("interrupted", 130)
    assert [c[0] for c in job.calls] == ["run"]  # no preflight, no attempt 1
    assert "interrupted before the restart: no further attempt" in said.text()
    assert given_back is signal.default_int_handler


# ---------------------------------------------------------------- settings


def test_settings_come_from_the_flag_else_the_project_file_else_the_default(
    tmp_path: Path,
) -> None:
    inventory = Inventory.implicit()
    hosts = inventory.select(None)
    default = resolve({}, None, inventory, hosts)
    assert (default.max_restarts.value, default.restart_delay.value) == (0, 3.0)
    project = parse_project("max_restarts: 2\nrestart_delay: 0.5\n", "cpuaccel.yaml")
    filed = resolve({}, project, inventory, hosts)
    assert filed.max_restarts.where == "cpuaccel.yaml:1" and filed.max_restarts.value == 2
    assert filed.restart_delay.value == 0.5 and filed.restart_delay.where == "cpuaccel.yaml:2"
    flags = {"max_restarts": 5, "flag_names": {"max_restarts": "--max_restarts"}}
    flagged = resolve(flags, project, inventory, hosts)
    assert flagged.max_restarts.value == 5 and flagged.max_restarts.where == "--max_restarts"


def test_attempt_k_tells_its_ranks_which_it_is() -> None:
    from cpuaccel.jobs.plan import Script, build_plan

    inventory = Inventory.implicit()
    settings = resolve({"ppn": 1}, None, inventory, inventory.select(None))
    plan = build_plan(settings, Script("t.py", (), "p"), None, "r1")
    first = plan_for(plan, 0, None)
    assert first.env["CPUACCEL_RESTART"] == "0" and "CPUACCEL_RESUME" not in first.env
    again = plan_for(first, 2, "/w/runs/r1/ckpt.pt")
    assert again.env["CPUACCEL_RESTART"] == "2"
    assert again.env["CPUACCEL_RESUME"] == "/w/runs/r1/ckpt.pt"
    assert plan_for(plan, 3, None).env.get("CPUACCEL_RESUME") is None
    assert "CPUACCEL_RESTART" not in plan.env  # the plan itself is left as it was
    # --env CPUACCEL_RESUME=<another run's checkpoint>: attempt 0 starts from it, and so
    # does a restart before this run saved a checkpoint of its own (a regression: the
    # first attempt used to drop it).
    given = dataclasses.replace(plan, env={**plan.env, "CPUACCEL_RESUME": "/w/runs/r0/c.pt"})
    assert plan_for(given, 0, None).env["CPUACCEL_RESUME"] == "/w/runs/r0/c.pt"
    assert plan_for(given, 1, None).env["CPUACCEL_RESUME"] == "/w/runs/r0/c.pt"
    assert plan_for(given, 1, "/w/runs/r1/c.pt").env["CPUACCEL_RESUME"] == ("/w/runs/r1/c.pt")


# ---------------------------------------------------------------- report


def restarted_run(tmp_path: Path, checkpoints: bool) -> Path:
    """Steps 1-40 logged by attempt 0 (times 100-139), then attempt 1 (started at 150)
    resumed from step 30's checkpoint and logged 31-60."""
    run_dir = tmp_path / "20260101-000000-abcdef"
    run_dir.mkdir()
    lines = [{"step": s, "loss": 3.0 - s / 100, "time": 99.0 + s} for s in range(1, 41)]
    lines += [{"step": s, "loss": 3.0 - s / 100, "time": 120.0 + s} for s in range(31, 61)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    ckpt = "/w/runs/r/ckpt-30.pt"
    (run_dir / "attempts.jsonl").write_text(
        json.dumps(attempt(0).to_json() | {"started": 90.0}) + "\n"
        + json.dumps(attempt(1, "completed", 0, None, None, ckpt).to_json() | {"started": 150.0})
        + "\n"
    )  # fmt: skip
    if checkpoints:
        record = {"path": ckpt, "step": 30, "sha256": "0" * 64, "size": 1, "time": 140.0}
        (run_dir / "checkpoints.jsonl").write_text(json.dumps(record) + "\n")
    return run_dir


@pytest.mark.parametrize(("checkpoints", "step"), [(True, 30), (False, 31)])
def test_report_marks_each_restart_on_the_loss_plot(
    tmp_path: Path, checkpoints: bool, step: int
) -> None:
    from cpuaccel.history import plot as report_plot
    from cpuaccel.history.metrics import read_metrics, read_restarts, read_run_info

    run_dir = restarted_run(tmp_path, checkpoints)
    metrics = read_metrics(run_dir)
    info = read_run_info(run_dir)
    read_restarts(run_dir, metrics, info)
    assert info.restarts == [(1, step)]  # the checkpoint's step, else the first one logged
    described = report_plot.describe(report_plot.build_figure(metrics, info, "r"))
    assert [p["restarts"] for p in described["panels"]] == [[step], []]  # the loss panel


def test_report_summary_lists_the_restarts(tmp_path: Path) -> None:
    from testsupport.command import cpuaccel

    run_dir = restarted_run(tmp_path, True)
    shown = cpuaccel("report", str(run_dir))
    assert shown.returncode == 0, shown.stderr
    assert "restarts   attempt 1 from step 30" in shown.stdout
    proc = cpuaccel("report", str(run_dir), "--json")
    assert json.loads(proc.stdout)["restarts"] == [{"attempt": 1, "step": 30}]


@pytest.mark.parametrize(
    ("count", "state", "restarts"),
    [(None, "succeeded", 0), (1, "failed", 0), (2, "succeeded", 1), (1, "running", 1)],
)
def test_ps_counts_the_restarts(count: int | None, state: str, restarts: int) -> None:
    from cpuaccel.history import records as run_rows

    record = {} if count is None else {"attempts": [attempt(k).to_json() for k in range(count)]}
    assert run_rows.restarts(record, state) == restarts
