"""`run --hang-timeout` on real nodes: a rank that stops making progress inside a step
(rank 1 sleeps; rank 0 then waits forever in that step's gradient all_reduce) is
detected, its host and last step are printed, its stacks dumped, the job ends with 124
and nothing of it is left on any node; the same for a detached run, supervised on the
head. Ranks import cpuaccel from the tree under test. Without nodes:
tests/unit/jobs/test_hang.py.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from cpuaccel.errors import EXIT_OK
from cpuaccel.testbed.cluster import NODE_DIR, Cluster
from tests.cluster.fixtures import TREE, master_port
from testsupport.command import cpuaccel as cpuaccel_cli
from testsupport.runs import ENV, Run, cpuaccel_run, job_processes, make_project

pytestmark = pytest.mark.cluster

WORKDIR = NODE_DIR / "work"
EXIT_HANG = 124

# Steps through the runtime (ctx.backward writes the progress marker); at step HANG_AT
# rank 1 sleeps inside the step, before its backward, and rank 0 blocks in it.
HANGING = """\
import sys, time
import torch
from torch import nn
import cpuaccel

hang_at = int(sys.argv[1])
ctx = cpuaccel.init(seed=0, mixed_precision="no", verbose=False)
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
model, opt = ctx.prepare(model, opt)
x, y = torch.randn(8, 4), torch.randn(8, 1)
for step in range(1, 10_000):
    loss = nn.functional.mse_loss(model(x), y)
    if step == hang_at and ctx.rank == 1:
        time.sleep(3600)  # stuck inside the step
    ctx.backward(loss)
    opt.step()
    opt.zero_grad()
    time.sleep(0.1)
"""
REPORT = re.compile(
    r"^  rank (\d) on (node\d): last step (\d+), ([\d.]+) s since its last progress$"
)


def hanging_run(
    inventory: str, tmp_path: Path, *flags: str, nodes: int, bound: int, hang_at: int
) -> tuple[Path, Run]:
    """(project, run) of HANGING at ``nodes`` x 1 under ``--hang-timeout bound``, rank 1
    stuck at step ``hang_at``."""
    proj = make_project(tmp_path, {"hang.py": HANGING})
    return proj, cpuaccel_run(
        proj, "-i", inventory, "--nodes", str(nodes), "--ppn", "1", *TREE, *flags,
        "--master-port", master_port(), "--hang-timeout", str(bound), "hang.py", str(hang_at),
    )  # fmt: skip


def assert_nothing_left(cluster: Cluster, run_id: str) -> None:
    for node in ("node1", "node2", "node3"):
        assert job_processes(cluster, node, run_id) == [], node


def test_a_rank_stuck_in_a_step_is_detected_reported_and_ended(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    _, run = hanging_run(inventory, tmp_path, nodes=2, bound=20, hang_at=15)
    assert run.code == EXIT_HANG, run
    said = re.search(
        r"hang: no rank made progress for ([\d.]+) s \(--hang-timeout 20\)", run.stderr
    )
    assert said, run
    # Never before the timeout; after it, within one marker interval (2 s) and a check.
    assert 20 <= float(said[1]) < 20 + 2 + 5, run
    lines = {int(m[1]): m for m in map(REPORT.match, run.stderr.splitlines()) if m}
    assert sorted(lines) == [0, 1], run
    assert lines[0][2] == "node1" and lines[1][2] == "node2"  # where each rank ran
    for rank in (0, 1):  # the last step seen: taken, and before the stuck one
        assert 1 <= int(lines[rank][3]) < 15, run
    assert "[cpuaccel] progress" not in run.stdout + run.stderr  # the markers stay hidden
    status = json.loads((run.run_dir / "status.json").read_text())
    assert (status["state"], status["ended_by"], status["exit_code"]) == ("failed", "hang", 124)
    assert {h["rank"]: h["host"] for h in status["hang"]} == {0: "node1", 1: "node2"}
    for rank in (0, 1):  # py-spy (beside the nodes' python): each rank's own stack
        assert "hang.py" in (run.run_dir / f"hang-{rank}.txt").read_text(), rank
    assert_nothing_left(cluster, status["run_id"])


def head_file(cluster: Cluster, run_id: str, name: str) -> str | None:
    done = cluster.exec("node1", ["cat", f"{WORKDIR}/runs/{run_id}/{name}"])
    return done.stdout if done.returncode == 0 else None


def final_status(cluster: Cluster, run_id: str, timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = head_file(cluster, run_id, "status.json")
        status = json.loads(text) if text else None
        if status and status["state"] != "running":
            return dict(status)
        time.sleep(0.5)
    raise AssertionError(head_file(cluster, run_id, "status.json"))


def test_a_detached_run_that_hangs_is_ended_by_its_supervisor(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    proj, run = hanging_run(
        inventory, tmp_path, "--detach", "--json", nodes=2, bound=10, hang_at=10
    )
    assert run.code == EXIT_OK, run
    run_id = json.loads(run.stdout)["run_id"]
    status = final_status(cluster, run_id)
    assert (status["state"], status["ended_by"], status["exit_code"]) == ("failed", "hang", 124)
    assert {h["rank"]: h["host"] for h in status["hang"]} == {0: "node1", 1: "node2"}
    assert all(1 <= h["step"] < 10 for h in status["hang"]), status
    assert status["left"] == {}, status
    # Both ranks' stacks in the head's run folder, node2's reached through ssh.sh.
    for rank in (0, 1):
        assert "hang.py" in (head_file(cluster, run_id, f"hang-{rank}.txt") or ""), rank
    log = head_file(cluster, run_id, "supervisor.log") or ""
    assert "hang: no rank made progress for" in log and "rank 1 on node2: last step" in log
    assert "progress" not in (head_file(cluster, run_id, "rank-0.log") or "")
    assert_nothing_left(cluster, run_id)
    fetched = cpuaccel_cli("fetch", run_id, cwd=proj, env=ENV, timeout=120)  # the dumps come home
    assert fetched.returncode == EXIT_OK, (fetched.stdout, fetched.stderr)
    assert "hang.py" in (proj / "runs" / run_id / "hang-1.txt").read_text()


def test_the_hang_report_names_the_rank_the_others_wait_for_with_its_stack_first(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    """Three ranks; rank 1 sleeps inside the step while ranks 0 and 2 block in the
    gradients' all_reduce: the report names rank 1 as the odd one out, says where the
    others wait, and shows rank 1's stack before any other."""
    _, run = hanging_run(inventory, tmp_path, nodes=3, bound=10, hang_at=5)
    assert run.code == EXIT_HANG, run
    lines = run.stderr.splitlines()
    odd = [i for i, line in enumerate(lines) if "the odd one out" in line]
    assert len(odd) == 1, run
    said = lines[odd[0]]
    assert "rank 1 on node2, in <module> (hang.py:" in said, said
    assert re.search(r"rank\(s\) 0, 2 wait in \S+ \(", said), said
    stack = lines[odd[0] + 1 :]
    assert any("hang.py" in line for line in stack[:10]), run  # its own stack, first
    paths = next(line for line in lines if "stacks (py-spy):" in line)
    assert paths.split("stacks (py-spy): ")[1].startswith(str(run.run_dir / "hang-1.txt")), paths
    assert_nothing_left(cluster, json.loads((run.run_dir / "status.json").read_text())["run_id"])
