"""A detached run's restarts, the parts without nodes: the judgement shared with the
foreground loop (one copy, in stdlib node parts), the head's own checkpoints read as the
controller reads a node's, env.sh rewritten for the next attempt, and the supervisor's
attempt loop on a run folder of this machine (no other node).

On the nodes: tests/cluster/test_detach_restart.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from cpuaccel import node
from cpuaccel.jobs import foreground
from cpuaccel.node import checkpoints, detached, supervisor
from cpuaccel.node.supervisor import Attempt
from tests.unit.node.test_supervisor import RUN_ID, final_status, make_run, new_run_id


def test_the_loop_the_rule_and_the_choice_have_one_copy() -> None:
    assert issubclass(foreground.ForegroundRun, supervisor.Supervised)
    assert issubclass(detached.HeadRun, supervisor.Supervised)
    assert foreground.choose is checkpoints.choose
    assert {"supervisor", "checkpoints"} <= set(node.parts("detached"))


def _checkpoint(run_dir: Path, name: str, step: int, data: bytes) -> dict[str, Any]:
    (run_dir / name).write_bytes(data)
    return {
        "path": str(run_dir / name), "step": step, "sha256": hashlib.sha256(data).hexdigest(),
        "size": len(data), "time": time.time() + 1, "rank": 0, "host": "here",
    }  # fmt: skip


def test_the_heads_checkpoints_are_read_as_the_controller_reads_a_node(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / RUN_ID
    run_dir.mkdir(parents=True)
    lines = [_checkpoint(run_dir, "a.pt", 10, b"a" * 10), _checkpoint(run_dir, "b.pt", 20, b"b")]
    text = "\n".join(json.dumps(line) for line in lines) + "\nnot json\n"
    (run_dir / checkpoints.RECORDS).write_text(text)
    found = checkpoints.host_of("here", str(run_dir), **checkpoints.gather_here(str(run_dir)))
    assert sorted(found.records) == ["a.pt", "b.pt"]
    assert found.reasons == [f"{checkpoints.RECORDS} line 3: not JSON: ignored"]
    assert checkpoints.choose([found], str(run_dir)).path == str(run_dir / "b.pt")
    # A node without b.pt whole: a.pt is the newest complete on both.
    listing = [["a.pt", 10, 1.0], [checkpoints.RECORDS, len(text), 1.0]]
    other = checkpoints.host_of("there", str(run_dir), listing, text)
    assert checkpoints.choose([found, other], str(run_dir)).path == str(run_dir / "a.pt")
    assert checkpoints.gather_here(str(tmp_path / "runs" / "missing")) == {
        "files": None, "tail": None,
    }  # fmt: skip


def test_a_long_record_file_is_read_from_its_tail_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = tmp_path / "runs" / RUN_ID
    run_dir.mkdir(parents=True)
    line = json.dumps(_checkpoint(run_dir, "c.pt", 5, b"c"))
    (run_dir / checkpoints.RECORDS).write_text("x" * 300 + "\n" + line + "\n")
    monkeypatch.setattr(checkpoints, "TAIL", len(line) + 10)
    found = checkpoints.host_of("here", str(run_dir), **checkpoints.gather_here(str(run_dir)))
    assert list(found.records) == ["c.pt"]
    assert found.reasons == [f"{checkpoints.RECORDS} is {len(line) + 302} bytes: "
                             f"only its last {len(line) + 10} read"]  # fmt: skip


def test_records_that_cannot_be_read_give_no_checkpoint_and_no_crash(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / RUN_ID
    run_dir.mkdir(parents=True)
    os.mkfifo(run_dir / checkpoints.RECORDS)  # would hang a plain open(): not read
    found = checkpoints.host_of("here", str(run_dir), **checkpoints.gather_here(str(run_dir)))
    assert found.records == {} and found.files == {}
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / "runs" / "linked")  # never followed
    linked = str(tmp_path / "runs" / "linked")
    found = checkpoints.host_of("here", linked, **checkpoints.gather_here(linked))
    assert found.files is None and found.reasons == [f"no run folder {linked}"]


def _sourced(run_dir: Path) -> str:
    script = f'. {run_dir}/env.sh; echo "$A|$CPUACCEL_RESTART|${{CPUACCEL_RESUME-unset}}"'
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True).stdout.strip()


def test_each_attempt_rewrites_its_own_lines_at_the_end_of_env_sh(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "env.sh").write_text("export A=1\nexport CPUACCEL_RESTART=0\n")
    os.chmod(run_dir / "env.sh", 0o600)
    detached.set_attempt_env(str(run_dir), 1, None)
    assert _sourced(run_dir) == "1|1|unset"
    detached.set_attempt_env(str(run_dir), 2, "/w/runs/x/it's here.pt")
    assert _sourced(run_dir) == "1|2|/w/runs/x/it's here.pt"
    text = (run_dir / "env.sh").read_text()
    assert text.startswith("export A=1\nexport CPUACCEL_RESTART=0\n")
    assert text.count(detached.ENV_MARK) == 1  # attempt 1's lines replaced, not kept
    assert (run_dir / "env.sh").stat().st_mode & 0o777 == 0o600


def test_the_attempt_record_keeps_each_attempts_logs(tmp_path: Path) -> None:
    files = supervisor.AttemptLog(str(tmp_path), 1, restarts=True)
    (tmp_path / "rank-0.log").write_text("before\n")
    files.begin(0)
    with (tmp_path / "rank-0.log").open("a") as log:
        log.write("during\n")
    attempt = Attempt(0, 1.0, 2.0, "failed", 3, 0, "h", ["h"], None)
    files.end(attempt)
    assert (tmp_path / "rank-0.log").read_text() == "before\n--- attempt 0 ---\nduring\n"
    assert (tmp_path / "attempt-0" / "rank-0.log").read_text() == "during\n"
    assert (tmp_path / "attempt-0" / "launcher.log").read_text() == ""
    line = json.loads((tmp_path / supervisor.ATTEMPTS).read_text())
    assert line == attempt.to_json() and list(line) == [
        "attempt", "started", "ended", "reason", "exit_code", "rank", "host", "hosts", "resume",
        "cause",
    ]  # fmt: skip


# A launch.sh as rendered: env.sh sourced; rank 1 fails in attempt 0 (after a checkpoint
# was recorded), and succeeds in the next.
KILLED_ONCE = """\
. {run_dir}/env.sh
echo "[rank 0 h] attempt $CPUACCEL_RESTART ${{CPUACCEL_RESUME-none}}"
if [ "$CPUACCEL_RESTART" = 0 ]; then
    echo '[rank 1 h] [cpuaccel] exit code 137'; exec sleep 60
fi
echo '[rank 0 h] [cpuaccel] exit code 0'; echo '[rank 1 h] [cpuaccel] exit code 0'
"""


def restarting_run(tmp_path: Path, launch: str, max_restarts: int, delay: float) -> Path:
    """A detached run under a new id; ``launch`` may name its folder as ``{run_dir}``."""
    run_id = new_run_id()
    launch = launch.format(run_dir=tmp_path / "runs" / run_id)
    run_dir = Path(make_run(tmp_path, launch, run_id=run_id))
    config = json.loads((run_dir / "supervisor.json").read_text())
    config.update(max_restarts=max_restarts, restart_delay=delay, hosts=["here"], ppn=2)
    (run_dir / "supervisor.json").write_text(json.dumps(config))
    (run_dir / "env.sh").write_text("export CPUACCEL_RESTART=0\n")
    return run_dir


def test_the_supervisor_restarts_a_failed_attempt_from_the_checkpoint(tmp_path: Path) -> None:
    run_dir = restarting_run(tmp_path, KILLED_ONCE, 2, 0.2)
    record = _checkpoint(run_dir, "checkpoint.pt", 10, b"state")
    (run_dir / checkpoints.RECORDS).write_text(json.dumps(record) + "\n")
    detached.start(str(run_dir))
    status = final_status(str(run_dir))
    log = (run_dir / "supervisor.log").read_text()
    assert (status["state"], status["exit_code"], status["ended_by"]) == (
        "succeeded", 0, "completed",
    ), log  # fmt: skip
    found = status["attempts"]
    assert [(a["attempt"], a["reason"], a["exit_code"], a["rank"], a["host"]) for a in found] == [
        (0, "failed", 137, 1, "here"), (1, "completed", 0, None, None),
    ]  # fmt: skip
    assert found[1]["resume"] == str(run_dir / "checkpoint.pt")
    lines = (run_dir / supervisor.ATTEMPTS).read_text().splitlines()
    assert [json.loads(line) for line in lines] == found
    assert (run_dir / "attempt-0" / "rank-0.log").read_text() == "attempt 0 none\n"
    copy = (run_dir / "attempt-1" / "rank-0.log").read_text()
    assert copy == f"attempt 1 {run_dir}/checkpoint.pt\n"
    assert "attempt 0 failed (exit code 137, rank 1 on here): restarting in 0.2 s" in log
    assert status["ranks"] == {"0": 0, "1": 0} and status["attempt"] == 1


def test_an_identical_failure_stops_and_a_stop_ends_the_wait(tmp_path: Path) -> None:
    same = "echo '[rank 0 h] [cpuaccel] exit code 7'\nexec sleep 60\n"
    run_dir = restarting_run(tmp_path / "a", same, 3, 0.1)
    detached.start(str(run_dir))
    status = final_status(str(run_dir))
    assert (status["state"], status["exit_code"], status["ended_by"]) == ("failed", 7, "rank 0")
    assert [a["attempt"] for a in status["attempts"]] == [0, 1]
    log = (run_dir / "supervisor.log").read_text()
    assert "attempt 1 failed as attempt 0 did (exit code 7, rank 0 on here)" in log
    # `cpuaccel stop` during the delay: stopped, no further attempt.
    run_dir = restarting_run(tmp_path / "b", same, 3, 60)
    pid = detached.start(str(run_dir))["pid"]
    deadline = time.monotonic() + 30
    while "restarting in 60 s" not in (run_dir / "supervisor.log").read_text():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert detached.stop(run_dir.name, pid, 10) == {"signalled": True, "alive": False}
    status = final_status(str(run_dir))
    assert (status["state"], status["exit_code"], status["ended_by"]) == ("stopped", 143, "stop")
    assert len(status["attempts"]) == 1


def test_ps_counts_a_detached_runs_restarts_from_its_status() -> None:
    from cpuaccel.history.records import restarts as counted

    status = {"attempts": [{"attempt": 0}, {"attempt": 1}]}
    assert counted({}, "succeeded", status) == 1
    assert counted({}, "running", status) == 2  # in its third attempt
    assert counted({"attempts": [{"attempt": 0}]}, "failed", status) == 0  # run.json's first
    assert counted({}, "succeeded", None) == 0
