"""The network doctor's controller side: which connections it tries, how a node's
results are read (hostile ones too), the problems they make, and a whole diagnosis over
loopback with the controller's own "nodes" (local hosts, real netprobe programs).
Faults on a real network are in tests/cluster/test_network_doctor.py."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

from cpuaccel.connectors.connect_options import ConnectOptions
from cpuaccel.inventory.host import Host
from cpuaccel.network import doctor
from cpuaccel.network.doctor import ALL, MASTER, PEER, Connection, End

NAMES = ["node1", "node2", "node3"]


def test_the_default_tries_the_master_port_from_every_node_and_a_ring_of_peers() -> None:
    assert doctor.plan(NAMES, "node1") == [
        ("node1", "node1", MASTER),
        ("node2", "node1", MASTER),
        ("node3", "node1", MASTER),
        ("node1", "node2", PEER),
        ("node2", "node3", PEER),
        ("node3", "node1", PEER),
    ]
    assert doctor.plan(["solo"], "solo") == [("solo", "solo", MASTER)]


def test_all_pairs_and_given_pairs() -> None:
    peers = [(a, b) for a, b, purpose in doctor.plan(NAMES, "node2", ALL) if purpose == PEER]
    assert peers == [(a, b) for a in NAMES for b in NAMES if a != b]
    given = doctor.plan(
        NAMES, "node1", [("node3", "node2"), ("node3", "node2"), ("node1", "node1")]
    )
    assert given[3:] == [("node3", "node2", PEER)]  # once each, never a node to itself
    with pytest.raises(ValueError, match="not probed: node9"):
        doctor.plan(NAMES, "node1", [("node1", "node9")])
    with pytest.raises(ValueError, match="must be 'ring', 'all'"):
        doctor.plan(NAMES, "node1", "some")
    with pytest.raises(ValueError, match="head 'node7'"):
        doctor.plan(NAMES, "node7")


def test_a_nodes_result_is_checked_where_it_enters() -> None:
    good = {
        "status": "mtu",
        "detail": "0 of 262144 bytes came back within 2 s",
        "seconds": 2.01,
        "local": {"address": "192.0.2.1", "iface": "eth0", "mtu": 9000},
        "remote": {"iface": "eth0", "mtu": 9000},
    }
    read = doctor.connection_of("a", "b", "192.0.2.2", 41000, PEER, good)
    assert read.status == "mtu" and read.seconds == 2.01
    assert read.source_end == read.target_end == End("eth0", 9000)
    for hostile in (None, [], {"status": "rm -rf"}, {"status": ["ok"]}, "ok"):
        bad = doctor.connection_of("a", "b", "192.0.2.2", 41000, PEER, hostile)
        assert bad.status == "error" and "not understood" in bad.detail
    odd = {
        "status": "ok",
        "detail": "x" * 10_000,
        "seconds": -4,
        "local": {"iface": "eth0\nfake", "mtu": True},
        "remote": {"iface": "x" * 500, "mtu": 10**12},
    }
    read = doctor.connection_of("a", "b", "192.0.2.2", 41000, PEER, odd)
    assert len(read.detail) == 300 and read.seconds == 0.0
    assert read.source_end == read.target_end == End(None, None)


def connection(
    source: str, target: str, status: str, purpose: str = PEER, port: int = 41000
) -> Connection:
    ends = End("eth0", 9000)
    return Connection(source, target, "192.0.2.9", port, purpose, status, "why", 1.5, ends, ends)


def test_each_cause_is_one_problem_naming_every_node_that_met_it() -> None:
    problems = doctor.problems_of(
        [
            connection("node1", "node1", "ok", MASTER, 29500),
            connection("node2", "node1", "filtered", MASTER, 29500),
            connection("node3", "node1", "filtered", MASTER, 29500),
            connection("node1", "node2", "refused"),
            connection("node2", "node3", "no route"),
        ]
    )
    assert [(p.severity, p.host) for p in problems] == [
        ("error", "node2, node3 -> node1"),
        ("error", "node1 -> node2"),
        ("error", "node2 -> node3"),
    ]
    filtered, refused, no_route = problems
    assert "master port 29500" in filtered.message and "filtered" in filtered.message
    assert filtered.hint is not None and "TCP port 29500 on node1" in filtered.hint
    assert "refused" in refused.message and refused.hint is not None
    assert "every port" in refused.hint  # a peer's port: gloo's are anywhere
    assert "no route" in no_route.message
    assert no_route.hint is not None and "ip route get 192.0.2.9" in no_route.hint


def test_an_mtu_black_hole_is_one_problem_a_pair_of_nodes_either_way() -> None:
    [one] = doctor.problems_of(
        [
            connection("node1", "node2", "mtu"),
            connection("node2", "node1", "mtu", MASTER, 29500),
            connection("node2", "node1", "mtu"),
        ]
    )
    assert one.host == "node1 <-> node2"
    assert one.message == (
        "a large transfer between node1 and node2 stalls while small ones pass: an MTU "
        "black hole (node1 eth0 mtu 9000, node2 eth0 mtu 9000)"
    )
    assert one.hint is not None and "ip link set eth0 mtu 1500" in one.hint
    [other] = doctor.problems_of([connection("node3", "node1", "mtu")])
    assert other.host == "node3 -> node1" and "from node3 to node1" in other.message


def test_another_nodes_probe_answering_is_the_wrong_node() -> None:
    tokens = {"node1": "aa", "node2": "bb"}
    ok = connection("node1", "node2", "ok")
    raw = {"status": "ok", "remote": {"iface": "docker0", "mtu": 1500, "token": "aa"}}
    wrong = doctor.checked_answerer(ok, raw, tokens)
    assert wrong.status == doctor.WRONG_NODE and wrong.detail == "node1 answered"
    right = {"status": "ok", "remote": {"token": "bb"}}
    assert doctor.checked_answerer(ok, right, tokens) is ok
    stranger = {"status": "ok", "remote": {"token": "zz"}}
    assert doctor.checked_answerer(ok, stranger, tokens).detail == "a probe of another run answered"
    [problem] = doctor.problems_of([wrong])
    assert "node1 answered, not node2" in problem.message
    assert problem.hint is not None and "172.17.0.1" in problem.hint


def local_hosts(*names: str) -> list[Host]:
    return [Host(name, {"ansible_connection": "local"}) for name in names]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def test_a_whole_diagnosis_over_loopback_finds_nothing_in_well_under_five_seconds() -> None:
    hosts = local_hosts(*NAMES)
    port = free_port()
    started = time.monotonic()
    found = doctor.diagnose(
        hosts,
        dict.fromkeys(NAMES, "127.0.0.1"),
        master_port=port,
        pairs=ALL,
        connect=ConnectOptions(),
        forks=8,
    )
    assert time.monotonic() - started < 5
    assert found.problems == [] and found.unreached == []
    assert len(found.connections) == 3 + 6 and all(c.ok for c in found.connections)
    assert {c.port for c in found.connections if c.purpose == MASTER} == {port}
    assert found.connections[0].source_end == End(
        "lo", int(Path("/sys/class/net/lo/mtu").read_text())
    )
    report = json.loads(json.dumps(found.to_json()))
    assert report["connections"][0]["status"] == "ok" and report["problems"] == []
    # Every probe ended: the master port is free for the job again.
    with socket.socket() as again:
        again.bind(("", port))


def test_a_master_port_in_use_is_said_and_the_peers_still_tried() -> None:
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen(1)
        found = doctor.diagnose(
            local_hosts("a", "b"),
            {"a": "127.0.0.1", "b": "127.0.0.1"},
            master_port=taken.getsockname()[1],
            pairs=None,
            connect=ConnectOptions(),
            forks=4,
        )
    [problem] = found.problems
    assert problem.severity == "warning" and problem.host == "a"
    assert "could not listen on the master port" in problem.message


def test_every_node_needs_a_training_address() -> None:
    with pytest.raises(ValueError, match="no training address for b"):
        doctor.diagnose(
            local_hosts("a", "b"),
            {"a": "127.0.0.1"},
            master_port=1,
            connect=ConnectOptions(),
            forks=2,
        )
