"""Connections that die or go through a hop, on the namespace cluster (issue 12, items 8, 4).

A node's link is cut inside its namespace (``ip link set eth0 down``), which is what a
pulled cable or a dead switch port looks like: no RST, no FIN, just silence. Every test
brings the link back up in ``finally``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cpuaccel.connectors.connect_options import KEEPALIVE_COUNT, KEEPALIVE_INTERVAL
from cpuaccel.errors import EXIT_NODE_FAILED
from cpuaccel.node.supervisor import GRACE
from cpuaccel.runs.fanout import TEARDOWN
from cpuaccel.testing.cluster import Cluster
from cpuaccel.testing.command import clean_env, cpuaccel
from cpuaccel.testing.runs import ENV, BackgroundRun, make_project

pytestmark = pytest.mark.cluster

# Each rank says it started, then sleeps far longer than the test may take.
SLEEPER = """\
import time
print("started", flush=True)
time.sleep(300)
"""


@contextlib.contextmanager
def link_down(cluster: Cluster, name: str) -> Iterator[None]:
    """Within the block, node `name` neither sends nor receives a packet."""
    namespace = cluster.node(name).namespace
    subprocess.run(["ip", "-n", namespace, "link", "set", "eth0", "down"], check=True)
    try:
        yield
    finally:
        subprocess.run(["ip", "-n", namespace, "link", "set", "eth0", "up"], check=True)


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


# The longest a dead node may take to end a run: the keepalive window (plus the interval
# before the first unanswered probe), the launcher's SIGTERM grace, and the teardown bound.
DEAD_NODE_BOUND = KEEPALIVE_INTERVAL * (KEEPALIVE_COUNT + 1) + GRACE + TEARDOWN


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


# ---------------------------------------------------------------- ProxyJump (item 4)


def proxyjump_home(cluster: Cluster, tmp_path: Path) -> Path:
    """A HOME whose ~/.ssh/config reaches node2 only through node1 (ProxyJump)."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True, exist_ok=True)
    node1, node2 = cluster.node("node1"), cluster.node("node2")
    (home / ".ssh" / "config").write_text(
        f"Host {node2.address}\n    ProxyJump root@{node1.address}\n"
        f"Host {node1.address}\n    IdentityFile {cluster.key_path}\n"
    )
    return home


def through_jump(
    cluster: Cluster, tmp_path: Path, known_hosts: str
) -> subprocess.CompletedProcess[str]:
    """`check` of node2 through node1, host keys checked against `known_hosts` alone."""
    inv = cluster.write_inventory(
        tmp_path / "jump.yaml",
        only=["node2"],
        cpuaccel_known_hosts=None,
        ansible_ssh_common_args=f"-o UserKnownHostsFile={tmp_path / 'known_hosts'}",
    )
    (tmp_path / "known_hosts").write_text(known_hosts)
    env = clean_env(HOME=str(proxyjump_home(cluster, tmp_path)))
    return cpuaccel("check", "-i", str(inv), env=env, timeout=60)


def test_a_proxyjump_hop_with_a_wrong_recorded_key_is_refused(
    cluster: Cluster, tmp_path: Path
) -> None:
    node1, node2, node3 = (cluster.node(name) for name in ("node1", "node2", "node3"))
    good = cluster.known_hosts_path.read_text().splitlines()
    by_name = {line.split()[0].split(",")[0]: line.split(None, 1)[1] for line in good}
    # node1 (the hop) recorded with node3's key; node2 (the target) with its own.
    wrong = f"{node1.address} {by_name['node3']}\n{node2.address} {by_name['node2']}\n"
    proc = through_jump(cluster, tmp_path, wrong)
    assert proc.returncode == EXIT_NODE_FAILED, proc
    assert f"host key of the ProxyJump hop {node1.address} has CHANGED" in proc.stdout, proc
    assert "Traceback" not in proc.stderr
    assert node3.address not in proc.stdout  # the message names the hop, not the key's owner

    unknown = f"{node2.address} {by_name['node2']}\n"  # the hop not recorded at all
    proc = through_jump(cluster, tmp_path, unknown)
    assert proc.returncode == EXIT_NODE_FAILED, proc
    assert f"host key of the ProxyJump hop {node1.address} is not known" in proc.stdout, proc


def test_a_proxyjump_hop_with_the_right_key_works(cluster: Cluster, tmp_path: Path) -> None:
    proc = through_jump(cluster, tmp_path, cluster.known_hosts_path.read_text())
    assert proc.returncode == 0, proc
    row = next(line for line in proc.stdout.splitlines() if line.startswith("node2 "))
    assert row.split()[1:3] == ["ok", "="], proc.stdout  # "=": the hostname is node2
    # The way to node2 goes through node1: without node1's sshd there is none.
    with cluster.sshd_stopped("node1"):
        proc = through_jump(cluster, tmp_path, cluster.known_hosts_path.read_text())
    assert proc.returncode == EXIT_NODE_FAILED, proc
    assert f"via ProxyJump {cluster.node('node1').address}" in proc.stdout, proc
