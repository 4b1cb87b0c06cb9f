"""Nodes reached through a ProxyJump hop (from ~/.ssh/config in a HOME of the test's
own), on the namespace cluster: the hop's host key is checked with the same policy and
known_hosts files as the target's, by paramiko's path (check) and by rsync's ssh (sync)
alike, a wrong or unknown one refused naming the hop, and two hops taken in OpenSSH's
order.

For rsync, node2 is reached only through node1: the inventory names node2's second sshd
(port 2222), which lets root in from node1's address alone, so a connection that skipped
the hop would be refused. The keys come from the inventory's known_hosts file alone
(that HOME holds no known_hosts): the hop's key is found only where the target's is.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import pytest

from cpuaccel.connectors.connect_options import ConnectOptions
from cpuaccel.connectors.ssh import SSHConnector
from cpuaccel.errors import EXIT_NODE_FAILED, HostKeyError
from cpuaccel.inventory.inventory import Inventory
from cpuaccel.testbed.cluster import NODE_DIR, Cluster
from tests.cluster.fixtures import PORT, second_sshd
from testsupport.command import clean_env, cpuaccel
from testsupport.runs import make_project

pytestmark = pytest.mark.cluster


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


MB = 1 << 20


def _keys(cluster: Cluster) -> dict[str, str]:
    """node name -> "TYPE BASE64" of its host key."""
    return {
        node.name: " ".join(
            cluster.host_key_path(node.name).with_suffix(".pub").read_text().split()[:2]
        )
        for node in cluster.nodes
    }


def _inventory(cluster: Cluster, tmp_path: Path, hop_key: str) -> Path:
    """node2 on its second sshd, host keys from one file: node1 (the hop) recorded
    with ``hop_key``, node2 with its own."""
    node1, node2 = cluster.node("node1"), cluster.node("node2")
    known = tmp_path / "known_hosts"
    target = f"[{node2.address}]:{PORT} {_keys(cluster)['node2']}"
    known.write_text(f"{node1.address} {hop_key}\n{target}\n")
    return cluster.write_inventory(
        tmp_path / "jump.yaml",
        {"node2": {"ansible_port": PORT}},
        only=["node2"],
        cpuaccel_known_hosts=None,
        ansible_ssh_common_args=f"-o UserKnownHostsFile={known} -o StrictHostKeyChecking=yes",
    )


def _listing(cluster: Cluster, folder: Path) -> list[str]:
    found = cluster.exec("node2", ["ls", "-A", str(folder)])
    return sorted(found.stdout.split()) if found.returncode == 0 else ["<absent>"]


def _sync(
    tmp_path: Path, home: Path, inventory: Path, dest: Path
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    project = make_project(tmp_path, {"small.txt": "hello\n"})
    (project / "big.bin").write_bytes(b"\x5a" * (5 * MB))  # over RSYNC_MIN_BYTES: rsync
    args = ("sync", "-i", str(inventory), "--dest", str(dest), "--json")
    return project, cpuaccel(*args, cwd=project, env=clean_env(HOME=str(home)), timeout=120)


def test_sync_over_rsync_through_a_hop_checked_against_the_inventorys_known_hosts(
    cluster: Cluster, tmp_path: Path
) -> None:
    home = proxyjump_home(cluster, tmp_path)
    node1 = cluster.node("node1")
    inventory = _inventory(cluster, tmp_path, _keys(cluster)["node1"])
    dest = NODE_DIR / "work" / f"jump-{uuid.uuid4().hex[:8]}"
    with second_sshd(cluster, "node2", f"root@{node1.address}"):
        _, proc = _sync(tmp_path, home, inventory, dest)
        listed = _listing(cluster, dest)
    assert proc.returncode == 0, proc
    report = json.loads(proc.stdout)
    assert report["hosts"]["node2"]["method"] == "rsync", report
    assert "big.bin" in listed and "small.txt" in listed, listed


def test_a_hop_with_a_wrong_recorded_key_stops_sync_and_rsync_naming_the_hop(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = proxyjump_home(cluster, tmp_path)
    node1 = cluster.node("node1")
    # node1 (the hop) recorded with node3's key; node2 (the target) with its own.
    inventory = _inventory(cluster, tmp_path, _keys(cluster)["node3"])
    dest = NODE_DIR / "work" / f"jump-{uuid.uuid4().hex[:8]}"
    changed = f"host key of the ProxyJump hop {node1.address} has CHANGED"
    with second_sshd(cluster, "node2", f"root@{node1.address}"):
        project, proc = _sync(tmp_path, home, inventory, dest)
        after_sync = _listing(cluster, dest)
        # rsync's own ssh, without the paramiko connection that refused the hop first:
        monkeypatch.setenv("HOME", str(home))  # Fabric reads ~/.ssh/config from HOME
        host = Inventory.load(inventory).hosts["node2"]
        conn = SSHConnector(host, ConnectOptions())
        with pytest.raises(HostKeyError) as refused:
            conn.rsync(["-a"], f"{project}/", f"{dest}/")
        after_rsync = _listing(cluster, dest)
    assert proc.returncode == EXIT_NODE_FAILED, proc
    assert changed in proc.stdout + proc.stderr, proc
    assert "Traceback" not in proc.stderr
    assert f"{changed} since it was recorded (rsync's ssh)" == refused.value.reason
    assert "ssh-keygen -R" in (refused.value.hint or "")
    assert after_sync == after_rsync == ["<absent>"]  # nothing written on the target


def test_two_hops_are_taken_in_openssh_order_by_check_and_rsync(
    cluster: Cluster, tmp_path: Path
) -> None:
    """``ProxyJump node1,node2`` to node3: node1 first, node2 through it, node3 through
    node2, where each of node2's and node3's second sshd lets root in only from the hop
    before it. The other order (Fabric's own reading) would be refused at both."""
    node1, node2, node3 = (cluster.node(name) for name in ("node1", "node2", "node3"))
    keys = _keys(cluster)
    known = tmp_path / "known_hosts"
    known.write_text(
        f"{node1.address} {keys['node1']}\n[{node2.address}]:{PORT} {keys['node2']}\n"
        f"[{node3.address}]:{PORT} {keys['node3']}\n"
    )
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(
        f"Host {node3.address}\n    ProxyJump root@{node1.address},root@{node2.address}:{PORT}\n"
        f"Host {node1.address} {node2.address}\n    IdentityFile {cluster.key_path}\n"
    )
    inventory = cluster.write_inventory(
        tmp_path / "two-hops.yaml",
        {"node3": {"ansible_port": PORT}},
        only=["node3"],
        cpuaccel_known_hosts=None,
        ansible_ssh_common_args=f"-o UserKnownHostsFile={known} -o StrictHostKeyChecking=yes",
    )
    dest = NODE_DIR / "work" / f"jump-{uuid.uuid4().hex[:8]}"
    with (
        second_sshd(cluster, "node2", f"root@{node1.address}"),
        second_sshd(cluster, "node3", f"root@{node2.address}"),
    ):
        check = cpuaccel("check", "-i", str(inventory), env=clean_env(HOME=str(home)), timeout=120)
        _, proc = _sync(tmp_path, home, inventory, dest)
        listed = cluster.exec("node3", ["ls", "-A", str(dest)]).stdout.split()
    assert check.returncode == 0, check
    row = next(line for line in check.stdout.splitlines() if line.startswith("node3 "))
    assert row.split()[1:3] == ["ok", "="], check.stdout  # "=": the hostname is node3
    assert proc.returncode == 0, proc
    assert json.loads(proc.stdout)["hosts"]["node3"]["method"] == "rsync", proc.stdout
    assert "big.bin" in listed and "small.txt" in listed, listed
