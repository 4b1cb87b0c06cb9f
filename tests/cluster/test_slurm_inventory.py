"""``check --slurm`` and ``-i slurm:`` against the test bed's real slurmctld and slurmd
(the session cluster's nodes, which also run sshd)."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cpuaccel.errors import EXIT_NODE_FAILED, EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE
from cpuaccel.testbed.netns import NODE_DIR
from testsupport.command import cpuaccel, inherited_env

pytestmark = pytest.mark.cluster


@pytest.fixture
def project(slurm: Any, tmp_path: Path) -> Path:
    """A folder whose group_vars/all.yaml holds the SSH user, key and known_hosts of the
    bed's nodes: what Slurm does not say, written where -i slurm: reads it."""
    cluster = slurm.cluster
    (tmp_path / "group_vars").mkdir()
    values = {
        "ansible_user": "root",
        "ansible_ssh_private_key_file": str(cluster.key_path),
        "ansible_ssh_common_args": f"-o UserKnownHostsFile={cluster.known_hosts_path} "
        "-o StrictHostKeyChecking=yes",
        "cpuaccel_python": yaml.safe_load(cluster.inventory_path.read_text())["all"]["vars"][
            "cpuaccel_python"
        ],
    }
    (tmp_path / "group_vars" / "all.yaml").write_text(yaml.safe_dump(values))
    return tmp_path


def run(slurm: Any, folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return cpuaccel(*args, cwd=folder, env=inherited_env(**slurm.env), timeout=180)


def scontrol(slurm: Any, *args: str) -> None:
    subprocess.run(["scontrol", *args], env=inherited_env(**slurm.env), check=True, timeout=30)


@pytest.fixture
def drained_node3(slurm: Any) -> Iterator[str]:
    scontrol(slurm, "update", "nodename=node3", "state=drain", "reason=maint by test")
    try:
        yield "node3"
    finally:
        scontrol(slurm, "update", "nodename=node3", "state=resume")
        slurm.wait_idle(30)


def test_check_slurm_lists_the_partition_and_checks_its_nodes(slurm: Any, project: Path) -> None:
    done = run(slurm, project, "check", "--slurm", "--json")
    assert done.returncode == EXIT_OK, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert sorted(report["hosts"]) == sorted(slurm.nodes) == ["node1", "node2", "node3"]
    for name, entry in report["hosts"].items():
        assert entry["slurm"]["state"] == "IDLE" and entry["slurm"]["available"] is True
        assert entry["slurm"]["cpus"] >= 1
        assert entry["reachable"] is True and entry["facts"]["hostname"] == name
        # Reached at its NodeAddr, the node's own address in its namespace.
        assert slurm.cluster.node(name).address in entry["facts"]["addresses"]
    table = run(slurm, project, "check", "-i", f"slurm:{slurm.partition}")
    assert table.returncode == EXIT_OK, table.stdout + table.stderr
    assert "SLURM" in table.stdout and table.stdout.count(" idle ") == 3
    assert "3 host(s): 3 reachable, 0 unreachable; 0 error(s)" in table.stdout


def test_a_drained_node_is_named_with_its_reason_and_not_contacted(
    slurm: Any, project: Path, drained_node3: str
) -> None:
    done = run(slurm, project, "check", "--slurm", slurm.partition, "-v")
    assert done.returncode == EXIT_PROBLEMS, done.stdout + done.stderr
    assert "node3: Slurm has it drained (IDLE+DRAIN), reason: maint by test" in done.stdout
    assert "2 reachable, 0 unreachable, 1 not contacted" in done.stdout
    # -v names every connection made ("HOST: connected as ..."): none to node3.
    connected = [line.split(":")[0] for line in done.stderr.splitlines() if "connected as" in line]
    assert sorted(connected) == ["node1", "node2"], done.stderr


def test_ssh_refused_by_every_node_is_one_clear_line(
    slurm: Any, project: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # A key no node accepts: what a site with pam_slurm_adopt answers outside a job.
    key = tmp_path_factory.mktemp("stranger") / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    done = run(slurm, project, "check", "--slurm", "-e", f"ansible_ssh_private_key_file={key}")
    assert done.returncode == EXIT_NODE_FAILED, done.stdout + done.stderr
    problems = done.stdout.split("\n\n")[1]
    assert (
        "node1, node2, node3: SSH to Slurm nodes is not allowed here: use cpuaccel run "
        "inside salloc/sbatch" in " ".join(problems.split())
    )
    assert problems.count("error ") == 1  # one line, not three "unreachable"s


def test_unknown_partition_lists_the_real_ones(slurm: Any, project: Path) -> None:
    done = run(slurm, project, "check", "-i", "slurm:nope", "--list-hosts")
    assert done.returncode == EXIT_USAGE
    assert "slurm:nope: Slurm has no partition 'nope'" in done.stderr
    assert f"-i slurm:{slurm.partition} (default)" in done.stderr


def test_provision_works_on_a_partition_with_its_slurm_variables(slurm: Any, project: Path) -> None:
    # Each node's private folder (not the shared filesystem), fresh for this test.
    path = f"{NODE_DIR}/slurm-{uuid.uuid4().hex[:8]}"
    line = "{{ inventory_hostname }} {{ ansible_host }} {{ slurm_state }} {{ slurm_cpus }}"
    play = [{"hosts": slurm.partition, "tasks": [{"copy": {"dest": path, "content": line}}]}]
    (project / "play.yaml").write_text(yaml.safe_dump(play))
    done = run(slurm, project, "provision", "-i", "slurm:", "--playbook", "play.yaml")
    assert done.returncode == EXIT_OK, done.stdout + done.stderr
    for name in slurm.nodes:
        node = slurm.cluster.node(name)
        shown = slurm.cluster.exec(name, ["cat", path]).stdout
        slurm.cluster.exec(name, ["rm", "-f", path])
        assert shown == f"{name} {node.address} IDLE 2"
