"""`run --rendezvous-timeout` on real nodes: a job whose ranks cannot all join the
process group ends within the bound (plus its slack and the ending), naming the ranks
that did not join, their nodes and the last network error each saw, with nothing of
it left on any node. Ranks import cpuaccel from the tree under test. Without nodes:
tests/unit/jobs/test_rendezvous.py, tests/unit/node/test_rendezvous.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cpuaccel.node.rendezvous import slack
from cpuaccel.testbed.cluster import Cluster
from tests.cluster.fixtures import TREE, master_port
from tests.cluster.test_hang import EXIT_HANG, assert_nothing_left
from testsupport.runs import cpuaccel_run, make_project

pytestmark = pytest.mark.cluster

BOUND = 5
# Three ranks, one a node: rank 1 (node2) is busy far longer than the bound before it
# calls init_process_group; rank 2 (node3) looks for the store one port off, as a node
# given another MASTER_PORT would. Each says its error in a line and fails.
ASTRAY = """\
import os, sys, time
import torch.distributed as dist
rank = os.environ["RANK"]
if rank == "1":
    time.sleep(300)
if rank == "2":
    os.environ["MASTER_PORT"] = str(int(os.environ["MASTER_PORT"]) + 1)
try:
    dist.init_process_group()
except Exception as exc:
    sys.exit(f"no process group: {exc}")
print("joined")
"""


def test_ranks_that_cannot_meet_end_the_job_within_the_bound_named_with_their_nodes(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    proj = make_project(tmp_path, {"astray.py": ASTRAY})
    port = master_port(2)  # the next one too: rank 2's
    run = cpuaccel_run(
        proj, "-i", inventory, "--nodes", "3", "--ppn", "1", *TREE, "--master-port", port,
        "--rendezvous-timeout", str(BOUND), "astray.py",
    )  # fmt: skip
    assert run.code == EXIT_HANG, run
    said = " ".join(run.stderr.split())  # as one line: the terminal wraps long ones
    assert (
        "rendezvous: rank(s) 0, 1, 2 of 3 did not join the process group" in said
        and f"(--rendezvous-timeout {BOUND})" in said
    ), run
    assert "rank 1 on node2: never began the rendezvous; no network error seen" in said, run
    assert "rank 0 on node1: waiting to join; last network error: DistStoreError" in said, run
    assert "[cpuaccel] rendezvous" not in run.stdout + run.stderr  # the markers stay hidden
    status = json.loads((run.run_dir / "status.json").read_text())
    assert (status["state"], status["ended_by"], status["exit_code"]) == (
        "failed", "rendezvous", EXIT_HANG,
    )  # fmt: skip
    found = status["rendezvous"]
    assert (found["joined"], found["missing"]) == ([], [0, 1, 2])
    ranks = {r["rank"]: r for r in found["ranks"]}
    assert {r: ranks[r]["host"] for r in ranks} == {0: "node1", 1: "node2", 2: "node3"}
    assert ranks[1]["state"] is None and ranks[1]["error"] is None
    assert "1/3 clients joined" in ranks[0]["error"], found
    # rank 2's own: torch's socket line, or the error its init raised
    assert f", {int(port) + 1})" in ranks[2]["error"], found
    # Ended within the bound and its slack of the first rank's beginning, and soon after.
    assert BOUND <= found["seconds"] <= BOUND + slack(BOUND) + 1, found
    assert status["ended"] - status["started"] < 60, status  # not torch's 30 minutes
    assert_nothing_left(cluster, status["run_id"])  # the sleeping rank 1 too
