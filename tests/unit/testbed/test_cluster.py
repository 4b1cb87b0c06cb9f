"""The multi-node test bed (cpuaccel.testbed.cluster) without root: its names fit Linux's
limits, the inventory it writes, and the rule that skips cluster tests off root (and fails
them when CPUACCEL_REQUIRE_CLUSTER=1). On real namespaces: tests/cluster/test_testbed.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cpuaccel.testbed.cluster import (
    Cluster,
    bridge_name,
    namespace_name,
    veth_name,
)

REPO = Path(__file__).resolve().parents[3]


# --------------------------------------------------------------------------- no root needed


def test_names_fit_linux_limits() -> None:
    assert bridge_name(255) == "cpxl255br"
    assert namespace_name(0, 3) == "cpxl0-node3"
    assert veth_name(0, 3) == "cpxl0v3"
    assert len(veth_name(255, 253)) <= 15
    assert len(bridge_name(255)) <= 15
    with pytest.raises(ValueError):
        Cluster(3, cluster_id=256)
    with pytest.raises(ValueError):
        Cluster(0)


def test_inventory_format(tmp_path: Path) -> None:
    cluster = Cluster(3, cluster_id=9, state_root=tmp_path)
    path = cluster.write_inventory(tmp_path / "default.yaml")
    inventory = yaml.safe_load(path.read_text())
    group_vars = inventory["all"]["vars"]
    assert group_vars == {
        "ansible_user": "root",
        "ansible_ssh_private_key_file": str(tmp_path / "cpxl-9" / "id_ed25519"),
        "ansible_ssh_common_args": (
            f"-o UserKnownHostsFile={tmp_path}/cpxl-9/known_hosts -o StrictHostKeyChecking=yes"
        ),
        "ansible_python_interpreter": sys.executable,
        "cpuaccel_python": sys.executable,
        "cpuaccel_workdir": "/srv/cpuaccel-node/work",
    }
    assert inventory["all"]["hosts"] == {
        "node1": {"ansible_host": "10.77.9.1"},
        "node2": {"ansible_host": "10.77.9.2"},
        "node3": {"ansible_host": "10.77.9.3"},
    }
    assert "node1: {ansible_host: 10.77.9.1}" in path.read_text()

    variant = cluster.write_inventory(
        tmp_path / "variant.yaml",
        host_overrides={"node2": {"cpuaccel_python": "/opt/other/bin/python"}},
        only=["node1", "node2"],
        cpuaccel_workdir="/srv/cpuaccel-node/other",
    )
    inventory = yaml.safe_load(variant.read_text())
    assert inventory["all"]["vars"]["cpuaccel_workdir"] == "/srv/cpuaccel-node/other"
    assert inventory["all"]["hosts"] == {
        "node1": {"ansible_host": "10.77.9.1"},
        "node2": {"ansible_host": "10.77.9.2", "cpuaccel_python": "/opt/other/bin/python"},
    }
    with pytest.raises(KeyError):
        cluster.write_inventory(tmp_path / "bad.yaml", host_overrides={"node9": {}})


def test_cluster_tests_skip_off_root_and_fail_when_required() -> None:
    """The marker logic, checked by running one cluster test without root."""
    target = "tests/cluster/test_testbed.py::test_each_node_has_its_own_hostname"
    argv = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", target]
    if os.geteuid() == 0:
        # A new user namespace makes the inner run uid 65534 without root's powers, yet it
        # still reads the same files (unlike switching to a user who cannot reach the venv).
        argv = ["unshare", "--user", *argv]
    env = {k: v for k, v in os.environ.items() if k != "CPUACCEL_REQUIRE_CLUSTER"}
    env["PYTHONDONTWRITEBYTECODE"] = "1"

    skipped = subprocess.run(
        argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert skipped.returncode == 0, skipped.stdout + skipped.stderr
    assert "1 skipped" in skipped.stdout
    assert "needs root" in skipped.stdout

    env["CPUACCEL_REQUIRE_CLUSTER"] = "1"
    required = subprocess.run(
        argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert required.returncode != 0, required.stdout
    assert "skipped" not in required.stdout
    assert "CPUACCEL_REQUIRE_CLUSTER=1 but the cluster tests cannot run" in required.stdout
    assert "needs root" in required.stdout
