"""The multi-node test bed itself (cpuaccel.testbed.cluster) on real namespaces: the
shared cluster's nodes (hostnames, private folders, ssh between them, sshd stopped and
started, stray processes seen), and clusters of their own (``down`` leaves nothing, an id
taken once, the ``up``/``status``/``down`` commands). Its checks without root:
tests/unit/testbed/test_cluster.py."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from cpuaccel.testbed.cluster import (
    NODE_DIR,
    Cluster,
    ClusterError,
    lock_path_for,
    veth_name,
)
from cpuaccel.testbed.state import leftovers
from tests.cluster.fixtures import REPO

pytestmark = pytest.mark.cluster

SCRATCH_ID = 7  # a throw-away cluster, so the shared session cluster stays up
CLI_ID = 8


def _connect(address: str, timeout: float = 2.0) -> None:
    with socket.create_connection((address, 22), timeout=timeout):
        pass


def _wait_for_pid(cluster: Cluster, name: str, pid: int, timeout: float = 5.0) -> list[int]:
    """Poll cluster.pids(name) until it lists pid; return the last listing."""
    deadline = time.monotonic() + timeout
    while True:
        found = cluster.pids(name)
        if pid in found or time.monotonic() > deadline:
            return found
        time.sleep(0.02)


def _ssh(cluster: Cluster, name: str, *command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cluster.ssh_argv(name, *command), capture_output=True, text=True, timeout=30, check=False
    )


# --------------------------------------------------------------------------- the shared cluster


def test_each_node_has_its_own_hostname(cluster: Cluster) -> None:
    for node in cluster.nodes:
        result = cluster.exec(node.name, ["hostname"], check=True)
        assert result.stdout.strip() == node.name
    assert cluster.exec("node1", ["hostname"]).stdout != socket.gethostname()


def test_private_dir_is_private(cluster: Cluster) -> None:
    marker = f"marker-{uuid.uuid4().hex}"
    inside = f"{NODE_DIR}/{marker}"
    written = cluster.exec("node2", ["sh", "-c", f"echo node2 > {inside}"])
    assert written.returncode == 0, written.stderr
    try:
        assert cluster.exec("node2", ["cat", inside]).stdout == "node2\n"
        assert cluster.exec("node3", ["test", "-e", inside]).returncode == 1
        assert cluster.exec("node1", ["test", "-e", inside]).returncode == 1
        assert not (NODE_DIR / marker).exists()  # the controller's own view
        assert (cluster.node("node2").private_dir / marker).read_text() == "node2\n"
        # The rest of the filesystem is shared, like an NFS home.
        assert cluster.exec("node3", ["test", "-x", sys.executable]).returncode == 0
    finally:
        (cluster.node("node2").private_dir / marker).unlink()


def test_ssh_with_strict_host_key_checking(cluster: Cluster, tmp_path: Path) -> None:
    for node in cluster.nodes:
        result = _ssh(cluster, node.name, "hostname")
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == node.name

    # The check is real: the same login without the generated known_hosts is refused.
    empty = tmp_path / "empty_known_hosts"
    empty.touch()
    argv = cluster.ssh_argv("node1", "hostname")
    argv = [a.replace(str(cluster.known_hosts_path), str(empty)) for a in argv]
    refused = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert refused.returncode == 255
    assert "Host key verification failed" in refused.stderr

    lines = cluster.known_hosts_path.read_text().splitlines()
    assert len(lines) == len(cluster.nodes)
    for node, line in zip(cluster.nodes, lines, strict=True):
        assert line.startswith(f"{node.name},{node.address} ssh-ed25519 AAAA")
    assert len({line.split()[2] for line in lines}) == len(lines)  # one host key per node


def test_nodes_resolve_each_other(cluster: Cluster) -> None:
    for node in cluster.nodes:
        result = cluster.exec("node1", ["getent", "hosts", node.name], check=True)
        assert result.stdout.split()[0] == node.address
    controller = cluster.exec("node2", ["getent", "hosts", "cpxl-controller"], check=True)
    assert controller.stdout.split()[0] == cluster.controller_address
    # The host's own /etc/hosts is untouched.
    assert "node1" not in Path("/etc/hosts").read_text().split()


def test_nodes_ssh_each_other_by_name(cluster: Cluster) -> None:
    """What Intel MPI's hydra does: from one node, ssh to another by its hostname."""
    command = ["ssh", *cluster.ssh_args(), "root@node3", "hostname"]
    result = cluster.exec("node1", command)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "node3"


def test_stop_and_start_sshd(cluster: Cluster) -> None:
    node = cluster.node("node2")
    old_pid = node.pid
    with cluster.sshd_stopped("node2"):
        assert node.pid is None
        with pytest.raises(ConnectionRefusedError):
            _connect(node.address)
        assert _ssh(cluster, "node2", "true").returncode == 255
        _connect(cluster.node("node1").address)  # the others stay up
        # The node itself is still there for inspection.
        assert cluster.exec("node2", ["hostname"]).stdout.strip() == "node2"
    assert node.pid is not None and node.pid != old_pid
    _connect(node.address)
    result = _ssh(cluster, "node2", "hostname")
    assert result.stdout.strip() == "node2", result.stderr


def test_pids_sees_stray_processes(cluster: Cluster) -> None:
    assert cluster.wait_idle("node3") == []
    sshd_pid = cluster.node("node3").pid
    # The listener only with include_sshd. Idle sshd sessions may be there besides: the
    # kept ssh masters of earlier tests' check and sync (connectors/openssh_session.py).
    assert sshd_pid in cluster.pids("node3", include_sshd=True)
    assert sshd_pid not in cluster.pids("node3")
    # What runs on node1 now: this suite's earlier tests may have left a process there
    # that ends by itself; the stray started on node3 must not join it.
    on_node1 = set(cluster.pids("node1"))
    # A process that outlives its ssh session, detached from sshd's tree.
    started = _ssh(cluster, "node3", "setsid sleep 312 </dev/null >/dev/null 2>&1 & echo $!")
    assert started.returncode == 0, started.stderr
    stray = int(started.stdout.split()[-1])
    try:
        assert stray in _wait_for_pid(cluster, "node3", stray)
        assert stray not in cluster.pids("node1")
        assert set(cluster.pids("node1")) <= on_node1
    finally:
        cluster.exec("node3", ["kill", str(stray)])
    assert cluster.wait_idle("node3") == []


# --------------------------------------------------------------------------- own clusters


def _machine_leftovers(cluster_id: int) -> list[str]:
    """Independent of the library: what `ip` and /proc show for a cluster id."""
    found = []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    found += [line for line in netns.stdout.splitlines() if line.startswith(f"cpxl{cluster_id}-")]
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True)
    for line in links.stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if name == f"cpxl{cluster_id}br" or name.startswith(f"cpxl{cluster_id}v"):
            found.append(name)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if f"/tmp/cpxl-{cluster_id}/".encode() in cmdline and state != "Z":
            found.append(f"pid {entry}: {cmdline.decode(errors='replace')}")
    if Path(f"/tmp/cpxl-{cluster_id}").exists():
        found.append(f"/tmp/cpxl-{cluster_id}")
    return found


def test_down_leaves_nothing_behind() -> None:
    hosts_before = Path("/etc/hosts").read_text()
    scratch = Cluster(2, cluster_id=SCRATCH_ID).up()
    try:
        assert _machine_leftovers(SCRATCH_ID)  # sanity: the check sees a live cluster
        started = _ssh(scratch, "node1", "setsid sleep 313 </dev/null >/dev/null 2>&1 & echo $!")
        stray = int(started.stdout.split()[-1])
        assert stray in _wait_for_pid(scratch, "node1", stray)
        # Two clusters coexist: the scratch one has its own bridge and addresses.
        assert _ssh(scratch, "node2", "hostname").stdout.strip() == "node2"
        assert scratch.node("node2").address == f"10.77.{SCRATCH_ID}.2"
    finally:
        scratch.down()
    assert _machine_leftovers(SCRATCH_ID) == []
    assert (
        not Path(f"/proc/{stray}").exists()
        or b"sleep" not in Path(f"/proc/{stray}/cmdline").read_bytes()
    )
    assert not lock_path_for(SCRATCH_ID).exists()
    assert all(not items for items in leftovers(SCRATCH_ID).values())
    scratch.down()  # idempotent
    assert Path("/etc/hosts").read_text() == hosts_before


def test_a_live_cluster_id_cannot_be_taken_twice() -> None:
    with Cluster(1, cluster_id=SCRATCH_ID) as first:
        with pytest.raises(ClusterError, match="in use"):
            Cluster(1, cluster_id=SCRATCH_ID).up()
        assert _ssh(first, "node1", "hostname").stdout.strip() == "node1"
    assert _machine_leftovers(SCRATCH_ID) == []


def test_cli_up_status_down_and_stale_cleanup() -> None:
    cli = [sys.executable, "-m", "cpuaccel.testbed"]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*cli, *args], capture_output=True, text=True, timeout=120, check=False, cwd=REPO
        )

    try:
        up = run("up", "--nodes", "2", "--id", str(CLI_ID))
        assert up.returncode == 0, up.stderr
        inventory = Path(up.stdout.strip())
        assert inventory == Path(f"/tmp/cpxl-{CLI_ID}/inventory.yaml")
        hosts = yaml.safe_load(inventory.read_text())["all"]["hosts"]
        assert sorted(hosts) == ["node1", "node2"]

        status = run("status", "--id", str(CLI_ID))
        assert status.returncode == 0, status.stderr
        assert status.stdout.count(" up") == 2, status.stdout

        # The nodes outlived the `up` process; a new owner of the id cleans them first.
        attached = Cluster.attach(CLI_ID)
        old_pids = {node.pid for node in attached.nodes}
        assert None not in old_pids
        with Cluster(1, cluster_id=CLI_ID) as fresh:
            assert _machine_leftovers(CLI_ID)
            assert {node.pid for node in fresh.nodes}.isdisjoint(old_pids)
            assert not Path(f"/sys/class/net/{veth_name(CLI_ID, 2)}").exists()
            assert _ssh(fresh, "node1", "hostname").stdout.strip() == "node1"
        assert _machine_leftovers(CLI_ID) == []

        up = run("up", "--nodes", "2", "--id", str(CLI_ID))
        assert up.returncode == 0, up.stderr
        down = run("down", "--id", str(CLI_ID))
        assert down.returncode == 0, down.stderr
        assert _machine_leftovers(CLI_ID) == []
        assert "not running" in run("status", "--id", str(CLI_ID)).stdout
    finally:
        run("down", "--id", str(CLI_ID))
