"""The delaying relay in front of real nodes (testsupport/relay.py): cpuaccel check
through it reaches every node, and a route the relay does not carry leaves its node
unreachable, so the traffic does go through the relay."""

from __future__ import annotations

from pathlib import Path

import pytest

from cpuaccel.errors import EXIT_NODE_FAILED, EXIT_OK
from cpuaccel.testbed.cluster import Cluster
from testsupport.command import cpuaccel
from testsupport.relay import Relay, relayed_hosts

pytestmark = pytest.mark.cluster

PORT_BASE = 31000


def _relayed_inventory(cluster: Cluster, tmp_path: Path) -> Path:
    overrides, args = relayed_hosts(cluster, PORT_BASE, tmp_path)
    return cluster.write_inventory(
        tmp_path / "inventory.yaml", overrides, ansible_ssh_common_args=args
    )


def test_check_through_the_relay_reaches_every_node(cluster: Cluster, tmp_path: Path) -> None:
    inventory = _relayed_inventory(cluster, tmp_path)
    routes = [(PORT_BASE + n.index, n.address, 22) for n in cluster.nodes]
    with Relay.start(routes, cluster.controller_address, 0.005):
        proc = cpuaccel("check", "-i", str(inventory), timeout=120)
    assert proc.returncode == EXIT_OK, proc.stdout + proc.stderr


def test_a_node_the_relay_does_not_carry_is_unreachable(cluster: Cluster, tmp_path: Path) -> None:
    inventory = _relayed_inventory(cluster, tmp_path)
    last = cluster.nodes[-1]
    routes = [(PORT_BASE + n.index, n.address, 22) for n in cluster.nodes if n is not last]
    with Relay.start(routes, cluster.controller_address, 0.0):
        proc = cpuaccel("check", "-i", str(inventory), timeout=120)
    assert proc.returncode == EXIT_NODE_FAILED, proc.stdout + proc.stderr
    assert last.name in proc.stdout + proc.stderr
