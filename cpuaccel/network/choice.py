"""Which address and interface each node's ranks talk over, chosen from the nodes' facts.

gloo picks its address by resolving the node's own name, and a stock Debian or Ubuntu
``/etc/hosts`` maps that name to 127.0.1.1: every rank then advertises an address its
peers cannot reach. Docker's ``docker0`` (172.17.0.1) and libvirt's ``virbr0`` put the
same address on every node. So cpuaccel does not let each library guess: from the
interfaces and routes each node's fact probe reports (``cpuaccel.node.netif``), it
chooses the head's address (``MASTER_ADDR``) and, for every node, the address and
interface that reach it, and hands them to every library that picks an interface
(``CPUACCEL_NODE_IFACES``, which the rank's worker turns into ``GLOO_SOCKET_IFNAME`` and
the like; the launchers' own options).

- A network the user names (``cpuaccel_network``: a CIDR or an interface name, per host,
  group or run; ``--network`` for every node) is used as named.
- Otherwise the head's address is the one the controller reached it at over ssh (when
  the head holds it), else the address of its default route's interface; each other
  node's is on the interface of its route to that address (the main routing table's
  longest match, as ``ip route get`` answers without policy rules).
- Never a loopback address, and never an address that several nodes hold.

What was chosen, and anything worth a word (a name resolving to loopback, an address
shared by several nodes), comes back as ``Problem`` s, which ``check`` and run's
preflight print.
"""

from __future__ import annotations

import ipaddress
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from cpuaccel.facts.gather import Facts
from cpuaccel.facts.problems import ERROR, NOTE, Problem
from cpuaccel.inventory.host import Host
from cpuaccel.inventory.variables import INTERFACE_NAME, BadValue, network

IPv4 = ipaddress.IPv4Address
LOOPBACK = ipaddress.IPv4Network("127.0.0.0/8")
LINK_LOCAL = ipaddress.IPv4Network("169.254.0.0/16")
NETWORK_VAR = "cpuaccel_network"
MAX_ENTRIES = 4096  # interfaces, addresses or routes a node may report
FIX_NETWORK = (
    "name the network the nodes share with cpuaccel_network (a CIDR such as 192.0.2.0/24, "
    "or an interface name) or run --network"
)


# ---------------------------------------------------------------- what a node reports


@dataclass(frozen=True)
class Interface:
    name: str
    addresses: tuple[ipaddress.IPv4Interface, ...]
    mtu: int | None
    up: bool
    loopback: bool
    speed: int | None  # Mbit/s, where the kernel knows it


@dataclass(frozen=True)
class Route:
    interface: str | None  # None: a route that rejects (unreachable, prohibit, blackhole)
    network: ipaddress.IPv4Network
    gateway: IPv4 | None
    metric: int


@dataclass(frozen=True)
class NodeNetwork:
    """A node's network as its fact probe reported it, checked (``of_facts``)."""

    interfaces: tuple[Interface, ...]
    routes: tuple[Route, ...]
    ssh_address: IPv4 | None  # the address the controller's ssh session came in on
    own_name: str
    own_name_addresses: tuple[str, ...]  # what the node's own name resolves to there

    def holding(self, address: IPv4) -> Interface | None:
        return next((i for i in self.interfaces if any(a.ip == address for a in i.addresses)), None)

    def interface(self, name: str) -> Interface | None:
        return next((i for i in self.interfaces if i.name == name), None)

    def usable(self) -> list[tuple[Interface, ipaddress.IPv4Interface]]:
        """Every address a peer could reach: up, not loopback or link-local."""
        return [
            (i, a)
            for i in self.interfaces
            if i.up and not i.loopback
            for a in i.addresses
            if a.ip not in LOOPBACK and a.ip not in LINK_LOCAL
        ]

    def route_to(self, target: IPv4) -> Route | None:
        """The main table's route to ``target``: the longest prefix, then the lowest
        metric."""
        matching = [r for r in self.routes if target in r.network]
        if not matching:
            return None
        return max(matching, key=lambda r: (r.network.prefixlen, -r.metric))


def _list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list) or len(value) > MAX_ENTRIES:
        raise ValueError(f"{what} is not a list of at most {MAX_ENTRIES}")
    return value


def _interface(raw: Any) -> Interface:
    if not isinstance(raw, dict):
        raise ValueError("an interface is not an object")
    name = raw.get("name")
    if not isinstance(name, str) or not INTERFACE_NAME.fullmatch(name):
        raise ValueError(f"interface name {name!r}")
    addresses = []
    for pair in _list(raw.get("addresses"), "addresses"):
        if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[1], int)):
            raise ValueError(f"address {pair!r}")
        addresses.append(ipaddress.IPv4Interface(f"{pair[0]}/{pair[1]}"))
    mtu, speed = raw.get("mtu"), raw.get("speed")
    for number in (mtu, speed):
        if number is not None and (not isinstance(number, int) or isinstance(number, bool)):
            raise ValueError(f"mtu or speed {number!r}")
    return Interface(
        name, tuple(addresses), mtu, raw.get("up") is True, raw.get("loopback") is True, speed
    )


def _route(raw: Any) -> Route:
    if not isinstance(raw, dict):
        raise ValueError("a route is not an object")
    name, metric = raw.get("interface"), raw.get("metric")
    if name is not None and (not isinstance(name, str) or not INTERFACE_NAME.fullmatch(name)):
        raise ValueError(f"route interface {name!r}")
    if not isinstance(metric, int) or isinstance(metric, bool):
        raise ValueError(f"route metric {metric!r}")
    gateway = raw.get("gateway")
    return Route(
        name,
        ipaddress.IPv4Network(f"{raw.get('destination')}/{raw.get('prefix')}"),
        IPv4(gateway) if gateway is not None else None,
        metric,
    )


def of_facts(host: str, facts: Facts) -> NodeNetwork | Problem:
    """A node's network from its facts, or the problem with them (a node's answer is
    checked here, where it enters)."""
    raw = facts.get("network")
    try:
        if not isinstance(raw, dict):
            raise ValueError("no network facts in its answer")
        own = raw.get("own_name") or {}
        ssh = raw.get("ssh_address")
        resolved = [str(IPv4(a)) for a in _list(own.get("addresses") or [], "own addresses")]
        return NodeNetwork(
            tuple(_interface(i) for i in _list(raw.get("interfaces"), "interfaces")),
            tuple(_route(r) for r in _list(raw.get("routes"), "routes")),
            IPv4(ssh) if ssh else None,
            str(own.get("name") or "")[:253],
            tuple(resolved),
        )
    except (ValueError, TypeError, AttributeError) as exc:
        return Problem(
            ERROR,
            host,
            f"its network facts were not understood: {str(exc)[:200]}",
            hint="run cpuaccel provision (the same cpuaccel on every node)",
        )


# ---------------------------------------------------------------- what the user asks for


@dataclass(frozen=True)
class Wanted:
    """A network a user named: a CIDR or an interface name, and where it was given."""

    value: str
    where: str

    @property
    def cidr(self) -> ipaddress.IPv4Network | None:
        return ipaddress.IPv4Network(self.value) if "/" in self.value else None

    def address_on(self, node: NodeNetwork) -> tuple[Interface, ipaddress.IPv4Interface] | None:
        cidr = self.cidr
        for interface, address in node.usable():
            if (cidr is not None and address.ip in cidr) or interface.name == self.value:
                return interface, address
        return None


def wanted_on(
    host: Host, run_value: str | None, run_where: str | None, *, flag: bool
) -> Wanted | None:
    """The network ``host`` must use: ``--network`` (``flag``) on every node, else the
    host's own ``cpuaccel_network``, else the run's (the project file's)."""
    if run_value and flag:
        return Wanted(run_value, run_where or "--network")
    own = host.vars.get(NETWORK_VAR)
    if own is not None:
        try:
            value = network(own)
        except BadValue:
            value = None  # the inventory's check refused it already
        if value:
            return Wanted(value, f"{NETWORK_VAR} of {host.name}")
    if run_value:
        return Wanted(run_value, run_where or NETWORK_VAR)
    return None


# ---------------------------------------------------------------- the choice


@dataclass(frozen=True)
class NodeChoice:
    """The address and interface a node's ranks talk over, and why those."""

    host: str
    address: str
    interface: str
    prefix: int
    mtu: int | None
    why: str

    def to_json(self) -> dict[str, Any]:
        """Every field but the host, the key the job's nodes are filed under."""
        return {name: value for name, value in asdict(self).items() if name != "host"}


@dataclass
class JobNetwork:
    """Every node's choice (head first), and what was worth saying about it."""

    head_address: str
    nodes: dict[str, NodeChoice] = field(default_factory=dict)
    # Every node resolves every other node's name to the address chosen for it: the
    # hostfile and MASTER_ADDR may keep the names.
    use_names: bool = False
    problems: list[Problem] = field(default_factory=list)

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == ERROR]

    @property
    def complete(self) -> bool:
        return not self.errors and bool(self.nodes)

    def common_interface(self) -> str | None:
        """The interface name every node uses, if it is one name (launchers that take
        one name for every node: Intel MPI's, MPICH's)."""
        names = {c.interface for c in self.nodes.values()}
        return names.pop() if len(names) == 1 else None

    def common_subnet(self) -> str | None:
        """The one IPv4 network that holds every node's address, as a CIDR (Open MPI
        takes it for every node, whatever the interfaces' names)."""
        subnets = {
            ipaddress.IPv4Interface(f"{c.address}/{c.prefix}").network for c in self.nodes.values()
        }
        return str(subnets.pop()) if len(subnets) == 1 else None

    def rank_map(self) -> str:
        """``ADDRESS=INTERFACE`` words, one a node: the rank's worker finds its node's
        entry among its own addresses (cpuaccel.node.netif) and sets the variables."""
        return " ".join(f"{c.address}={c.interface}" for c in self.nodes.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "head_address": self.head_address,
            "use_names": self.use_names,
            "nodes": {name: c.to_json() for name, c in self.nodes.items()},
        }


def to_choose(hosts: Sequence[Host]) -> bool:
    """Whether ``hosts`` have a network between them to choose: not one node, nor every
    host this machine."""
    return len(hosts) > 1 and not all(h.is_local for h in hosts)


def choose(
    hosts: Sequence[Host],
    facts: Mapping[str, Facts],
    wanted: Callable[[Host], Wanted | None],
) -> JobNetwork | None:
    """The job's network over ``hosts`` (head first), from their facts; None when there
    is no network to choose (:func:`to_choose`)."""
    if not to_choose(hosts):
        return None
    found = JobNetwork("")
    nets: dict[str, NodeNetwork] = {}
    for host in hosts:
        if host.name not in facts:
            continue  # an unreachable node: its own problem says so
        parsed = of_facts(host.name, facts[host.name])
        if isinstance(parsed, Problem):
            found.problems.append(parsed)
        else:
            nets[host.name] = parsed
    if len(nets) < len(hosts):
        return found
    shared = _shared(hosts, nets)
    found.problems += _shared_notes(shared, nets)
    head = hosts[0]
    peers = [
        address
        for h in hosts[1:]
        if (address := nets[h.name].ssh_address or _literal(h.address)) is not None
    ]
    head_choice = _head_choice(head, nets[head.name], wanted(head), shared, peers)
    if isinstance(head_choice, Problem):
        found.problems.append(head_choice)
        return found
    found.head_address = head_choice.address
    found.nodes[head.name] = head_choice
    target = IPv4(head_choice.address)
    for host in hosts[1:]:
        choice = _node_choice(host, nets[host.name], wanted(host), target, shared)
        if isinstance(choice, Problem):
            found.problems.append(choice)
        else:
            found.nodes[host.name] = choice
    looped = _loopback_names(hosts, nets, found)
    found.problems += looped
    # A node whose own name is loopback there resolves its own hostfile line and
    # MASTER_ADDR to it: addresses then, everywhere.
    found.use_names = not looped and _names_agree(hosts, facts, found)
    return found


def _shared(hosts: Sequence[Host], nets: Mapping[str, NodeNetwork]) -> dict[IPv4, list[str]]:
    """Addresses that several nodes hold (docker0's 172.17.0.1, virbr0's ...). Two
    inventory names of one machine (the same interfaces and addresses) are one holder."""
    holders: dict[IPv4, list[str]] = defaultdict(list)
    machines: dict[IPv4, set[frozenset[tuple[str, str]]]] = defaultdict(set)
    for host in hosts:
        net = nets[host.name]
        machine = frozenset((i.name, str(a)) for i in net.interfaces for a in i.addresses)
        for address in {a.ip for i in net.interfaces for a in i.addresses}:
            if address not in LOOPBACK:
                holders[address].append(host.name)
                machines[address].add(machine)
    return {a: names for a, names in holders.items() if len(machines[a]) > 1}


def _shared_notes(
    shared: Mapping[IPv4, list[str]], nets: Mapping[str, NodeNetwork]
) -> list[Problem]:
    notes = []
    for address, names in sorted(shared.items()):
        interface = nets[names[0]].holding(address)
        on = f" ({interface.name})" if interface else ""
        notes.append(
            Problem(
                NOTE,
                None,
                f"{address}{on} is held by {_names(names)}: never used for the job's traffic",
                hint="nothing to do (a container or VM bridge on every node is common)",
            )
        )
    return notes


def _names(names: Sequence[str]) -> str:
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return ", ".join(names[:3]) + more


def _pick(
    host: Host, interface: Interface, address: ipaddress.IPv4Interface, why: str
) -> NodeChoice:
    return NodeChoice(
        host.name, str(address.ip), interface.name, address.network.prefixlen, interface.mtu, why
    )


def _wanted_choice(
    host: Host, net: NodeNetwork, want: Wanted, shared: Mapping[IPv4, list[str]]
) -> NodeChoice | Problem:
    found = want.address_on(net)
    if found is None:
        held = ", ".join(f"{a.ip}/{a.network.prefixlen} ({i.name})" for i, a in net.usable())
        return Problem(
            ERROR,
            host.name,
            f"no address on {want.value} ({want.where}); its addresses: {held or 'none'}",
            hint=f"fix {want.where} (a network each node has an address on), or give "
            f"this host its own {NETWORK_VAR}",
        )
    interface, address = found
    if address.ip in shared:
        return _shared_problem(host, address.ip, shared)
    return _pick(host, interface, address, f"{want.value} ({want.where})")


def _shared_problem(host: Host, address: IPv4, shared: Mapping[IPv4, list[str]]) -> Problem:
    return Problem(
        ERROR,
        host.name,
        f"the address chosen, {address}, is held by {_names(shared[address])} too",
        hint=FIX_NETWORK,
    )


def _head_choice(
    head: Host,
    net: NodeNetwork,
    want: Wanted | None,
    shared: Mapping[IPv4, list[str]],
    peers: Sequence[IPv4],
) -> NodeChoice | Problem:
    """``peers``: the addresses the controller reached the other nodes at, for a head it
    reached without ssh (this machine): its address is then the one its route to them
    leaves from."""
    if want is not None:
        return _wanted_choice(head, net, want, shared)
    usable = [(i, a) for i, a in net.usable() if a.ip not in shared]
    if net.ssh_address is None:
        for peer in peers:
            route = net.route_to(peer)
            facing = [(i, a) for i, a in usable if route and i.name == route.interface]
            if facing:
                near = next(((i, a) for i, a in facing if peer in a.network), facing[0])
                return _pick(head, *near, f"its route to {peer}")
    candidates: list[tuple[IPv4 | None, str]] = [
        (net.ssh_address, "the address the controller reaches it at"),
    ]
    literal = _literal(head.address)
    if literal is not None:
        candidates.append((literal, "its ansible_host"))
    default = net.route_to(IPv4("0.0.0.0"))
    if default is not None and default.interface is None:
        default = None
    for target, why in candidates:
        match = next(((i, a) for i, a in usable if a.ip == target), None)
        if match is not None:
            return _pick(head, *match, why)
    if default is not None:
        match = next(((i, a) for i, a in usable if i.name == default.interface), None)
        if match is not None:
            return _pick(head, *match, "its default route's interface")
    if len(usable) == 1:
        return _pick(head, *usable[0], "its only address")
    return Problem(
        ERROR,
        head.name,
        "cannot tell which of its addresses the other nodes reach (the head node): "
        + (", ".join(f"{a.ip} ({i.name})" for i, a in usable) or "it has none"),
        hint=FIX_NETWORK,
    )


def _node_choice(
    host: Host,
    net: NodeNetwork,
    want: Wanted | None,
    head: IPv4,
    shared: Mapping[IPv4, list[str]],
) -> NodeChoice | Problem:
    if want is not None:
        return _wanted_choice(host, net, want, shared)
    own = net.holding(head)
    if own is not None:  # another inventory name of the head's own machine
        address = next(a for a in own.addresses if a.ip == head)
        return _pick(host, own, address, "it holds the head's address")
    route = net.route_to(head)
    if route is None or route.interface is None:
        return Problem(
            ERROR,
            host.name,
            f"no route to the head node's {head}",
            hint=f"add a route to {head} on {host.name}, or {FIX_NETWORK}",
        )
    interface = net.interface(route.interface)
    addresses = [
        a
        for a in (interface.addresses if interface is not None else ())
        if a.ip not in LOOPBACK and a.ip not in shared
    ]
    if interface is None or not interface.up or not addresses:
        return Problem(
            ERROR,
            host.name,
            f"its route to the head node's {head} is over {route.interface}, which has no "
            "address to use" + ("" if interface is None or interface.up else " (it is down)"),
            hint=f"bring {route.interface} up with an address, or {FIX_NETWORK}",
        )
    address = next((a for a in addresses if head in a.network), addresses[0])
    via = f" via {route.gateway}" if route.gateway is not None else ""
    return _pick(host, interface, address, f"its route to the head's {head}{via}")


def _literal(name: str) -> IPv4 | None:
    try:
        return IPv4(name)
    except ValueError:
        return None


def _loopback_names(
    hosts: Sequence[Host], nets: Mapping[str, NodeNetwork], found: JobNetwork
) -> list[Problem]:
    """A node whose own name resolves to loopback (a stock /etc/hosts): gloo would
    advertise that address; the interface set for the ranks avoids it."""
    notes = []
    for host in hosts:
        net, choice = nets[host.name], found.nodes.get(host.name)
        looped = [a for a in net.own_name_addresses if IPv4(a) in LOOPBACK]
        if not looped or choice is None:
            continue
        notes.append(
            Problem(
                NOTE,
                host.name,
                f"its name {net.own_name} resolves to {', '.join(looped)} there, which gloo "
                f"would advertise; its ranks use {choice.interface} ({choice.address}), "
                f"set as GLOO_SOCKET_IFNAME",
                hint=f"nothing to do for cpuaccel; other tools need {choice.address} "
                f"{net.own_name} in /etc/hosts",
            )
        )
    return notes


def _names_agree(hosts: Sequence[Host], facts: Mapping[str, Facts], found: JobNetwork) -> bool:
    """Whether every node resolves every other node's inventory name to the address
    chosen for it: then the hostfile may keep the names."""
    for host in hosts:
        answers = facts[host.name].get("resolve") or {}
        for peer in hosts:
            if peer.name == host.name or peer.is_local:
                continue
            choice = found.nodes.get(peer.name)
            answer = answers.get(peer.name) if isinstance(answers, dict) else None
            if choice is None or not isinstance(answer, dict):
                return False
            if choice.address not in (answer.get("addresses") or []):
                return False
    return True
