"""The job's network chosen from the nodes' facts (cpuaccel.network.choice): the shapes
real clusters have, written as the fact probe reports them."""

from __future__ import annotations

from typing import Any

import pytest

from cpuaccel.facts.problems import ERROR, NOTE
from cpuaccel.inventory.host import Host
from cpuaccel.network.choice import JobNetwork, NodeChoice, Wanted, choose, of_facts, wanted_on

LO = ("lo", ["127.0.0.1/8"])


def facts(
    *interfaces: tuple[str, list[str]],
    routes: list[tuple[str, str, str | None]] = (),  # type: ignore[assignment]
    ssh: str | None = None,
    name: str = "n",
    own: list[str] = (),  # type: ignore[assignment]
    resolve: dict[str, list[str]] | None = None,
    down: tuple[str, ...] = (),
) -> dict[str, Any]:
    """A node's facts as the probe writes them: interfaces (name, ["addr/prefix"]), routes
    (interface, "destination/prefix", gateway), the ssh session's address, what the
    node's own name resolves to, and the other names it resolved."""
    return {
        "network": {
            "interfaces": [
                {
                    "name": iface,
                    "addresses": [[a.split("/")[0], int(a.split("/")[1])] for a in addresses],
                    "mtu": 65536 if iface == "lo" else 1500,
                    "up": iface not in down,
                    "loopback": iface == "lo",
                    "speed": None,
                }
                for iface, addresses in interfaces
            ],
            "routes": [
                {
                    "interface": iface,
                    "destination": dest.split("/")[0],
                    "prefix": int(dest.split("/")[1]),
                    "gateway": gateway,
                    "metric": 0,
                }
                for iface, dest, gateway in routes
            ],
            "ssh_address": ssh,
            "own_name": {"name": name, "addresses": list(own), "error": None},
        },
        "resolve": {peer: {"addresses": a, "error": None} for peer, a in (resolve or {}).items()},
    }


def stock(k: int, own: tuple[str, ...] = ("127.0.1.1",), **kw: Any) -> dict[str, Any]:
    """Node k of 192.0.2.0/24 as Debian with Docker leaves it: its own name on 127.0.1.1,
    docker0 at 172.17.0.1 on every node."""
    return facts(
        LO,
        ("eth0", [f"192.0.2.{k}/24"]),
        ("docker0", ["172.17.0.1/16"]),
        routes=[
            ("eth0", "0.0.0.0/0", "192.0.2.254"),
            ("eth0", "192.0.2.0/24", None),
            ("docker0", "172.17.0.0/16", None),
        ],
        ssh=f"192.0.2.{k}",
        name=f"node{k}",
        own=list(own),
        **kw,
    )


def hosts(*names: str, **vars: Any) -> list[Host]:
    return [Host(n, {"ansible_host": f"192.0.2.{i + 1}", **vars}) for i, n in enumerate(names)]


def nobody(host: Host) -> Wanted | None:
    return None


def chosen(network: JobNetwork | None) -> dict[str, tuple[str, str]]:
    assert network is not None
    return {name: (c.address, c.interface) for name, c in network.nodes.items()}


def test_stock_debian_nodes_talk_over_the_route_to_the_head_never_loopback_or_docker0() -> None:
    found = choose(hosts("node1", "node2"), {"node1": stock(1), "node2": stock(2)}, nobody)
    assert found is not None and found.complete
    assert found.head_address == "192.0.2.1"
    assert chosen(found) == {"node1": ("192.0.2.1", "eth0"), "node2": ("192.0.2.2", "eth0")}
    assert found.rank_map() == "192.0.2.1=eth0 192.0.2.2=eth0"
    assert (found.common_interface(), found.common_subnet()) == ("eth0", "192.0.2.0/24")
    notes = [(p.severity, p.host, p.message) for p in found.problems]
    assert (NOTE, None, "172.17.0.1 (docker0) is held by node1, node2: never used for the "
            "job's traffic") in notes  # fmt: skip
    looped = [p for p in found.problems if "resolves to 127.0.1.1" in p.message]
    assert [p.host for p in looped] == ["node1", "node2"]
    assert "GLOO_SOCKET_IFNAME" in looped[0].message and "eth0 (192.0.2.1)" in looped[0].message
    assert not found.errors


def test_names_that_do_not_resolve_alike_make_the_hostfile_use_addresses() -> None:
    aliases = hosts("trainer-a", "trainer-b")
    agree = {
        "trainer-a": stock(1, (), resolve={"trainer-b": ["192.0.2.2"]}),
        "trainer-b": stock(2, (), resolve={"trainer-a": ["192.0.2.1"]}),
    }
    assert choose(aliases, agree, nobody).use_names  # type: ignore[union-attr]
    unresolved = {
        "trainer-a": stock(1, (), resolve={"trainer-b": []}),
        "trainer-b": stock(2, (), resolve={"trainer-a": ["192.0.2.1"]}),
    }
    assert not choose(aliases, unresolved, nobody).use_names  # type: ignore[union-attr]
    elsewhere = {  # resolved, but to another network's address
        "trainer-a": stock(1, (), resolve={"trainer-b": ["10.9.0.2"]}),
        "trainer-b": stock(2, (), resolve={"trainer-a": ["192.0.2.1"]}),
    }
    assert not choose(aliases, elsewhere, nobody).use_names  # type: ignore[union-attr]
    # A node's own name on loopback: its own hostfile line would be, too.
    looped = {
        "trainer-a": stock(1, resolve={"trainer-b": ["192.0.2.2"]}),
        "trainer-b": stock(2, (), resolve={"trainer-a": ["192.0.2.1"]}),
    }
    assert not choose(aliases, looped, nobody).use_names  # type: ignore[union-attr]


def two_networks(k: int) -> dict[str, Any]:
    """Management on eth0 (ssh), a fast network on ib0 whose name differs on node 2."""
    fast = "ib0" if k == 1 else "ens2"
    return facts(
        LO,
        ("eth0", [f"192.0.2.{k}/24"]),
        (fast, [f"198.51.100.{k}/24"]),
        routes=[
            ("eth0", "0.0.0.0/0", "192.0.2.254"),
            ("eth0", "192.0.2.0/24", None),
            (fast, "198.51.100.0/24", None),
        ],
        ssh=f"192.0.2.{k}",
    )


def test_a_named_network_is_used_on_every_node_whatever_its_interface_is_called() -> None:
    nodes = hosts("a", "b")
    both = {"a": two_networks(1), "b": two_networks(2)}
    cidr = choose(nodes, both, lambda h: Wanted("198.51.100.0/24", "--network"))
    assert chosen(cidr) == {"a": ("198.51.100.1", "ib0"), "b": ("198.51.100.2", "ens2")}
    assert cidr is not None and cidr.head_address == "198.51.100.1"
    # Interfaces named apart: no one name for the launchers, one subnet for Open MPI.
    assert (cidr.common_interface(), cidr.common_subnet()) == (None, "198.51.100.0/24")
    by_name = choose(nodes, both, lambda h: Wanted("ib0" if h.name == "a" else "ens2", "vars"))
    assert chosen(by_name) == chosen(cidr)
    # Without one, the head's address is the one ssh came in on: the management network.
    plain = choose(nodes, both, nobody)
    assert chosen(plain) == {"a": ("192.0.2.1", "eth0"), "b": ("192.0.2.2", "eth0")}


def test_a_named_network_a_node_lacks_is_one_error_naming_its_addresses() -> None:
    found = choose(
        hosts("a", "b"),
        {"a": two_networks(1), "b": facts(LO, ("eth0", ["192.0.2.2/24"]), ssh="192.0.2.2")},
        lambda h: Wanted("198.51.100.0/24", "cpuaccel.yaml:3"),
    )
    assert found is not None and not found.complete
    [error] = found.errors
    assert error.host == "b"
    assert error.message == (
        "no address on 198.51.100.0/24 (cpuaccel.yaml:3); its addresses: 192.0.2.2/24 (eth0)"
    )


def test_no_route_to_the_head_and_a_down_interface_are_named() -> None:
    head = facts(LO, ("eth0", ["192.0.2.1/24"]), ssh="192.0.2.1",
                 routes=[("eth0", "192.0.2.0/24", None)])  # fmt: skip
    isolated = facts(LO, ("eth0", ["203.0.113.5/24"]), ssh="203.0.113.5",
                     routes=[("eth0", "203.0.113.0/24", None)])  # fmt: skip
    found = choose(hosts("a", "b"), {"a": head, "b": isolated}, nobody)
    assert found is not None
    assert [(p.host, p.message) for p in found.errors] == [
        ("b", "no route to the head node's 192.0.2.1")
    ]
    down = facts(LO, ("eth0", ["192.0.2.2/24"]), ssh="192.0.2.2", down=("eth0",),
                 routes=[("eth0", "192.0.2.0/24", None)])  # fmt: skip
    found = choose(hosts("a", "b"), {"a": head, "b": down}, nobody)
    assert found is not None
    assert [p.message for p in found.errors] == [
        "its route to the head node's 192.0.2.1 is over eth0, which has no address to use "
        "(it is down)"
    ]


def test_a_route_that_rejects_is_no_route() -> None:
    head = facts(LO, ("eth0", ["192.0.2.1/24"]), ssh="192.0.2.1",
                 routes=[("eth0", "192.0.2.0/24", None)])  # fmt: skip
    rejecting = facts(LO, ("eth0", ["192.0.2.2/24"]), ssh="192.0.2.2",
                      routes=[("eth0", "192.0.2.0/24", None), (None, "192.0.2.1/32", None)])  # type: ignore[list-item]  # fmt: skip
    found = choose(hosts("a", "b"), {"a": head, "b": rejecting}, nobody)
    assert found is not None
    assert [(p.host, p.message) for p in found.errors] == [
        ("b", "no route to the head node's 192.0.2.1")
    ]


def test_a_head_whose_only_address_is_shared_is_refused() -> None:
    # Both nodes reached through one NAT address: the head holds no address of its own
    # that is not also the other's.
    found = choose(
        hosts("a", "b"),
        {
            "a": facts(LO, ("docker0", ["172.17.0.1/16"]), ssh=None),
            "b": facts(LO, ("docker0", ["172.17.0.1/16"]), ("eth0", ["203.0.113.2/24"])),
        },
        nobody,
    )
    assert found is not None
    [error] = found.errors
    assert error.host == "a" and "cannot tell which of its addresses" in error.message


def test_two_names_of_one_machine_share_no_address() -> None:
    # The same node by its name and by its address: one holder of its addresses.
    same = facts(LO, ("eth0", ["192.0.2.1/24"]), ssh="192.0.2.1",
                 routes=[("eth0", "192.0.2.0/24", None)])  # fmt: skip
    found = choose(hosts("node1", "192.0.2.1"), {"node1": same, "192.0.2.1": same}, nobody)
    assert found is not None and found.complete, found
    assert chosen(found) == {"node1": ("192.0.2.1", "eth0"), "192.0.2.1": ("192.0.2.1", "eth0")}
    assert found.nodes["192.0.2.1"].why == "it holds the head's address"


def test_the_longest_route_wins_and_a_gateway_is_said() -> None:
    head = facts(LO, ("eth0", ["192.0.2.1/24"]), ssh="192.0.2.1",
                 routes=[("eth0", "192.0.2.0/24", None)])  # fmt: skip
    routed = facts(
        LO,
        ("eth0", ["203.0.113.5/24"]),
        ("eth1", ["198.51.100.5/24"]),
        routes=[
            ("eth0", "0.0.0.0/0", "203.0.113.1"),
            ("eth1", "192.0.2.0/23", "198.51.100.1"),
            ("eth0", "203.0.113.0/24", None),
        ],
    )
    found = choose(hosts("a", "b"), {"a": head, "b": routed}, nobody)
    assert found is not None and found.complete
    b = found.nodes["b"]
    assert (b.address, b.interface) == ("198.51.100.5", "eth1")
    assert b.why == "its route to the head's 192.0.2.1 via 198.51.100.1"
    assert found.common_subnet() is None


def test_a_head_on_this_machine_takes_the_address_facing_the_nodes() -> None:
    # The controller itself is the head, reached without ssh: its default route leaves
    # by another interface than the one the nodes are on.
    controller = facts(
        LO,
        ("eth0", ["203.0.113.7/24"]),
        ("br0", ["192.0.2.254/24"]),
        routes=[("eth0", "0.0.0.0/0", "203.0.113.1"), ("br0", "192.0.2.0/24", None)],
    )
    head = Host("localhost", {"ansible_connection": "local"})
    found = choose([head, *hosts("node1")], {"localhost": controller, "node1": stock(1, ())},
                   nobody)  # fmt: skip
    assert found is not None and found.complete, found
    assert chosen(found) == {"localhost": ("192.0.2.254", "br0"), "node1": ("192.0.2.1", "eth0")}
    assert found.nodes["localhost"].why == "its route to 192.0.2.1"


def test_one_node_or_this_machine_alone_has_no_network_to_choose() -> None:
    assert choose(hosts("a"), {"a": stock(1)}, nobody) is None
    local = [Host("localhost", {"ansible_connection": "local"})] * 2
    assert choose(local, {"localhost": stock(1)}, nobody) is None


@pytest.mark.parametrize(
    "network",
    [
        None,
        "not a dict",
        {"interfaces": "eth0", "routes": []},
        {"interfaces": [{"name": "eth0; rm -rf /", "addresses": []}], "routes": []},
        {"interfaces": [{"name": "-iface", "addresses": []}], "routes": []},
        {"interfaces": [{"name": "eth0", "addresses": [["300.1.1.1", 24]]}], "routes": []},
        {"interfaces": [{"name": "eth0", "addresses": [["10.0.0.1", "24"]]}], "routes": []},
        {"interfaces": [{"name": "eth0", "addresses": [], "mtu": "big"}], "routes": []},
        {
            "interfaces": [],
            "routes": [{"interface": "eth0", "destination": "x", "prefix": 8, "metric": 0}],
        },
        {"interfaces": [{"name": "e", "addresses": []}] * 5000, "routes": []},
        {"interfaces": [], "routes": [], "ssh_address": "not an address"},
    ],
)
def test_a_node_answer_of_another_shape_is_one_error_never_a_traceback(network: Any) -> None:
    problem = of_facts("n1", {"network": network})
    assert not hasattr(problem, "interfaces")
    assert problem.severity == ERROR and problem.host == "n1"  # type: ignore[union-attr]
    assert problem.message.startswith("its network facts were not understood")  # type: ignore[union-attr]


def test_the_flag_wins_over_every_host_then_a_host_s_own_then_the_run_s() -> None:
    own = Host("b", {"cpuaccel_network": "ens2"})
    plain = Host("a", {})
    assert wanted_on(own, "10.1.0.0/16", "--network", flag=True) == Wanted(
        "10.1.0.0/16", "--network"
    )
    assert wanted_on(own, "10.1.0.0/16", "cpuaccel.yaml:2", flag=False) == Wanted(
        "ens2", "cpuaccel_network of b"
    )
    assert wanted_on(plain, "10.1.0.0/16", "cpuaccel.yaml:2", flag=False) == Wanted(
        "10.1.0.0/16", "cpuaccel.yaml:2"
    )
    assert wanted_on(plain, None, None, flag=False) is None


def test_a_node_s_choice_as_json_is_its_fields_but_the_host_in_order() -> None:
    chosen = NodeChoice("n1", "10.0.0.1", "eth1", 24, None, "the only address")
    assert list(chosen.to_json().items()) == [
        ("address", "10.0.0.1"),
        ("interface", "eth1"),
        ("prefix", 24),
        ("mtu", None),
        ("why", "the only address"),
    ]
