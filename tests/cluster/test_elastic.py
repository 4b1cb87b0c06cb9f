"""`run --nodes 2:3 --max-restarts 1` against real nodes: a node whose
link is cut mid-run (``ip link set eth0 down`` in its namespace: no RST, no FIN) is
noticed through the ssh keepalives, left out by the restart's preflight with a line
naming it, and examples/train.py finishes on the two remaining nodes from the newest
checkpoint they both hold. The link is brought back up in ``finally``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path

import pytest

from cpuaccel.connectors.connect_options import KEEPALIVE_COUNT, KEEPALIVE_INTERVAL
from cpuaccel.errors import EXIT_OK
from cpuaccel.jobs.teardown import TEARDOWN
from cpuaccel.node.supervisor import GRACE
from cpuaccel.testbed.cluster import Cluster
from cpuaccel.testbed.netns import WORKDIR
from tests.cluster.fixtures import REPO, TREE, link_down, master_port, train_args
from testsupport.runs import BackgroundRun, make_project

pytestmark = pytest.mark.cluster

TRAIN = train_args(steps=60, save_every=10, log_every=5)
# Attempt 0 slows down after step 20 (a second per logged step), so that the link is cut
# mid-run with checkpoints behind it; the example itself has no test hook.
SLOW = """\
import os, runpy, sys, time
from cpuaccel.runtime.context import Context

log = Context.log

def slow_log(self, step=None, **values):
    line = log(self, step, **values)
    if os.environ.get("CPUACCEL_RESTART") == "0" and step is not None and step >= 20:
        time.sleep(1)
    return line

Context.log = slow_log
here = os.path.dirname(os.path.abspath(__file__))
sys.argv[0] = os.path.join(here, "train.py")
runpy.run_path(sys.argv[0], run_name="__main__")
"""
LOST = "node3"
DEAD_NODE_BOUND = KEEPALIVE_INTERVAL * (KEEPALIVE_COUNT + 1) + GRACE + TEARDOWN


def node_path(cluster: Cluster, node: str, path: str) -> Path:
    return cluster.node(node).private_dir / Path(path).relative_to(WORKDIR.parent)


def checkpoints(cluster: Cluster, node: str, run_dir: str) -> list[dict[str, object]]:
    path = node_path(cluster, node, f"{run_dir}/checkpoints.jsonl")
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_a_node_cut_off_mid_run_is_left_out_and_the_job_finishes_on_the_others(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    example = (REPO / "examples" / "train.py").read_text()
    project = make_project(tmp_path, {"train.py": example, "slow.py": SLOW})
    before = set(cluster.pids(LOST))
    port = master_port()
    job = BackgroundRun(
        project, "-i", inventory, "--nodes", "2:3", "--ppn", "1", "--max-restarts", "1",
        "--restart-delay", "1", "-T", "3", "--timeout", "300", "--master-port", port,
        *TREE, "slow.py", *TRAIN,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while not (project / "runs").exists() or not list((project / "runs").iterdir()):
            assert job.proc.poll() is None and time.monotonic() < deadline, job.report()
            time.sleep(0.2)
        run_id = next((project / "runs").iterdir()).name
        run_dir = f"{WORKDIR}/runs/{run_id}"
        # Cut once every node holds the step-20 checkpoint (attempt 0 is slow after it).
        while not all(
            any(c["step"] == 20 for c in checkpoints(cluster, n, run_dir)) for n in cluster.names
        ):
            assert job.proc.poll() is None and time.monotonic() < deadline, job.report()
            time.sleep(0.2)
        with link_down(cluster, LOST):
            run = job.finish(timeout=DEAD_NODE_BOUND + 200)
    finally:
        job.stop()
        for pid in set(cluster.pids(LOST)) - before:  # the job's, and cut ssh sessions
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert run.code == EXIT_OK, run
    assert f"leaving out {LOST}" in run.stderr, run
    lines = [json.loads(x) for x in (run.run_dir / "attempts.jsonl").read_text().splitlines()]
    assert len(lines) == 2, lines
    assert lines[0]["hosts"] == ["node1", "node2", "node3"]
    assert lines[0]["reason"] in ("lost", "failed") and lines[0]["host"] == LOST, lines
    assert lines[1]["hosts"] == ["node1", "node2"] and lines[1]["reason"] == "completed"
    resume = lines[1]["resume"]
    assert resume == f"{run_dir}/checkpoint.pt", lines
    # The second attempt ran 2 ranks, from a checkpoint at step 20 or later, to step 60.
    assert "2 rank(s) on 2 node(s)" in run.stderr, run
    done = checkpoints(cluster, "node1", run_dir)
    assert done[-1]["step"] == 60 and {c["step"] for c in done} >= {20, 60}
    assert not any(c["step"] == 60 for c in checkpoints(cluster, LOST, run_dir))
    assert cluster.wait_idle("node1", timeout=10) == []
    assert cluster.wait_idle(LOST, timeout=10) == []
