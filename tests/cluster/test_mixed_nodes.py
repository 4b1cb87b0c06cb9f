"""`cpuaccel run` and `check` on a mixed cluster: one node reached on another sshd port as
another user, host keys recorded by address only, and a worker that the controller
reaches but the head node cannot.

node2 gets a second sshd (port 2222) that lets in only ``cpxuser``, a user that exists
on node2 alone (its own /etc/passwd line, uid 0, its home in node2's private folder).
While node2's usual sshd (root, port 22) is stopped, a job reaches node2 only if MPI's
ssh on the head uses node2's own port and user: the head's would be refused.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from cpuaccel.errors import EXIT_NODE_FAILED, EXIT_OK, EXIT_PROBLEMS
from cpuaccel.testbed.cluster import NODE_DIR, Cluster
from tests.cluster.fixtures import PORT, USER, second_sshd
from testsupport.command import cpuaccel
from testsupport.runs import ENV, cpuaccel_run, make_project

pytestmark = pytest.mark.cluster

SCRIPT = (
    "import json, os, socket\n"
    "print(json.dumps({'rank': os.environ['RANK'], 'host': socket.gethostname()}))\n"
)


def _known_by_address(cluster: Cluster, path: Path) -> Path:
    """known_hosts as a user records what the controller verified: by address only."""
    lines = []
    for node in cluster.nodes:
        key = " ".join(cluster.host_key_path(node.name).with_suffix(".pub").read_text().split()[:2])
        lines.append(f"{node.address} {key}")
        if node.name == "node2":
            lines.append(f"[{node.address}]:{PORT} {key}")
    path.write_text("\n".join(lines) + "\n")
    return path


def _inventory(cluster: Cluster, tmp_path: Path) -> Path:
    known = _known_by_address(cluster, tmp_path / "known_hosts")
    return cluster.write_inventory(
        tmp_path / "mixed.yaml",
        {"node2": {"ansible_port": PORT, "ansible_user": USER}},
        only=["node1", "node2"],
        ansible_ssh_common_args=f"-o UserKnownHostsFile={known} -o StrictHostKeyChecking=yes",
    )


def _runs_on(cluster: Cluster, name: str) -> list[str]:
    listed = cluster.exec(name, ["ls", "-A", str(NODE_DIR / "work" / "runs")])
    return sorted(listed.stdout.split())


def test_a_node_on_another_port_and_user_with_keys_by_address(
    cluster: Cluster, tmp_path: Path
) -> None:
    inventory = _inventory(cluster, tmp_path)
    flavours = (("mpich", "mpirun.mpich"), ("openmpi", "mpirun.openmpi"))
    missing = [p for _, p in flavours if not shutil.which(p, path="/usr/bin")]
    # Where the cluster tests must run (CI), every launcher must be tried: make test
    # installs MPICH and Open MPI, so a missing one is a broken set-up, not a smaller test.
    if missing and os.environ.get("CPUACCEL_REQUIRE_CLUSTER") == "1":
        pytest.fail(f"{', '.join(missing)} not installed (tools/system-deps.sh installs them)")
    launchers = ["impi"] + [name for name, p in flavours if p not in missing]
    with second_sshd(cluster, "node2", USER), cluster.sshd_stopped("node2"):
        for launcher in launchers:
            proj = make_project(tmp_path, {"script.py": SCRIPT})
            args = ("-i", str(inventory), "--ppn", "1", "--launcher", launcher, "script.py")
            run = cpuaccel_run(proj, *args)
            assert run.code == 0, (launcher, run)
            seen = {int(rank): text for rank, (_, text) in run.ranks().items()}
            assert '"host": "node1"' in seen[0] and '"host": "node2"' in seen[1], run
            # That node2's rank started at all shows MPI's ssh used node2's port (22 is
            # closed) and user (its sshd lets in cpxuser only). MPI forwards the head's
            # environment, HOME included, so the rank itself cannot tell.
            config = (run.run_dir / "ssh_config").read_text()
            assert f"Port {PORT}" in config and f'User "{USER}"' in config
            assert (
                f"[{cluster.node('node2').address}]:{PORT} ssh-ed25519"
                in (run.run_dir / "known_hosts").read_text()
            )


def test_a_worker_the_head_cannot_reach_fails_preflight_naming_the_pair(
    cluster: Cluster, tmp_path: Path
) -> None:
    inventory = _inventory(cluster, tmp_path)
    before = {name: _runs_on(cluster, name) for name in ("node1", "node2")}
    # node2 lets cpxuser in from the controller only (AllowUsers user@address), as an
    # admin network may: the controller's checks pass, the head's ssh does not.
    with second_sshd(cluster, "node2", f"{USER}@{cluster.controller_address}"):
        proj = make_project(tmp_path, {"script.py": SCRIPT})
        run = cpuaccel_run(proj, "-i", str(inventory), "--ppn", "1", "script.py")
        after = {name: _runs_on(cluster, name) for name in ("node1", "node2")}
    assert run.code == EXIT_NODE_FAILED, run
    address = cluster.node("node2").address
    assert (
        f"node1 -> node2: the MPI launcher on node1 cannot ssh to node2 "
        f"({USER}@{address}:{PORT})" in run.stderr
    ), run
    assert "Permission denied" in run.stderr and "AllowUsers" in run.stderr
    assert "no job was started" in run.stderr and run.stdout == ""
    assert after == before  # the check left nothing on the nodes
    assert list(Path("/tmp").glob("cpuaccel-reach-*")) == []  # /tmp: shared by the nodes


def test_check_names_the_pair_the_head_cannot_reach_as_run_would(
    cluster: Cluster, tmp_path: Path
) -> None:
    """`check` tries the launcher's ssh from the head as run's preflight does: the same
    worker refused from the head (not from the controller) is a problem naming the pair."""
    inventory = _inventory(cluster, tmp_path)
    address = cluster.node("node2").address
    before = {name: _runs_on(cluster, name) for name in ("node1", "node2")}
    with second_sshd(cluster, "node2", f"{USER}@{cluster.controller_address}"):
        table = cpuaccel("check", "-i", str(inventory), env=ENV, timeout=120)
        as_json = cpuaccel("check", "-i", str(inventory), "--json", env=ENV, timeout=120)
    assert table.returncode == EXIT_PROBLEMS, table
    pair = f"node1 -> node2: the MPI launcher on node1 cannot ssh to node2 ({USER}@{address}"
    assert f"error   {pair}:{PORT})" in table.stdout, table
    assert "Permission denied" in table.stdout and "AllowUsers" in table.stdout, table
    assert "Traceback" not in table.stderr + as_json.stderr
    assert as_json.returncode == EXIT_PROBLEMS, as_json
    report = json.loads(as_json.stdout)
    assert [p["host"] for p in report["problems"]] == ["node1 -> node2"], report["problems"]
    assert all(h["reachable"] for h in report["hosts"].values())  # the controller reaches both
    assert {name: _runs_on(cluster, name) for name in ("node1", "node2")} == before
    assert list(Path("/tmp").glob("cpuaccel-reach-*")) == []


def test_check_of_a_healthy_mixed_cluster_has_no_pair_problem(
    cluster: Cluster, tmp_path: Path
) -> None:
    inventory = _inventory(cluster, tmp_path)
    with second_sshd(cluster, "node2", USER):
        proc = cpuaccel("check", "-i", str(inventory), "--json", env=ENV, timeout=120)
    assert proc.returncode == EXIT_OK, proc
    assert json.loads(proc.stdout)["problems"] == []
    # One node, or only this machine: nothing to try, and nothing is said about it.
    here = ("-i", "localhost,", "-e", f"cpuaccel_python={sys.executable}")
    for args in (("-i", str(inventory), "--limit", "node1"), here):
        proc = cpuaccel("check", *args, "--json", env=ENV, timeout=120)
        assert proc.returncode == EXIT_OK, proc
        assert json.loads(proc.stdout)["problems"] == [], proc.stdout
