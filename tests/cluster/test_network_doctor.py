"""The network doctor (cpuaccel.network.doctor) on real namespace nodes: a healthy
network gives no problem in well under 5 s; a firewall that drops the head's master
port, or one node's answers to another on the ports gloo picks, is named "filtered" for
that port; a node with no route to another is named "no route"; jumbo frames on two
nodes behind a 1500-byte path are named an MTU black hole, not a firewall.

The faults are set inside the nodes with ``ip`` (policy routing: this kernel has no
firewall tool's modules, no netem) and always taken down again."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator, Sequence

import pytest

from cpuaccel.connectors.connect_options import ConnectOptions
from cpuaccel.inventory.inventory import Inventory
from cpuaccel.network import doctor
from cpuaccel.testbed.cluster import Cluster
from tests.cluster.fixtures import master_port

pytestmark = pytest.mark.cluster

TABLE = "100"  # a routing table of the faults' own, holding only a blackhole
EPHEMERAL = "32768-60999"  # the kernel's default range for ports it picks


def ip(cluster: Cluster, name: str, *lines: str, check: bool = True) -> None:
    for line in lines:
        done = cluster.exec(name, ["ip", *line.split()])
        assert done.returncode == 0 or not check, f"{name}: ip {line}: {done.stderr}"


@contextlib.contextmanager
def dropped(cluster: Cluster, name: str, selector: str) -> Iterator[None]:
    """Node ``name``'s outgoing TCP packets that match ``selector`` (an ``ip rule``
    selector) vanish: its answers from a port, as a firewall's DROP leaves a connection
    attempt waiting. Its ssh (port 22) still passes."""
    ip(cluster, name, f"route add blackhole default table {TABLE}")
    try:
        ip(cluster, name, f"rule add ipproto tcp {selector} table {TABLE}")
        try:
            yield
        finally:
            ip(cluster, name, f"rule del ipproto tcp {selector} table {TABLE}", check=False)
    finally:
        ip(cluster, name, f"route flush table {TABLE}", check=False)


@contextlib.contextmanager
def jumbo_frames(cluster: Cluster, names: Sequence[str]) -> Iterator[None]:
    """The nodes' eth0 at MTU 9000 while the bridge's ports carry 1500, each packet one
    segment (a veth passes a larger offloaded packet whole, where a switch drops each
    frame over its MTU)."""
    try:
        for name in names:
            ip(cluster, name, "link set eth0 mtu 9000 gso_max_segs 1")
        yield
    finally:
        for name in names:
            ip(cluster, name, "link set eth0 mtu 1500 gso_max_segs 65535", check=False)


@contextlib.contextmanager
def unreachable(cluster: Cluster, name: str, address: str) -> Iterator[None]:
    """Node ``name`` has no route to ``address``."""
    ip(cluster, name, f"route add unreachable {address}/32")
    try:
        yield
    finally:
        ip(cluster, name, f"route del unreachable {address}/32", check=False)


def diagnose(cluster: Cluster, port: int, pairs: str = doctor.RING) -> doctor.Diagnosis:
    hosts = Inventory.load(cluster.inventory_path).select(None)
    return doctor.diagnose(
        hosts,
        {h.name: h.address for h in hosts},
        master_port=port,
        pairs=pairs,
        connect=ConnectOptions(),
        forks=8,
    )


def failed(found: doctor.Diagnosis) -> list[tuple[str, str, str, str]]:
    return [(c.source, c.target, c.purpose, c.status) for c in found.connections if not c.ok]


@pytest.mark.parametrize("pairs", [doctor.RING, doctor.ALL])
def test_a_healthy_network_has_no_problem_in_well_under_five_seconds(
    cluster: Cluster, pairs: str
) -> None:
    port = int(master_port())
    started = time.monotonic()
    found = diagnose(cluster, port, pairs)
    assert time.monotonic() - started < 5
    assert found.problems == [] and found.unreached == []
    assert len(found.connections) == 3 + (3 if pairs == doctor.RING else 6)
    for c in found.connections:
        assert c.ok and c.source_end == c.target_end == doctor.End("eth0", 1500), c
    # The probes are gone, and the master port is free for the job, also to a server
    # that does not set SO_REUSEADDR (no connection left it in TIME_WAIT).
    for node in cluster.names:
        assert cluster.wait_idle(node, 5.0) == []
    bind = f"import socket; socket.socket().bind(('', {port}))"
    done = cluster.exec("node1", [sys.executable, "-c", bind])
    assert done.returncode == 0, done.stderr


def test_a_filtered_master_port_is_named_for_that_port(cluster: Cluster) -> None:
    port = int(master_port())
    with dropped(cluster, "node1", f"sport {port}"):
        started = time.monotonic()
        found = diagnose(cluster, port)
        took = time.monotonic() - started
    assert took < 10
    assert failed(found) == [
        ("node2", "node1", "master", "filtered"),
        ("node3", "node1", "master", "filtered"),
    ]
    [problem] = found.problems
    assert problem.host == "node2, node3 -> node1"
    assert f"master port {port}" in problem.message and "filtered" in problem.message
    assert problem.hint is not None and f"TCP port {port} on node1" in problem.hint


def test_a_peer_port_blocked_between_two_nodes_is_named(cluster: Cluster) -> None:
    """node2 drops its answers to node1 from the ports the kernel picks (the master
    port, below that range, and ssh still pass): node1 cannot reach node2's gloo port."""
    node1 = cluster.node("node1").address
    with dropped(cluster, "node2", f"to {node1} sport {EPHEMERAL} dport {EPHEMERAL}"):
        found = diagnose(cluster, int(master_port()))
    assert failed(found) == [("node1", "node2", "peer", "filtered")]
    [problem] = found.problems
    assert problem.host == "node1 -> node2" and "filtered" in problem.message
    peer = next(c for c in found.connections if not c.ok)
    assert f"node2's port {peer.port} " in problem.message


def test_no_route_is_named(cluster: Cluster) -> None:
    with unreachable(cluster, "node1", cluster.node("node2").address):
        found = diagnose(cluster, int(master_port()))
    # node1's answers to node2 find no route either: node2's try of the master port waits.
    assert failed(found) == [
        ("node1", "node2", "peer", "no route"),
        ("node2", "node1", "master", "filtered"),
    ]
    assert "no route" in found.problems[0].message


def test_an_mtu_black_hole_is_named_mtu_not_a_firewall(cluster: Cluster) -> None:
    with jumbo_frames(cluster, ["node1", "node2"]):
        started = time.monotonic()
        found = diagnose(cluster, int(master_port()))
        took = time.monotonic() - started
    assert took < 10
    # node1 -> node2 (the ring) and node2 -> node1 (the master port): jumbo both ends.
    # node3 keeps 1500, so TCP to and from it agrees on segments the path carries.
    assert failed(found) == [
        ("node1", "node2", "peer", "mtu"),
        ("node2", "node1", "master", "mtu"),
    ]
    [problem] = found.problems
    assert problem.host == "node1 <-> node2"
    assert "MTU black hole (node1 eth0 mtu 9000, node2 eth0 mtu 9000)" in problem.message
    assert "filtered" not in problem.message and "firewall" not in problem.message
    assert problem.hint is not None and "ip link set eth0 mtu 1500" in problem.hint
