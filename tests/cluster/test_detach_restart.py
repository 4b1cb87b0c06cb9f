"""`run --detach --max-restarts N` against real nodes: the head's supervisor runs the
attempt loop itself (node/supervisor.py, its side node/detached.py).

- 2 nodes x 1, examples/train.py in fp32 (tiny), a checkpoint every 5 steps; rank 1 is
  killed (SIGKILL) at step 12 of attempt 0: attempt 1 resumes from the step-10
  checkpoint and the run ends succeeded, 2 attempts in status.json and attempts.jsonl,
  `ps` showing it;
- a script that fails at once every time: the repeat is recognised, the run stops with
  the script's exit code;
- a node that no longer answers between attempts ends the run as failed, named.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from cpuaccel.errors import EXIT_OK
from cpuaccel.node.detached import HOLD_BEAT
from cpuaccel.testbed.cluster import Cluster
from tests.cluster.fixtures import REPO, TREE, link_down, train_args
from tests.cluster.test_detach import WORKDIR, assert_nothing_left, head_file, wait_until
from tests.cluster.test_resume import node_path
from testsupport.command import cpuaccel
from testsupport.runs import ENV, cpuaccel_run, job_processes, make_project

pytestmark = pytest.mark.cluster

TRAIN = train_args(steps=30, save_every=5, log_every=1)

# Rank 1 dies (SIGKILL, as the OOM killer does it) right after ctx.log at step DIE_AT
# of the first attempt only (tests/cluster/test_resume.py's DIE dies in every attempt).
DIE_ONCE = """\
import os, runpy, signal, sys
from cpuaccel.runtime.context import Context

die_at = int(sys.argv.pop(1))
log = Context.log

def log_then_die(self, step=None, **values):
    line = log(self, step, **values)
    if step == die_at and self.rank == 1 and self.restart == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    return line

Context.log = log_then_die
here = os.path.dirname(os.path.abspath(__file__))
sys.argv[0] = os.path.join(here, "train.py")
runpy.run_path(sys.argv[0], run_name="__main__")
"""

# Rank 0 fails at once, every attempt; rank 1 waits to be ended.
FAILS = """\
import os, sys, time
print("attempt", os.environ["CPUACCEL_RESTART"], flush=True)
if os.environ["RANK"] == "1":
    time.sleep(60)
sys.exit(7)
"""

SLEEPS_THEN_FAILS = """\
import os, sys, time
print("attempt", os.environ["CPUACCEL_RESTART"], flush=True)
time.sleep(3)
sys.exit(5)
"""


def detached(proj: Path, inventory: str, *args: str) -> str:
    """`run --detach` on node1 + node2, one rank each; the run id it printed."""
    run = cpuaccel_run(
        proj, "-i", inventory, "--nodes", "2", "--ppn", "1", "--detach", *TREE, *args,
        timeout=300,
    )  # fmt: skip
    assert run.code == EXIT_OK, run
    return run.stdout.strip()


def ended(cluster: Cluster, run_id: str, timeout: float = 300) -> dict[str, Any]:
    def status() -> dict[str, Any] | None:
        text = head_file(cluster, run_id, "status.json")
        doc: dict[str, Any] | None = json.loads(text) if text else None
        return doc if doc and doc["state"] != "running" else None

    found = wait_until(status, timeout=timeout, step=0.5)
    assert found, (run_id, head_file(cluster, run_id, "supervisor.log"))
    return found


def head_attempts(cluster: Cluster, run_id: str) -> list[dict[str, Any]]:
    text = head_file(cluster, run_id, "attempts.jsonl") or ""
    return [json.loads(line) for line in text.splitlines()]


def test_a_killed_rank_is_restarted_by_the_head_from_the_checkpoint(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    example = (REPO / "examples" / "train.py").read_text()
    proj = make_project(tmp_path, {"train.py": example, "die.py": DIE_ONCE})
    run_id = detached(
        proj, inventory, "--max-restarts", "1", "--restart-delay", "1", "die.py", "12", *TRAIN
    )
    status = ended(cluster, run_id)
    log = head_file(cluster, run_id, "supervisor.log")
    assert status["state"] == "succeeded" and status["exit_code"] == 0, (status, log)
    run_dir = f"{WORKDIR}/runs/{run_id}"
    attempts = status["attempts"]
    assert [(a["attempt"], a["reason"]) for a in attempts] == [(0, "failed"), (1, "completed")]
    # The first failure reported: rank 1's SIGKILL, or rank 0's error when its peer
    # vanished, if that reached the head first (rank 1's report comes through ssh).
    first = (attempts[0]["rank"], attempts[0]["host"], attempts[0]["exit_code"])
    assert first in ((1, "node2", 137), (0, "node1", 1)), attempts
    assert attempts[0]["resume"] is None and attempts[0]["hosts"] == ["node1", "node2"]
    assert attempts[1]["resume"] == f"{run_dir}/checkpoint.pt", attempts
    assert head_attempts(cluster, run_id) == attempts
    # The second attempt's ranks were told (env.sh on each node) and resumed at step 10.
    resumed = head_file(cluster, run_id, "attempt-1/rank-0.log") or ""
    assert f"resumed from {run_dir}/checkpoint.pt at step 10" in resumed, resumed
    for node in ("node1", "node2"):
        env = node_path(cluster, node, f"{run_dir}/env.sh").read_text()
        assert env.rstrip().endswith(f"export CPUACCEL_RESUME={run_dir}/checkpoint.pt"), env
        assert "export CPUACCEL_RESTART=1\n" in env
    rank1 = (head_file(cluster, run_id, "rank-1.log") or "").splitlines()
    assert rank1[0] == "--- attempt 0 ---" and "--- attempt 1 ---" in rank1
    metrics = (head_file(cluster, run_id, "metrics.jsonl") or "").splitlines()
    steps = [json.loads(line)["step"] for line in metrics]
    assert steps[-1] == 30 and steps.count(11) == 2, steps  # 11 again: from step 10 on
    assert f"attempt 1 from {run_dir}/checkpoint.pt" in (log or "")
    # ps reads the head's status.json: succeeded, one restart.
    ps = cpuaccel("ps", "--json", cwd=proj, env=ENV, timeout=60)
    row = next(r for r in json.loads(ps.stdout) if r["id"] == run_id)
    assert (row["state"], row["exit_code"], row["restarts"]) == ("succeeded", 0, 1), row
    assert_nothing_left(cluster, run_id)
    for node in ("node1", "node2"):  # secret.env's removal: the last sweep's
        assert not node_path(cluster, node, f"{run_dir}/secret.env").exists()


def test_an_identical_failure_stops_the_detached_run_with_the_scripts_code(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    proj = make_project(tmp_path, {"job.py": FAILS})
    run_id = detached(proj, inventory, "--max-restarts", "3", "--restart-delay", "0.5", "job.py")
    status = ended(cluster, run_id, timeout=120)
    assert (status["state"], status["exit_code"], status["ended_by"]) == ("failed", 7, "rank 0")
    attempts = status["attempts"]
    assert [a["attempt"] for a in attempts] == [0, 1], attempts  # not 4: the repeat seen
    for a in attempts:
        assert (a["reason"], a["exit_code"], a["rank"], a["host"]) == ("failed", 7, 0, "node1")
    log = head_file(cluster, run_id, "supervisor.log") or ""
    assert "attempt 1 failed as attempt 0 did (exit code 7, rank 0 on node1)" in log, log
    assert "not restarting it again" in log
    copy = head_file(cluster, run_id, "attempt-1/rank-0.log") or ""
    assert copy.startswith("attempt 1\n[cpuaccel] exit code 7\n"), copy
    assert_nothing_left(cluster, run_id)


def test_a_node_unreachable_between_attempts_ends_the_run_failed_naming_it(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    proj = make_project(tmp_path, {"job.py": SLEEPS_THEN_FAILS})
    run_id = detached(proj, inventory, "--max-restarts", "2", "--restart-delay", "2", "job.py")
    assert wait_until(lambda: "attempt 0" in (head_file(cluster, run_id, "rank-1.log") or ""))
    with link_down(cluster, "node2"):
        status = ended(cluster, run_id, timeout=180)
    # The exit code is the last attempt's: rank 0's 5, or the launcher's own when it saw
    # its link to node2 go first.
    assert len(status["attempts"]) == 1, status
    assert status["state"] == "failed" and status["exit_code"] in (5, 255), status
    assert status["exit_code"] == status["attempts"][0]["exit_code"]
    assert status["ended_by"] == "unreachable: node2" and list(status["unreachable"]) == ["node2"]
    log = head_file(cluster, run_id, "supervisor.log") or ""
    assert "not restarting: node2 did not answer from the head" in log, log


# Attempt 0 fails after a while on every node; any later attempt succeeds at once.
# The first attempt fails on no rank: only a node going silent can end it early.
WAITS_FIRST = """\
import os, time
print("attempt", os.environ["CPUACCEL_RESTART"], "world", os.environ["WORLD_SIZE"], flush=True)
if os.environ["CPUACCEL_RESTART"] == "0":
    time.sleep(300)
"""


def test_a_detached_run_leaves_out_a_silent_node_while_min_nodes_remain(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    proj = make_project(tmp_path, {"job.py": WAITS_FIRST})
    run = cpuaccel_run(
        proj, "-i", inventory, "--nodes", "2:3", "--ppn", "1", "--detach", "--max-restarts",
        "1", "--restart-delay", "1", *TREE, "job.py", timeout=300,
    )  # fmt: skip
    assert run.code == EXIT_OK, run
    run_id = run.stdout.strip()
    running = "attempt 0 world 3"  # rank 2's own line: the job runs on node3
    assert wait_until(lambda: running in (head_file(cluster, run_id, "rank-2.log") or ""))
    with link_down(cluster, "node3"):
        # Well before attempt 0's ranks would end by themselves: the head's session
        # to node3 names it lost within the keepalive window.
        status = ended(cluster, run_id, timeout=150)
    log = head_file(cluster, run_id, "supervisor.log") or ""
    assert (status["state"], status["exit_code"]) == ("succeeded", 0), (status, log)
    attempts = status["attempts"]
    assert [a["hosts"] for a in attempts] == [["node1", "node2", "node3"], ["node1", "node2"]]
    assert [a["reason"] for a in attempts] == ["lost", "completed"], attempts
    # The foreground's words for a node lost, then left out.
    assert "lost the connection to node3 (no answer to keepalives)" in log, log
    assert "leaving out node3: did not answer from the head" in log, log
    assert "(2 node(s) remain, --nodes allows 2)" in log, log
    assert "attempt 1 world 2" in (head_file(cluster, run_id, "rank-0.log") or "")
    hostfile = head_file(cluster, run_id, "hostfile") or ""
    assert hostfile.split() == ["node1", "node2"], hostfile
    # On node3 the job and the head's held session end too, though nothing could close
    # that session: its guard finds the head lost in the same window, or, when the link
    # came back before its keepalives ran out, the hold's next heartbeat meets the
    # head's closed connection. (No other node's sweep reaches node3's processes.)
    deadline = time.monotonic() + HOLD_BEAT + 10
    while job_processes(cluster, "node3", run_id) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert_nothing_left(cluster, run_id)
    assert cluster.wait_idle("node3", timeout=HOLD_BEAT + 10) == []
