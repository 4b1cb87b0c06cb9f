"""A node's interfaces and routes from the kernel (cpuaccel.node.netif), against what
iproute2 prints on this same machine."""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess

import pytest

from cpuaccel import worker
from cpuaccel.node import netif

needs_ip = pytest.mark.skipif(shutil.which("ip") is None, reason="iproute2's ip is not here")


@needs_ip
def test_interfaces_hold_every_address_ip_lists_with_its_prefix() -> None:
    listed = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True, check=True)
    expected = set()
    for line in listed.stdout.splitlines():
        words = line.split()
        address = ipaddress.IPv4Interface(words[words.index("inet") + 1])
        expected.add((words[1].split("@")[0], str(address.ip), address.network.prefixlen))
    found = {
        (entry["name"], address, prefix)
        for entry in netif.interfaces()
        for address, prefix in entry["addresses"]
    }
    assert found == expected
    lo = next(e for e in netif.interfaces() if e["name"] == "lo")
    assert lo["loopback"] and lo["up"] and ["127.0.0.1", 8] in lo["addresses"]
    assert isinstance(lo["mtu"], int) and lo["mtu"] > 0


@needs_ip
def test_routes_are_the_main_table_ip_lists() -> None:
    listed = subprocess.run(
        ["ip", "-4", "route", "show", "table", "main"], capture_output=True, text=True, check=True
    )
    expected = set()
    for line in listed.stdout.splitlines():
        words = line.split()
        if words[0] in ("broadcast", "local", "unreachable", "blackhole", "prohibit"):
            continue
        dest = "0.0.0.0/0" if words[0] == "default" else words[0]
        network = ipaddress.IPv4Network(dest if "/" in dest else f"{dest}/32")
        gateway = words[words.index("via") + 1] if "via" in words else None
        expected.add((words[words.index("dev") + 1], str(network.network_address),
                      network.prefixlen, gateway))  # fmt: skip
    found = {
        (r["interface"], r["destination"], r["prefix"], r["gateway"])
        for r in netif.routes()
        if r["interface"] is not None  # a route that rejects: ip names its type instead
    }
    assert found == expected


def test_the_kernel_s_source_address_and_its_interface() -> None:
    assert netif.source_address("127.0.0.1") == "127.0.0.1"
    assert netif.interface_of("127.0.0.1") == "lo"
    assert netif.interface_of("192.0.2.250") is None  # documentation range: nobody's


def test_ssh_address_is_the_server_side_of_ssh_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SSH_CONNECTION", "192.0.2.9 51234 192.0.2.1 22")
    assert netif.ssh_address() == "192.0.2.1"
    monkeypatch.setenv("SSH_CONNECTION", "garbage")
    assert netif.ssh_address() is None
    monkeypatch.delenv("SSH_CONNECTION")
    assert netif.ssh_address() is None


def test_the_rank_takes_its_own_node_s_interface_unless_the_user_set_one() -> None:
    mine = {"CPUACCEL_NODE_IFACES": "192.0.2.250=eth9 127.0.0.1=lo"}
    assert worker.network_env(mine) == {name: "lo" for name in worker.IFACE_VARIABLES}
    assert worker.network_env({**mine, "GLOO_SOCKET_IFNAME": "eth7"}) == {
        name: "lo" for name in worker.IFACE_VARIABLES if name != "GLOO_SOCKET_IFNAME"
    }
    assert worker.network_env({"CPUACCEL_NODE_IFACES": "192.0.2.250=eth9"}) == {}
    assert worker.network_env({}) == {}
    env = dict(os.environ, **mine, RANK="0")
    worker.apply_env(env)
    assert env["GLOO_SOCKET_IFNAME"] == "lo" and env["TP_SOCKET_IFNAME"] == "lo"
