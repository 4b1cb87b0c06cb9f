"""-u and --private-key on real nodes, with an inventory that names no user and no key,
as an Ansible user's often does. cpuaccel's own connections (check), rsync (sync of a
large file) and MPI's ssh from the head to the other nodes (run) must all log in with
them; a host's own ansible_user still wins, as in Ansible."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cpuaccel.errors import EXIT_NODE_FAILED, EXIT_OK
from cpuaccel.testbed.cluster import Cluster
from cpuaccel.testbed.netns import WORKDIR
from testsupport.command import clean_env, cpuaccel
from testsupport.runs import cpuaccel_run, make_project

pytestmark = pytest.mark.cluster


@pytest.fixture
def bare_inventory(cluster: Cluster, tmp_path: Path) -> Path:
    """The cluster's inventory without ansible_user and ansible_ssh_private_key_file."""
    return cluster.write_inventory(
        tmp_path / "inventory.yaml", ansible_user=None, ansible_ssh_private_key_file=None
    )


def login(cluster: Cluster) -> tuple[str, ...]:
    return ("-u", "root", "--private-key", str(cluster.key_path))


def test_without_the_flags_no_node_lets_us_in(bare_inventory: Path) -> None:
    # The control case: the flags below are what makes the difference.
    proc = cpuaccel("check", "--json", "-i", str(bare_inventory), env=clean_env(), timeout=120)
    assert proc.returncode == EXIT_NODE_FAILED, proc.stderr
    hosts = json.loads(proc.stdout)["hosts"]
    assert all(not entry["reachable"] for entry in hosts.values()), hosts


def test_check_logs_in_with_user_and_key(cluster: Cluster, bare_inventory: Path) -> None:
    proc = cpuaccel(
        "check", "-v", "-i", str(bare_inventory), *login(cluster), env=clean_env(), timeout=120
    )
    assert proc.returncode == EXIT_OK, proc.stdout + proc.stderr
    for node in cluster.nodes:
        assert f"{node.name}: connected as root@{node.address}:22 in" in proc.stderr
        assert f"{node.name}: ok in" in proc.stderr


def test_rsync_uses_the_user_and_key(
    cluster: Cluster, bare_inventory: Path, tmp_path: Path
) -> None:
    proj = make_project(tmp_path, {"train.py": "print('hi')\n"})
    (proj / "big.bin").write_bytes(os.urandom(5 << 20))  # over RSYNC_MIN_BYTES: rsync's
    args = ("sync", "-D", "-vv", "-i", str(bare_inventory), *login(cluster))
    proc = cpuaccel(*args, cwd=proj, env=clean_env(), timeout=180)
    assert proc.returncode == EXIT_OK, proc.stdout + proc.stderr
    assert "(rsync)" in proc.stdout and "    + big.bin" in proc.stdout
    # -vv shows the rsync argv: ssh logs in as -l root with -i KEY.
    assert f"-l root -i {cluster.key_path}" in proc.stderr
    for node in cluster.names:
        seen = cluster.exec(node, ["stat", "-c", "%s", str(WORKDIR / proj.name / "big.bin")])
        assert seen.stdout.strip() == str(5 << 20), (node, seen.stderr)


def test_mpi_reaches_the_other_nodes_with_the_user_and_key(
    cluster: Cluster, bare_inventory: Path, tmp_path: Path
) -> None:
    script = "import os, socket\nprint(os.environ['RANK'], socket.gethostname())\n"
    proj = make_project(tmp_path, {"script.py": script})
    args = ("-i", str(bare_inventory), *login(cluster), "--nodes", "3", "--ppn", "1")
    run = cpuaccel_run(proj, *args, "script.py")
    assert run.code == EXIT_OK, run
    assert {rank: text for rank, (_, text) in run.ranks().items()} == {
        0: "0 node1",
        1: "1 node2",
        2: "2 node3",
    }


def test_a_hosts_own_ansible_user_wins_over_u(cluster: Cluster, tmp_path: Path) -> None:
    inventory = cluster.write_inventory(
        tmp_path / "inventory.yaml",
        {"node1": {"ansible_user": "root"}},
        ansible_user=None,
        ansible_ssh_private_key_file=None,
    )
    args = ("-i", str(inventory), "-u", "no-such-user", "--private-key", str(cluster.key_path))
    proc = cpuaccel("check", "--json", *args, env=clean_env(), timeout=120)
    assert proc.returncode == EXIT_NODE_FAILED, proc.stderr
    hosts = json.loads(proc.stdout)["hosts"]
    assert hosts["node1"]["reachable"] is True, hosts["node1"]
    for name in ("node2", "node3"):
        assert "authentication failed as no-such-user@" in hosts[name]["error"], hosts[name]
