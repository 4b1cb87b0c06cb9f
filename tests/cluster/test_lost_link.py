"""A node whose link dies, on the namespace cluster: the link is cut inside its namespace
(``ip link set eth0 down``), which is what a pulled cable or a dead switch port looks
like: no RST, no FIN, just silence. A run ends naming the node it lost, within the
keepalive window; a check ends within its connect timeout. Every test brings the link
back up in ``finally``."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import pytest

from cpuaccel.errors import EXIT_NODE_FAILED
from cpuaccel.testbed.cluster import Cluster
from tests.cluster.fixtures import DEAD_NODE_BOUND, link_down
from testsupport.command import cpuaccel
from testsupport.runs import ENV, BackgroundRun, make_project

pytestmark = pytest.mark.cluster

# Each rank says it started, then sleeps far longer than the test may take.
SLEEPER = """\
import time
print("started", flush=True)
time.sleep(300)
"""


def job_pids(cluster: Cluster, node: str, run_id: str | None = None) -> dict[int, str]:
    """pid -> run id of the processes inside `node` that carry a CPUACCEL_RUN_ID (of
    `run_id` only, if given)."""
    found: dict[int, str] = {}
    for pid in cluster.pids(node):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for entry in environ:
            if entry.startswith(b"CPUACCEL_RUN_ID="):
                value = entry.split(b"=", 1)[1].decode()
                if run_id is None or value == run_id:
                    found[pid] = value
    return found


def restore(cluster: Cluster, node: str, before: set[int]) -> None:
    """End what the test left in the node it cut off: the job's processes, and the sshd
    sessions of the connections cut with it (their peer is gone; nothing tells them)."""
    for pid in set(cluster.pids(node)) - before:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert cluster.wait_idle(node, timeout=10) == [], node


@pytest.mark.parametrize("lost", ["node2", "node1"], ids=["a-worker", "the-head"])
def test_a_node_whose_link_drops_mid_run_is_named_and_the_run_ends(
    cluster: Cluster, inventory: str, tmp_path: Path, lost: str
) -> None:
    proj = make_project(tmp_path, {"job.py": SLEEPER})
    before = set(cluster.pids(lost))
    job = BackgroundRun(proj, "-i", inventory, "--nodes", "3", "--ppn", "1", "job.py")
    try:
        job.wait_for("started", 3)
        run_ids = set(job_pids(cluster, "node3").values())
        assert len(run_ids) == 1, run_ids
        run_id = run_ids.pop()
        with link_down(cluster, lost):
            cut = time.monotonic()
            run = job.finish(timeout=DEAD_NODE_BOUND + 30)
            seconds = time.monotonic() - cut
            # While the node is still cut off: nothing of the job on the others.
            for node in cluster.names:
                if node != lost:
                    assert job_pids(cluster, node, run_id) == {}, (node, run)
    finally:
        job.stop()
        restore(cluster, lost, before)
    assert seconds < DEAD_NODE_BOUND, run
    assert run.code == 255, run
    assert "Traceback" not in run.stderr, run
    assert f"lost the connection to {lost}" in run.stderr, run
    assert f"still running on {lost}: not checked" in run.stderr, run
    record = run.record()
    assert record["reason"] == "lost" and record["exit_code"] == 255
    assert record["run_id"] == run_id
    assert lost in record["left"]


def test_check_of_a_node_whose_link_is_down_ends_within_the_connect_timeout(
    cluster: Cluster, inventory: str
) -> None:
    timeout = 3
    with link_down(cluster, "node3"):
        started = time.monotonic()
        proc = cpuaccel("check", "-i", inventory, "-T", str(timeout), env=ENV, timeout=60)
        seconds = time.monotonic() - started
    assert proc.returncode == EXIT_NODE_FAILED, proc
    row = next(line for line in proc.stdout.splitlines() if line.startswith("node3 "))
    assert "unreachable" in row, proc.stdout  # and its error under the table:
    assert "error   node3: cannot connect" in proc.stdout and "timed out" in proc.stdout
    assert "Traceback" not in proc.stderr
    # The connect timeout, plus the CLI's own start and the other nodes' fact probes.
    assert seconds < timeout + 10, proc
