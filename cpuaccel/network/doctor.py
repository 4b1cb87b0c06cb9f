"""The network doctor: before a job waits on the network, try the connections it will
make, and name each fault's cause (a firewall that drops or rejects a port, no route, an
MTU black hole) in seconds.

Two phases, one ``netprobe`` program per node (cpuaccel.node.netprobe) kept open between
them: first every node listens (the head on the job's master port, as its rendezvous
will, and every node on a port the kernel picks, as gloo's and MPI's are) and says its
ports; then every node connects to its targets at once and says what each connection
met. A node's program ends at EOF, when the controller is done, or by itself after
``BOUND`` seconds.

The connections tried: every node to the head's master port, and every node to peers on
their picked ports: the next node in a ring by default (``RING``), every ordered pair
with ``ALL`` (``cpuaccel check --network``), or the pairs given.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from cpuaccel.connectors import programs
from cpuaccel.connectors.base import Connector
from cpuaccel.connectors.connect_options import ConnectOptions
from cpuaccel.errors import CpuaccelError, HostError
from cpuaccel.executor import ConnectionPool, Status, fan_out, run_on_hosts
from cpuaccel.facts.problems import ERROR, WARNING, Problem
from cpuaccel.inventory.host import Host
from cpuaccel.network.choice import JobNetwork
from cpuaccel.node import netprobe
from cpuaccel.node.netprobe import (
    FILTERED,
    FOREIGN,
    MTU,
    NO_ROUTE,
    OK,
    REFUSED,
    SILENT,
    STATUSES,
)

RING = "ring"  # each node to the next one (the default sample)
ALL = "all"  # every ordered pair of nodes
MASTER = "master"  # a connection to the head's master port
PEER = "peer"  # a connection to a peer's port the kernel picked
WRONG_NODE = "wrong node"  # another node's probe answered at the target's address

BOUND = 60  # seconds a node's probe lives at most, should the controller vanish
START_TIMEOUT = 20.0  # seconds for a node's probe to start and say its ports


@dataclass(frozen=True)
class Limits:
    """How long each step of one connection may take, and the large transfer's size."""

    connect: float = 1.5  # a SYN lost once is sent again after 1 s
    exchange: float = 1.0  # the small message and its answer
    transfer: float = 2.0  # the large transfer's echo, whole
    size: int = 256 << 10

    @property
    def longest(self) -> float:
        """The longest a node's connections may take, all tried at once."""
        return self.connect + self.exchange + self.transfer


@dataclass(frozen=True)
class End:
    """One end of a connection: the interface its address is on, and that one's MTU."""

    iface: str | None
    mtu: int | None


@dataclass(frozen=True)
class Connection:
    """One connection tried: from ``source`` to ``target``'s ``address``:``port``, what
    it met (``status``: one of cpuaccel.node.netprobe.STATUSES, or WRONG_NODE: another
    node's probe answered, named in ``detail``) and each end's interface."""

    source: str
    target: str
    address: str
    port: int
    purpose: str  # MASTER or PEER
    status: str
    detail: str = ""
    seconds: float = 0.0
    source_end: End | None = None
    target_end: End | None = None

    @property
    def ok(self) -> bool:
        return self.status == OK

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Diagnosis:
    """What the doctor found: every connection tried, the problems they make (one per
    cause and target), the nodes it could not reach (the caller's own check names
    those), and the seconds it took."""

    connections: list[Connection] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    unreached: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "connections": [c.to_json() for c in self.connections],
            "problems": [p.to_json() for p in self.problems],
            "unreached": list(self.unreached),
            "seconds": round(self.seconds, 3),
        }


# ---------------------------------------------------------------- what to try


def plan(
    names: Sequence[str], head: str, pairs: Sequence[tuple[str, str]] | str | None = RING
) -> list[tuple[str, str, str]]:
    """The connections to try, as (source, target, purpose): every node to the head's
    master port, then the peer pairs: ``RING`` (or None), ``ALL`` or the pairs given."""
    if head not in names:
        raise ValueError(f"the head {head!r} is not one of the nodes")
    wanted = [(name, head, MASTER) for name in names]
    if pairs is None or pairs == RING:
        peers = [(a, names[(i + 1) % len(names)]) for i, a in enumerate(names)]
    elif pairs == ALL:
        peers = [(a, b) for a in names for b in names]
    elif isinstance(pairs, str):
        raise ValueError(f"pairs must be {RING!r}, {ALL!r} or (source, target) pairs")
    else:
        peers = list(pairs)
        unknown = sorted({n for pair in peers for n in pair if n not in names})
        if unknown:
            raise ValueError(f"pairs name nodes that are not probed: {', '.join(unknown)}")
    seen = set()
    for a, b in peers:
        if a != b and (a, b) not in seen:
            seen.add((a, b))
            wanted.append((a, b, PEER))
    return wanted


# ---------------------------------------------------------------- a node's answers


def _text(value: Any, limit: int) -> str:
    return value[:limit] if isinstance(value, str) else ""


def _end(value: Any) -> End | None:
    """An end as a node described it; what does not fit is left unknown."""
    if not isinstance(value, dict):
        return None
    iface = value.get("iface")
    mtu = value.get("mtu")
    iface_ok = isinstance(iface, str) and 0 < len(iface) <= 64 and iface.isprintable()
    mtu_ok = isinstance(mtu, int) and not isinstance(mtu, bool) and 68 <= mtu <= 1 << 20
    return End(iface if iface_ok and iface != "-" else None, mtu if mtu_ok else None)


def connection_of(
    source: str, target: str, address: str, port: int, purpose: str, raw: Any
) -> Connection:
    """A node's result for one connection, checked: a result that is not one is an
    ``error`` that says so."""
    if not isinstance(raw, dict) or raw.get("status") not in STATUSES:
        detail = "the node's result was not understood"
        return Connection(source, target, address, port, purpose, netprobe.ERROR, detail)
    seconds = raw.get("seconds")
    return Connection(
        source,
        target,
        address,
        port,
        purpose,
        str(raw["status"]),
        _text(raw.get("detail"), 300),
        float(seconds) if isinstance(seconds, (int, float)) and 0 <= seconds < 1e6 else 0.0,
        _end(raw.get("local")),
        _end(raw.get("remote")),
    )


def _listening(host: str, answer: dict[str, Any], asked: int) -> list[tuple[int | None, str]]:
    """The node's first answer: (port or None, why not) for each port asked."""
    ports, errors = answer.get("listening"), answer.get("errors")
    if not (isinstance(ports, list) and isinstance(errors, list)) or not (
        len(ports) == len(errors) == asked
    ):
        raise HostError(host, "the network probe's answer was not understood")
    found: list[tuple[int | None, str]] = []
    for port, error in zip(ports, errors, strict=True):
        if isinstance(port, int) and not isinstance(port, bool) and 0 < port < 65536:
            found.append((port, ""))
        else:
            found.append((None, _text(error, 200) or "no port"))
    return found


# ---------------------------------------------------------------- the probe


@dataclass
class _Node:
    kept: programs.Kept
    token: str  # the word its probe answers with: which node answered
    peer_port: int | None
    master_port: int | None = None


def checked_answerer(c: Connection, raw: Any, tokens: Mapping[str, str]) -> Connection:
    """``c``, or WRONG_NODE when a probe other than the target's answered (``tokens``:
    each node's probe's word, by name): the address is on another node too (docker0's
    172.17.0.1 is on every host that runs Docker)."""
    remote = raw.get("remote") if isinstance(raw, dict) else None
    token = remote.get("token") if isinstance(remote, dict) else None
    if not c.ok or not isinstance(token, str) or token == tokens.get(c.target):
        return c
    other = next((name for name, word in tokens.items() if word == token), None)
    detail = f"{other or 'a probe of another run'} answered"
    return replace(c, status=WRONG_NODE, detail=detail)


def diagnose(
    hosts: Sequence[Host],
    addresses: Mapping[str, str],
    *,
    master_port: int,
    pairs: Sequence[tuple[str, str]] | str | None = RING,
    connect: ConnectOptions,
    forks: int,
    pool: ConnectionPool | None = None,
    limits: Limits = Limits(),
) -> Diagnosis:
    """Try the job's connections between ``hosts`` (``plan``), the head first:
    ``addresses`` gives each node's training address (where its peers connect to it);
    every node connects to the head's ``master_port``. Connections come from ``pool``
    (which stays open) or from a pool of its own."""
    started = time.monotonic()
    names = [h.name for h in hosts]
    head = names[0] if names else ""  # none: plan() says so
    missing = [n for n in names if not addresses.get(n)]
    if missing:
        raise ValueError(f"no training address for {', '.join(missing)}")
    wanted = plan(names, head, pairs)
    own_pool = pool is None
    pool = pool or ConnectionPool(connect)
    found = Diagnosis()
    nodes: dict[str, _Node] = {}
    try:
        _listen(hosts, head, master_port, forks, pool, nodes, found)
        _connect(wanted, addresses, head, nodes, forks, limits, found)
    finally:
        _end_all(list(nodes.values()))
        if own_pool:
            pool.close()
    found.problems += problems_of(found.connections)
    found.seconds = time.monotonic() - started
    return found


def diagnose_job(
    hosts: Sequence[Host],
    network: JobNetwork,
    *,
    master_port: int,
    pairs: Sequence[tuple[str, str]] | str | None = RING,
    connect: ConnectOptions,
    forks: int,
    pool: ConnectionPool | None = None,
) -> Diagnosis:
    """:func:`diagnose` over the addresses a job's network chose (cpuaccel.network.
    choice), the head the first of ``hosts``: what ``check`` and run's preflight try."""
    return diagnose(
        hosts,
        {name: node.address for name, node in network.nodes.items()},
        master_port=master_port,
        pairs=pairs,
        connect=connect,
        forks=forks,
        pool=pool,
    )


def _listen(
    hosts: Sequence[Host],
    head: str,
    master_port: int,
    forks: int,
    pool: ConnectionPool,
    nodes: dict[str, _Node],
    found: Diagnosis,
) -> None:
    """Phase one: every node's probe started, listening; ``nodes`` holds those that are."""

    def start(conn: Connector) -> _Node:
        name = conn.host.name
        ports = [master_port, 0] if name == head else [0]
        token = os.urandom(8).hex()
        words = [f"{netprobe.BOUND}{BOUND}", f"{netprobe.TOKEN}{token}", *map(str, ports)]
        answer, kept = programs.start(
            conn, "netprobe", words, what="the network probe", timeout=START_TIMEOUT
        )
        node = _Node(kept, token, None)
        nodes[name] = node  # closed at the end whatever its answer
        listening = _listening(name, answer, len(ports))
        node.peer_port = listening[-1][0]
        if listening[-1][0] is None:
            found.problems.append(
                Problem(WARNING, name, f"the network probe could not listen: {listening[-1][1]}")
            )
        if name == head:
            node.master_port, why = listening[0]
            if node.master_port is None:
                found.problems.append(
                    Problem(
                        WARNING,
                        name,
                        f"the network probe could not listen on the master port "
                        f"{master_port} ({why}): no node's way to it was tested",
                        "free the port on the head, or choose another master port",
                    )
                )
        return node

    for result in run_on_hosts(hosts, start, forks=forks, pool=pool):
        if result.status is Status.UNREACHABLE:
            found.unreached.append(result.host.name)
        elif result.status is not Status.OK:
            message = f"the network probe could not run: {result.error}"
            found.problems.append(Problem(ERROR, result.host.name, message, result.hint))


def _connect(
    wanted: list[tuple[str, str, str]],
    addresses: Mapping[str, str],
    head: str,
    nodes: dict[str, _Node],
    forks: int,
    limits: Limits,
    found: Diagnosis,
) -> None:
    """Phase two: every listening node tries its connections, all nodes at once."""
    by_source: dict[str, list[tuple[str, str, int]]] = {}
    for source, target, purpose in wanted:
        node = nodes.get(target)
        port = None if node is None else node.master_port if purpose == MASTER else node.peer_port
        if source in nodes and port is not None:
            by_source.setdefault(source, []).append((target, purpose, port))
    tokens = {name: node.token for name, node in nodes.items()}
    request = {"connect": limits.connect, "exchange": limits.exchange}
    request |= {"transfer": limits.transfer, "size": limits.size}

    def tries(source: str) -> list[Connection]:
        targets = by_source[source]
        payload = {**request, "targets": [[addresses[t], port] for t, _, port in targets]}
        try:
            answer = nodes[source].kept.request(
                ["connect"],
                json.dumps(payload).encode(),
                what="the network probe's connections",
                timeout=limits.longest + START_TIMEOUT,
            )
        except CpuaccelError as exc:
            answer = {"results": [{"status": netprobe.ERROR, "detail": exc.message}] * len(targets)}
        results = answer.get("results")
        if not isinstance(results, list) or len(results) != len(targets):
            results = [None] * len(targets)
        return [
            checked_answerer(
                connection_of(source, target, addresses[target], port, purpose, raw), raw, tokens
            )
            for (target, purpose, port), raw in zip(targets, results, strict=True)
        ]

    for connections in fan_out(list(by_source), tries, forks=max(1, forks)):
        found.connections += connections


def _end_all(nodes: list[_Node]) -> None:
    """Every probe told to end (EOF), then waited for a moment, so that the master port
    is free for the job when this returns; then their channels closed."""
    for node in nodes:
        with contextlib.suppress(CpuaccelError, OSError, ValueError):
            node.kept.end_input()
    deadline = time.monotonic() + 2.0
    for node in nodes:
        node.kept.wait(deadline)
        node.kept.close()


# ---------------------------------------------------------------- what they mean


def _where(connection: Connection) -> str:
    c = connection
    if c.purpose == MASTER:
        return f"{c.target}'s master port {c.port} ({c.address})"
    return f"{c.target}'s port {c.port} ({c.address}; one the kernel picked, as gloo's are)"


def _ports(connection: Connection) -> str:
    if connection.purpose == MASTER:
        return f"TCP port {connection.port}"
    return "TCP on every port (gloo and MPI connect on ports the kernel picks)"


def _ends(c: Connection) -> str:
    """Each end's interface and MTU, as an MTU problem says them."""
    ends = []
    for name, end in ((c.source, c.source_end), (c.target, c.target_end)):
        iface = end.iface if end and end.iface else "?"
        mtu = end.mtu if end and end.mtu else "?"
        ends.append(f"{name} {iface} mtu {mtu}")
    return ", ".join(ends)


def _black_hole(group: Sequence[Connection]) -> Problem:
    """One problem for the large transfers that stalled between two nodes, either way
    and on any port: the path is what drops them."""
    c = group[0]
    both = any(g.source == c.target for g in group)
    host = f"{c.source} <-> {c.target}" if both else f"{c.source} -> {c.target}"
    way = f"between {c.source} and {c.target}" if both else f"from {c.source} to {c.target}"
    iface = (c.source_end.iface if c.source_end else None) or "IFACE"
    return Problem(
        ERROR,
        host,
        f"a large transfer {way} stalls while small ones pass: an MTU black hole ({_ends(c)})",
        f"set the same MTU as the switch path on every node (ip link set {iface} mtu 1500), "
        "or enable jumbo frames on the switch",
    )


def _problem(group: Sequence[Connection]) -> Problem:
    """One problem for connections from ``group``'s sources to one target's port that
    met the same cause."""
    c = group[0]
    if c.status == MTU:
        return _black_hole(group)
    sources = ", ".join(g.source for g in group)
    host = f"{sources} -> {c.target}"
    where = _where(c)
    if c.status == FILTERED:
        return Problem(
            ERROR,
            host,
            f"{where}: filtered (the connection timed out: a firewall drops it)",
            f"open {_ports(c)} on {c.target} to the other nodes (a firewall's DROP rule or "
            "a security group)",
        )
    if c.status == REFUSED:
        return Problem(
            ERROR,
            host,
            f"{where}: refused (reset while the probe listened there: a firewall rejects "
            f"it, or {c.address} is not {c.target}'s address)",
            f"allow {_ports(c)} on {c.target} from the other nodes (a firewall's REJECT "
            f"rule), and check that {c.address} is {c.target}'s",
        )
    if c.status == NO_ROUTE:
        return Problem(
            ERROR,
            host,
            f"{where}: no route ({c.detail})",
            f"check {sources}'s routes to {c.address} (ip route get {c.address}), or train "
            "on a network every node reaches",
        )
    if c.status == SILENT:
        return Problem(
            ERROR,
            host,
            f"{where}: connected, but a small message got no answer",
            "check what sits between the nodes (a stateful filter, a proxy) and what "
            f"listens on {c.address}:{c.port}",
        )
    if c.status == WRONG_NODE:
        return Problem(
            ERROR,
            host,
            f"{where}: {c.detail}, not {c.target}: the address is on more than one node",
            f"train on an address that is {c.target}'s alone (cpuaccel_network), not one "
            "every host has, such as docker0's 172.17.0.1",
        )
    if c.status == FOREIGN:
        return Problem(
            ERROR,
            host,
            f"{where}: another program answered, not cpuaccel's probe",
            f"check that {c.address} is {c.target}'s address (docker0's 172.17.0.1, for "
            "one, is on many hosts)",
        )
    return Problem(
        ERROR,
        host,
        f"{where}: {c.detail or c.status}",
        "check the network between the nodes",
    )


def problems_of(connections: Sequence[Connection]) -> list[Problem]:
    """One problem per cause and target port, naming every source that met it; one per
    pair of nodes for an MTU black hole; in the order the connections came."""
    groups: dict[tuple[str, ...], list[Connection]] = {}
    for c in connections:
        if c.ok:
            continue
        if c.status == MTU:
            key: tuple[str, ...] = (MTU, *sorted((c.source, c.target)))
        else:
            key = (c.status, c.target, str(c.port), c.purpose)
        groups.setdefault(key, []).append(c)
    return [_problem(group) for group in groups.values()]
