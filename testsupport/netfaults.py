"""Network conditions of the test bed: what real clusters' networks do, on the namespace nodes.

Each condition is a context manager on a running :class:`~cpuaccel.testbed.cluster.Cluster`
that sets it up, yields what a test needs to know of it, and takes it all down again on
exit, also when the block raises or the set-up fails half-way. It touches only what the
bed owns: the nodes' namespaces and links named ``cpxl{id}...``.

- :func:`stock_debian`: nodes as a stock Debian/Ubuntu install with Docker leaves them:
  the node's own hostname is ``127.0.1.1`` in its ``/etc/hosts``, and a ``docker0``
  bridge holds ``172.17.0.1/16`` with no container on it (NO-CARRIER, state DOWN).
- :func:`second_network`: a second bridge, each node's ``eth1`` on it (10.78.{id}.{k}/24,
  the controller .254); :func:`interface_bytes` reads an interface's byte counters inside
  a node, to show which network carried a transfer.
- :func:`mtu_black_hole`: nodes' ``eth0`` at MTU 9000 on a path that carries 1500. The
  bridge's ports drop the larger frames with no ICMP: small exchanges pass, bulk stalls.
- :func:`filter_port`: a node's TCP ports dropped as a firewall's DROP does (a connection
  attempt times out, never "refused"), for everyone or one peer node; ssh (22) stays.
- :func:`alias_names`: inventory names that resolve nowhere, for
  ``Cluster.write_inventory(..., aliases=...)`` (hosts reached by ``ansible_host`` only).

Used as::

    with stock_debian(cluster, ["node1", "node2"]), filter_port(cluster, "node3", 29500):
        ...
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cpuaccel.testbed.inventory_file import hosts_text
from cpuaccel.testbed.netns import (
    CONTROLLER_HOST,
    ClusterError,
    Node,
    _alive,
    _netns_inode,
    _pids_in_netns,
    _run,
    second_address,
    second_bridge_name,
    second_veth_name,
)

if TYPE_CHECKING:
    from cpuaccel.testbed.cluster import Cluster

DEBIAN_HOSTNAME_ADDRESS = "127.0.1.1"
"""Where Debian's installer points the machine's own hostname (``127.0.1.1 NAME``)."""
DOCKER_BRIDGE = "docker0"
DOCKER_ADDRESS = "172.17.0.1/16"
"""Docker's default bridge address, the same on every host that runs Docker."""
SECOND_INTERFACE = "eth1"
JUMBO_MTU = 9000
SSH_PORT = 22
MAX_RULE_PORT = 65534
"""The kernel refuses a policy-routing port match that ends at 65535 (its check is
``end < 0xffff``), so ports up to 65534 can be filtered."""
FILTER_SLOTS = range(1, 100)
"""Each filter on a node takes one slot: routing table and rule preferences 1000 + 10 * slot."""
_INTERFACE = re.compile(r"[A-Za-z0-9_.@-]{1,15}")


def _ip(namespace: str | None, lines: Sequence[str], *, force: bool = False) -> None:
    """Run `ip -batch` lines on the host (namespace None) or in a node's namespace.
    `force` goes on past a failed line (for taking things down: all that can go, goes)."""
    argv = ["ip"]
    if namespace is not None:
        argv += ["-n", namespace]
    if force:
        argv.append("-force")
    _run([*argv, "-batch", "-"], input="\n".join(lines) + "\n")


def _apply(
    undo: contextlib.ExitStack,
    namespace: str | None,
    lines: Sequence[str],
    revert: Sequence[str],
    *,
    partial: Sequence[str] = (),
) -> None:
    """Run `lines`, and on the stack `undo` the `revert` lines that take them back. If
    `lines` fail, what they did is taken back at once (`partial`, then `revert`, each
    line that can) and the error raised."""
    try:
        _ip(namespace, lines)
    except ClusterError:
        with contextlib.suppress(ClusterError):
            _ip(namespace, [*partial, *revert], force=True)
        raise
    undo.callback(_ip, namespace, revert)


def _link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def _running(cluster: Cluster, names: Sequence[str]) -> list[Node]:
    """The named nodes, each with its sshd running (the namespaces a condition changes)."""
    nodes = [cluster.node(name) for name in names]
    for node in nodes:
        if node.pid is None or not _alive(node.pid):
            raise ClusterError(
                f"{node.name}'s sshd is not running: start it (cluster.start_sshd) first"
            )
    return nodes


# --------------------------------------------------------------------------- stock Debian


def stock_hosts_text(cluster: Cluster, node: Node) -> str:
    """`node`'s /etc/hosts as Debian's installer leaves it, plus the other nodes: its own
    name at 127.0.1.1 (and nowhere else), everyone else's at their real address."""
    others = [other for other in cluster.nodes if other.name != node.name]
    first, rest = hosts_text(cluster.controller_address, others).split("\n", 1)
    return f"{first}\n{DEBIAN_HOSTNAME_ADDRESS} {node.name}\n{rest}"


def _docker_bridge_lines(cluster_id: int, index: int) -> list[str]:
    port = f"cpxl{cluster_id}dk"
    return [
        # Docker's bridges have 02:42:... addresses; this one names the cluster and node.
        f"link add {DOCKER_BRIDGE} address 02:42:0a:4d:{cluster_id:02x}:{index:02x} type bridge",
        f"addr add {DOCKER_ADDRESS} dev {DOCKER_BRIDGE}",
        f"link set {DOCKER_BRIDGE} up",
        # A bridge that never had a port says UNKNOWN with carrier; one whose last port
        # left says NO-CARRIER, state DOWN, as docker0 with no container running does
        # (it keeps its address and its route, marked linkdown).
        f"link add {port} type veth peer name {port}p",
        f"link set {port} master {DOCKER_BRIDGE}",
        f"link del {port}",
    ]


def _mount_namespaces(node: Node) -> dict[int, int]:
    """One process of each mount namespace the node's processes are in (its sshd's,
    and an older one's where sshd was restarted while sessions of the earlier one, such
    as a kept ssh master, live on), by the namespace's inode; never this machine's own."""
    own = os.stat("/proc/self/ns/mnt").st_ino
    inode = _netns_inode(node.namespace)
    found: dict[int, int] = {}
    pids = sorted(_pids_in_netns(inode)) if inode is not None else []
    if node.pid is not None:
        pids.insert(0, node.pid)  # the sshd's own namespace first
    for pid in pids:
        try:
            mnt = os.stat(f"/proc/{pid}/ns/mnt").st_ino
        except OSError:
            continue
        if mnt != own:
            found.setdefault(mnt, pid)
    return found


def _unmount_hosts(pid: int, mnt: int) -> None:
    # Only in the mount namespace this mounted in, while a process still holds it.
    try:
        if os.stat(f"/proc/{pid}/ns/mnt").st_ino != mnt:
            return
    except OSError:
        return
    _run(["nsenter", f"--target={pid}", "--mount", "umount", "/etc/hosts"])


@contextlib.contextmanager
def stock_debian(cluster: Cluster, names: Sequence[str]) -> Iterator[list[Node]]:
    """The named nodes look like a stock Debian/Ubuntu install with Docker; yields them.

    Each gets its own /etc/hosts (:func:`stock_hosts_text`), bind-mounted over the shared
    one in every mount namespace its processes are in (its sshd's, and a kept ssh
    master's of an earlier sshd), so every ssh session and ``cluster.exec`` sees it (a
    node's slurmd has a mount namespace of its own and does not); and a ``docker0``
    bridge at 172.17.0.1/16, NO-CARRIER. On exit the mounts and bridges are gone. A node
    whose sshd is restarted within the block gets the shared hosts file back.
    """
    nodes = _running(cluster, names)
    with contextlib.ExitStack() as undo:
        for node in nodes:
            path = cluster.state_dir / f"hosts-{node.name}"
            path.write_text(stock_hosts_text(cluster, node))
            undo.callback(path.unlink, missing_ok=True)
            for mnt, pid in _mount_namespaces(node).items():
                _run(["nsenter", f"--target={pid}", "--mount", "mount", "--bind", str(path),
                      "/etc/hosts"])  # fmt: skip
                undo.callback(_unmount_hosts, pid, mnt)
            _apply(
                undo,
                node.namespace,
                _docker_bridge_lines(cluster.cluster_id, node.index),
                [f"link del {DOCKER_BRIDGE}"],
                partial=[f"link del cpxl{cluster.cluster_id}dk"],
            )
        yield nodes


# --------------------------------------------------------------------------- second network


@dataclass(frozen=True)
class SecondNetwork:
    """The second network: its bridge, the nodes' interface on it and the addresses."""

    bridge: str
    interface: str
    controller_address: str
    addresses: dict[str, str]
    """Node name -> its address on this network."""


@dataclass(frozen=True)
class InterfaceBytes:
    rx: int
    tx: int


def _delete_links(names: Sequence[str]) -> None:
    present = [name for name in names if _link_exists(name)]
    if present:
        _ip(None, [f"link del {name}" for name in present], force=True)


@contextlib.contextmanager
def second_network(cluster: Cluster) -> Iterator[SecondNetwork]:
    """A second bridge ``cpxl{id}br2`` with the controller at 10.78.{id}.254/24 and each
    node's ``eth1`` at 10.78.{id}.{k}/24 (host end ``cpxl{id}w{k}``), as a cluster with a
    separate fast network has; no name resolves to these addresses. On exit the bridge
    and links are gone (``down`` also removes them if a process died holding them)."""
    cluster_id = cluster.cluster_id
    bridge = second_bridge_name(cluster_id)
    veths = [second_veth_name(cluster_id, node.index) for node in cluster.nodes]
    if _link_exists(bridge):
        raise ClusterError(f"{bridge} exists already: one second network per cluster")
    controller = second_address(cluster_id, CONTROLLER_HOST)
    lines = [
        f"link add {bridge} type bridge",
        f"addr add {controller}/24 dev {bridge}",
        f"link set {bridge} up",
    ]
    for node, veth in zip(cluster.nodes, veths, strict=True):
        lines += [
            f"link add {veth} type veth peer name {SECOND_INTERFACE} netns {node.namespace}",
            f"link set {veth} master {bridge} up",
        ]
    with contextlib.ExitStack() as undo:
        # Deleting a host end deletes the node's eth1 with it.
        undo.callback(_delete_links, [*veths, bridge])
        _ip(None, lines)
        addresses = {}
        for node in cluster.nodes:
            address = second_address(cluster_id, node.index)
            inside = [
                f"addr add {address}/24 dev {SECOND_INTERFACE}",
                f"link set {SECOND_INTERFACE} up",
            ]
            _ip(node.namespace, inside)
            addresses[node.name] = address
        yield SecondNetwork(bridge, SECOND_INTERFACE, controller, addresses)


def interface_bytes(cluster: Cluster, name: str, interface: str) -> InterfaceBytes:
    """The bytes received and sent so far by `interface` inside node `name` (its
    /sys/class/net/IF/statistics, which inside a node are that node's own)."""
    if not _INTERFACE.fullmatch(interface):
        raise ValueError(f"not an interface name: {interface!r} (e.g. eth0)")
    stats = f"/sys/class/net/{interface}/statistics"
    result = cluster.exec(name, ["cat", f"{stats}/rx_bytes", f"{stats}/tx_bytes"], timeout=30)
    words = result.stdout.split()
    if result.returncode != 0 or len(words) != 2 or not all(w.isdigit() for w in words):
        detail = (result.stderr or result.stdout).strip()[:200]
        raise ClusterError(f"{name}: cannot read {stats}: {detail or 'no counters'}")
    return InterfaceBytes(rx=int(words[0]), tx=int(words[1]))


# --------------------------------------------------------------------------- MTU black hole


def _eth0_settings(namespace: str) -> tuple[int, int]:
    """(mtu, gso_max_segs) of eth0 in the namespace."""
    shown = _run(["ip", "-n", namespace, "-d", "-j", "link", "show", "dev", "eth0"])
    try:
        link = json.loads(shown.stdout)[0]
        return int(link["mtu"]), int(link["gso_max_segs"])
    except (ValueError, LookupError, TypeError) as exc:
        raise ClusterError(f"{namespace}: cannot read eth0's mtu: {exc}") from None


@contextlib.contextmanager
def mtu_black_hole(
    cluster: Cluster, names: Sequence[str], mtu: int = JUMBO_MTU
) -> Iterator[list[Node]]:
    """The named nodes' ``eth0`` at `mtu` while their path (host-side veths, the bridge)
    stays at 1500; yields the nodes.

    Between two such nodes TCP agrees on a segment size that fits `mtu`: a small exchange
    passes, a bulk transfer stalls, as on a cluster whose switch was never set for jumbo
    frames: the veth drops each larger frame silently (no ICMP "fragmentation needed").
    The controller (1500) still talks to them, TCP's MSS keeping its segments small.
    The nodes also send one segment per packet (``gso_max_segs 1``): veths and bridges
    pass a GSO packet whatever its size, which would let jumbo bursts through whole.
    On exit each node's eth0 has its MTU and GSO setting back.
    """
    if not 1500 < mtu <= 65535:
        raise ValueError(f"mtu must be above 1500 (the path's) and at most 65535, got {mtu}")
    nodes = _running(cluster, names)
    with contextlib.ExitStack() as undo:
        for node in nodes:
            old_mtu, old_segs = _eth0_settings(node.namespace)
            _apply(
                undo,
                node.namespace,
                [f"link set eth0 mtu {mtu} gso_max_segs 1"],
                [f"link set eth0 mtu {old_mtu} gso_max_segs {old_segs}"],
            )
        yield nodes


# --------------------------------------------------------------------------- port filters


def port_ranges(ports: int | str | tuple[int, int]) -> list[tuple[int, int]]:
    """The (first, last) ranges a filter of `ports` (``29500``, ``"1024-65534"``, ``(a, b)``)
    matches: ssh's port 22 left out so that the node stays reachable."""
    if isinstance(ports, tuple):
        first, last = ports
    elif isinstance(ports, int):
        first = last = ports
    else:
        match = re.fullmatch(r"\s*(\d{1,5})\s*(?:-\s*(\d{1,5})\s*)?", ports)
        if match is None:
            raise ValueError(f"not a port or port range: {ports!r} (e.g. 29500 or 1024-65534)")
        first = int(match.group(1))
        last = int(match.group(2) or first)
    if not 1 <= first <= last <= MAX_RULE_PORT:
        raise ValueError(
            f"ports must be 1 <= first <= last <= {MAX_RULE_PORT} (the kernel's rules end "
            f"there), got {first}-{last}"
        )
    ranges = [
        (a, b)
        for a, b in ((first, min(last, SSH_PORT - 1)), (max(first, SSH_PORT + 1), last))
        if a <= b
    ]
    if not ranges:
        raise ValueError("port 22 alone: the bed's ssh would go too; filter other ports")
    return ranges


@dataclass(frozen=True)
class PortFilter:
    """A filter in place: the node, the port ranges dropped, the peer it applies to
    (None: everyone), and the node's routing table and silent device behind it."""

    name: str
    ranges: list[tuple[int, int]]
    peer_address: str | None
    table: int
    device: str


def _free_slot(namespace: str) -> int:
    shown = _run(["ip", "-n", namespace, "-j", "rule", "show"])
    try:
        used = {
            int(rule.get("table", 0))
            for rule in json.loads(shown.stdout)
            if str(rule.get("table", "")).isdigit()
        }
    except (ValueError, TypeError, AttributeError) as exc:
        raise ClusterError(f"{namespace}: cannot read its routing rules: {exc}") from None
    for slot in FILTER_SLOTS:
        if 1000 + slot not in used:
            return slot
    raise ClusterError(
        f"{namespace}: {len(FILTER_SLOTS)} port filters at once, the most there can be"
    )


@contextlib.contextmanager
def filter_port(
    cluster: Cluster,
    name: str,
    ports: int | str | tuple[int, int],
    *,
    peer: str | None = None,
) -> Iterator[PortFilter]:
    """Node `name`'s TCP `ports` (:func:`port_ranges`) silently dropped, for everyone or
    only for node `peer`; yields the :class:`PortFilter`.

    A connection to such a port times out (its SYN is never answered), never "refused".
    ssh to and from the node (port 22) goes on working. With no iptables/nft at hand, this
    is policy routing in the node: a rule sends its TCP packets *from* those ports
    (``to`` the peer, if one is given) to a table whose default route goes out through a
    veth whose other end is down, which drops them without a word; a rule before it
    keeps connections to port 22 on the main table. Like any stateless filter it also
    drops the node's own outgoing connections whose local port is in the ranges (with a
    wide range and a peer: the node's connections to that peer, but ssh); they too time
    out. Traffic within the node (loopback, its own address) is never touched.
    """
    node = _running(cluster, [name])[0]
    ranges = port_ranges(ports)
    peer_address = cluster.node(peer).address if peer is not None else None
    if peer is not None and peer == name:
        raise ValueError(f"peer {peer!r} is the filtered node itself: name another node")
    to = f" to {peer_address}" if peer_address else ""
    slot = _free_slot(node.namespace)
    table = 1000 + slot
    base = 1000 + 10 * slot
    device = f"cpxl{cluster.cluster_id}x{slot}"
    prefs = [base + i for i in range(len(ranges) + 1)]
    lines = [
        f"link add {device} type veth peer name cpxl{cluster.cluster_id}y{slot}",
        f"link set {device} arp off up",
        f"route add default dev {device} table {table}",
        f"rule add pref {prefs[0]} ipproto tcp dport {SSH_PORT}{to} lookup main",
    ]
    for pref, (first, last) in zip(prefs[1:], ranges, strict=True):
        sport = str(first) if first == last else f"{first}-{last}"
        lines.append(f"rule add pref {pref} ipproto tcp sport {sport}{to} lookup {table}")
    revert = [f"rule del pref {pref}" for pref in prefs] + [f"link del {device}"]
    with contextlib.ExitStack() as undo:
        _apply(undo, node.namespace, lines, revert)
        yield PortFilter(name, ranges, peer_address, table, device)


# --------------------------------------------------------------------------- aliases


def alias_names(cluster: Cluster, prefix: str = "trainer-") -> dict[str, str]:
    """Node name -> an inventory name no hosts file or DNS knows (``trainer-1``...), for
    ``cluster.write_inventory(path, aliases=alias_names(cluster))``: hosts reached by
    their ``ansible_host`` address alone, as many inventories name them."""
    if not re.fullmatch(r"[a-z][a-z0-9-]*", prefix):
        raise ValueError(f"alias prefix must be lowercase letters, digits and '-': {prefix!r}")
    return {node.name: f"{prefix}{node.index}" for node in cluster.nodes}
