"""The test bed's network conditions (testsupport.netfaults) on the shared cluster:
each one's effect seen with real sockets and commands inside the nodes, and gone on exit."""

from __future__ import annotations

import json
import shlex
import socket
import subprocess
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from cpuaccel.testbed.cluster import Cluster
from cpuaccel.testbed.netns import exec_argv
from tests.cluster.fixtures import master_port
from testsupport.command import clean_env, cpuaccel
from testsupport.netfaults import (
    alias_names,
    filter_port,
    interface_bytes,
    mtu_black_hole,
    port_ranges,
    second_network,
    stock_debian,
)

pytestmark = pytest.mark.cluster

MB = 1_000_000

# Listens on ADDRESS:PORT, says so, then reads one connection for up to SECONDS and
# prints how many bytes came.
SERVER = textwrap.dedent(
    """
    import socket, sys, time
    address, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((address, port))
    server.listen(8)
    print("listening", flush=True)
    server.settimeout(seconds)
    deadline = time.monotonic() + seconds
    got = 0
    try:
        conn, _ = server.accept()
        while time.monotonic() < deadline:
            conn.settimeout(max(0.01, deadline - time.monotonic()))
            data = conn.recv(65536)
            if not data:
                break
            got += len(data)
    except OSError:
        pass
    print(got, flush=True)
    """
)

# Connects to ADDRESS:PORT within TIMEOUT and sends SIZE bytes; prints "sent",
# "stalled" (the send made no way within TIMEOUT) or the connect error's class.
CLIENT = textwrap.dedent(
    """
    import socket, sys
    address, port = sys.argv[1], int(sys.argv[2])
    size, timeout = int(sys.argv[3]), float(sys.argv[4])
    try:
        conn = socket.create_connection((address, port), timeout=timeout)
    except OSError as exc:
        print(type(exc).__name__)
        raise SystemExit(0)
    try:
        conn.sendall(b"x" * size)
        conn.close()
        print("sent")
    except socket.timeout:
        print("stalled")
    """
)


@contextmanager
def serving(
    cluster: Cluster, name: str, address: str, port: int, seconds: float = 6.0
) -> Iterator[subprocess.Popen[str]]:
    """SERVER in node `name`, listening when the block starts; killed after it."""
    node = cluster.node(name)
    argv = [cluster.python, "-c", SERVER, address, str(port), str(seconds)]
    proc = subprocess.Popen(
        exec_argv(node, argv, "/", cluster.hosts_path, cluster.fresh_bashrc),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "listening", proc.stderr
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=5)


def received(proc: subprocess.Popen[str]) -> int:
    """The byte count SERVER printed when its time was up."""
    out, _err = proc.communicate(timeout=30)
    return int(out.split()[-1]) if out.split() else -1


def send(cluster: Cluster, name: str, address: str, port: int, size: int, timeout: float) -> str:
    """CLIENT in node `name`: its one line of output."""
    argv = [cluster.python, "-c", CLIENT, address, str(port), str(size), str(timeout)]
    result = cluster.exec(name, argv, timeout=60)
    assert result.returncode == 0, result.stderr
    return str(result.stdout.strip())


def connect_from_controller(address: str, port: int, timeout: float = 2.0) -> str:
    try:
        socket.create_connection((address, port), timeout=timeout).close()
    except OSError as exc:
        return type(exc).__name__
    return "connected"


def ssh(cluster: Cluster, name: str, *command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cluster.ssh_argv(name, *command), capture_output=True, text=True, timeout=60, check=False
    )


def resolve_over_ssh(cluster: Cluster, name: str, hostname: str) -> str:
    """The first address getaddrinfo gives `hostname` in an ssh session on node `name`."""
    code = f"import socket; print(socket.getaddrinfo({hostname!r}, None)[0][4][0])"
    result = ssh(cluster, name, cluster.python, "-c", shlex.quote(code))
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def link_json(cluster: Cluster, name: str, device: str) -> list[dict[str, object]]:
    """`ip -j addr show dev DEVICE` in the node ([] if there is no such device)."""
    namespace = cluster.node(name).namespace
    shown = subprocess.run(
        ["ip", "-n", namespace, "-j", "-d", "addr", "show", "dev", device],
        capture_output=True,
        text=True,
        check=False,
    )
    return list(json.loads(shown.stdout)) if shown.returncode == 0 else []


# --------------------------------------------------------------------------- stock Debian


def test_stock_debian_hostname_and_docker0(cluster: Cluster) -> None:
    node1, node2 = cluster.node("node1"), cluster.node("node2")
    with stock_debian(cluster, ["node1", "node2"]):
        assert resolve_over_ssh(cluster, "node1", "node1") == "127.0.1.1"
        assert resolve_over_ssh(cluster, "node1", "node2") == node2.address
        assert resolve_over_ssh(cluster, "node2", "node1") == node1.address
        assert resolve_over_ssh(cluster, "node3", "node1") == node1.address  # not stock
        [docker0] = link_json(cluster, "node1", "docker0")
        assert docker0["operstate"] == "DOWN"
        assert "NO-CARRIER" in docker0["flags"]  # type: ignore[operator]
        assert [(a["local"], a["prefixlen"]) for a in docker0["addr_info"]  # type: ignore[attr-defined]
                if a["family"] == "inet"] == [("172.17.0.1", 16)]  # fmt: skip
        # Its address is the node's as long as it exists, carrier or not.
        bound = cluster.exec("node1", [cluster.python, "-c",
                             "import socket; socket.socket().bind(('172.17.0.1', 0))"])  # fmt: skip
        assert bound.returncode == 0, bound.stderr
        assert link_json(cluster, "node3", "docker0") == []
    assert resolve_over_ssh(cluster, "node1", "node1") == node1.address
    assert link_json(cluster, "node1", "docker0") == []
    assert link_json(cluster, "node2", "docker0") == []
    assert not (cluster.state_dir / "hosts-node1").exists()


ALL_REDUCE = textwrap.dedent(
    """
    import datetime, torch, torch.distributed as dist
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=6))
    tensor = torch.ones(2) * (dist.get_rank() + 1)
    dist.all_reduce(tensor)
    print("sum", tensor.tolist(), flush=True)
    dist.destroy_process_group()
    """
)


def all_reduce_by_hand(cluster: Cluster, env: str) -> list[subprocess.CompletedProcess[str]]:
    """ALL_REDUCE as two ranks started by hand over ssh on node1 and node2."""
    port = master_port()
    procs = []
    for rank, name in enumerate(["node1", "node2"]):
        exports = (
            f"{env} RANK={rank} WORLD_SIZE=2 MASTER_ADDR={cluster.node('node1').address} "
            f"MASTER_PORT={port}"
        )
        command = f"{exports} timeout 15 {cluster.python} -c {shlex.quote(ALL_REDUCE)}"
        procs.append(
            subprocess.Popen(
                cluster.ssh_argv(name, command),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    done = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return done


def test_stock_debian_breaks_gloo_unless_its_interface_is_named(cluster: Cluster) -> None:
    with stock_debian(cluster, ["node1", "node2"]):
        failed = all_reduce_by_hand(cluster, "")
        assert all(proc.returncode != 0 for proc in failed)
        errors = "".join(proc.stderr for proc in failed)
        assert "connectFullMesh failed" in errors and "127.0.1.1" in errors, errors
        passed = all_reduce_by_hand(cluster, "GLOO_SOCKET_IFNAME=eth0")
        for proc in passed:
            assert proc.returncode == 0, proc.stderr
            assert "sum [3.0, 3.0]" in proc.stdout


# --------------------------------------------------------------------------- second network


def test_second_network_carries_what_is_sent_to_its_addresses(cluster: Cluster) -> None:
    port = int(master_port())
    with second_network(cluster) as net:
        assert net.addresses["node2"] == f"10.78.{cluster.cluster_id}.2"
        assert net.controller_address == f"10.78.{cluster.cluster_id}.254"
        [eth1] = link_json(cluster, "node2", "eth1")
        assert eth1["operstate"] == "UP"
        before = {dev: interface_bytes(cluster, "node2", dev) for dev in ("eth0", "eth1")}
        with serving(cluster, "node2", net.addresses["node2"], port) as server:
            assert send(cluster, "node1", net.addresses["node2"], port, MB, 5) == "sent"
            assert received(server) == MB
        after = {dev: interface_bytes(cluster, "node2", dev) for dev in ("eth0", "eth1")}
        assert after["eth1"].rx - before["eth1"].rx > MB
        assert after["eth0"].rx - before["eth0"].rx < MB // 10
        with serving(cluster, "node3", net.addresses["node3"], port):
            assert connect_from_controller(net.addresses["node3"], port) == "connected"
    assert link_json(cluster, "node2", "eth1") == []
    assert not Path(f"/sys/class/net/{net.bridge}").exists()


def test_interface_bytes_refuses_a_name_that_is_no_interface(cluster: Cluster) -> None:
    with pytest.raises(ValueError, match="not an interface name"):
        interface_bytes(cluster, "node1", "../../etc")


# --------------------------------------------------------------------------- MTU black hole


def test_mtu_black_hole_passes_small_exchanges_and_stalls_bulk(cluster: Cluster) -> None:
    port = int(master_port())
    node2 = cluster.node("node2")
    with mtu_black_hole(cluster, ["node1", "node2"]):
        [eth0] = link_json(cluster, "node1", "eth0")
        assert eth0["mtu"] == 9000
        with serving(cluster, "node2", node2.address, port, seconds=4) as server:
            assert send(cluster, "node1", node2.address, port, 1000, 3) == "sent"
            assert received(server) == 1000
        with serving(cluster, "node2", node2.address, port, seconds=4) as server:
            assert send(cluster, "node1", node2.address, port, MB, 3) == "stalled"
            assert received(server) < MB
        # The controller's side is 1500: its ssh to the nodes moves bulk both ways.
        result = ssh(cluster, "node1", "head", "-c", str(MB), "/dev/zero", "|", "wc", "-c")
        assert result.stdout.strip() == str(MB), result.stderr
        pulled = subprocess.run(cluster.ssh_argv("node2", "head", "-c", str(MB), "/dev/zero"),
                                capture_output=True, timeout=30, check=False)  # fmt: skip
        assert len(pulled.stdout) == MB
    [eth0] = link_json(cluster, "node1", "eth0")
    assert eth0["mtu"] == 1500
    assert eth0["gso_max_segs"] == link_json(cluster, "node3", "eth0")[0]["gso_max_segs"]
    with serving(cluster, "node2", node2.address, port, seconds=4) as server:
        assert send(cluster, "node1", node2.address, port, MB, 3) == "sent"
        assert received(server) == MB


# --------------------------------------------------------------------------- port filters


def rules(cluster: Cluster, name: str) -> list[int]:
    namespace = cluster.node(name).namespace
    shown = subprocess.run(["ip", "-n", namespace, "-j", "rule", "show"], capture_output=True,
                           text=True, check=True)  # fmt: skip
    return [int(rule["priority"]) for rule in json.loads(shown.stdout)]


def test_filter_port_drops_connections_silently_but_not_ssh(cluster: Cluster) -> None:
    port = int(master_port(3))
    node2 = cluster.node("node2")
    with serving(cluster, "node2", node2.address, port, seconds=8):
        with filter_port(cluster, "node2", f"{port}-{port + 1}") as rule:
            assert rule.ranges == [(port, port + 1)]
            started = time.monotonic()
            assert send(cluster, "node3", node2.address, port, 10, 2) == "TimeoutError"
            assert time.monotonic() - started >= 2
            assert connect_from_controller(node2.address, port) == "TimeoutError"
            # A closed port in the range answers no RST either: a DROP, not "refused".
            assert connect_from_controller(node2.address, port + 1) == "TimeoutError"
            assert connect_from_controller(node2.address, port + 2) == "ConnectionRefusedError"
            assert ssh(cluster, "node2", "true").returncode == 0
        assert send(cluster, "node3", node2.address, port, 10, 2) == "sent"
    assert rules(cluster, "node2") == [0, 32766, 32767]
    assert link_json(cluster, "node2", rule.device) == []


def test_filter_port_range_between_two_nodes_spares_ssh_and_others(cluster: Cluster) -> None:
    port = int(master_port())
    node1, node2 = cluster.node("node1"), cluster.node("node2")
    with filter_port(cluster, "node1", "1024-65534", peer="node2") as rule:
        assert rule.peer_address == node2.address
        with serving(cluster, "node1", node1.address, port, seconds=6):
            assert send(cluster, "node2", node1.address, port, 10, 2) == "TimeoutError"
            assert send(cluster, "node3", node1.address, port, 10, 2) == "sent"
        # Stateless: node1's own connections to node2 from ports in the range go too.
        with serving(cluster, "node2", node2.address, port, seconds=6):
            assert send(cluster, "node1", node2.address, port, 10, 2) == "TimeoutError"
        assert send(cluster, "node1", node2.address, 22, 0, 2) == "sent"
        assert send(cluster, "node2", node1.address, 22, 0, 2) == "sent"
        assert ssh(cluster, "node1", "true").returncode == 0
    assert rules(cluster, "node1") == [0, 32766, 32767]
    with serving(cluster, "node1", node1.address, port, seconds=6):
        assert send(cluster, "node2", node1.address, port, 10, 2) == "sent"


def test_port_ranges_leave_ssh_out_and_refuse_what_the_kernel_cannot_match() -> None:
    assert port_ranges("1-65534") == [(1, 21), (23, 65534)]
    assert port_ranges((1024, 2048)) == [(1024, 2048)]
    assert port_ranges(29500) == [(29500, 29500)]
    for bad in ("1024-65535", 22, "a-b", "2000-1000", 0):
        with pytest.raises(ValueError):
            port_ranges(bad)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- aliases


def test_alias_inventory_reaches_nodes_by_address_with_host_keys_checked(
    cluster: Cluster, tmp_path: Path
) -> None:
    aliases = alias_names(cluster)
    path = cluster.write_inventory(tmp_path / "aliases.yaml", aliases=aliases)
    hosts = yaml.safe_load(path.read_text())["all"]["hosts"]
    assert hosts["trainer-1"] == {"ansible_host": cluster.node("node1").address}
    assert sorted(hosts) == sorted(aliases.values())
    with pytest.raises(socket.gaierror):
        socket.getaddrinfo("trainer-1", 22)
    inside = cluster.exec("node2", ["getent", "hosts", "trainer-1"])
    assert inside.returncode != 0
    proc = cpuaccel("check", "--json", "-i", str(path), cwd=tmp_path, env=clean_env(), timeout=120)
    report = json.loads(proc.stdout)
    for name, entry in report["hosts"].items():
        assert entry["reachable"] is True, (name, entry["error"])
    assert sorted(report["hosts"]) == sorted(aliases.values())
