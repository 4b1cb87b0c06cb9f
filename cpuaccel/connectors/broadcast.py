"""One payload to many nodes at the speed of one copy: a pipeline through the nodes.

Sending a file to N nodes from the controller costs N copies through its one link. Here
the controller sends one copy, to the first node, and every node keeps the stream and
passes it on to the next (``fanout`` nodes each: 1 is a chain) over the node-to-node ssh
that MPI's launcher needs anyway, with the keys and host-key policy the controller
verified. The node side is ``cpuaccel.node.relay``; this module is the controller's one
loop over all of them (``Broadcast.run``).

Set-up is parallel: every relay starts at once and opens its own ssh to the next
nodes; the first byte moves once every hop is up or has failed, so no hop waits for the
one before it. Each node checks the sha256 of every file it keeps and renames it into
place only when it matches; the controller checks the hashes it is told again. A node
that fails (its relay ends, or is silent for STALL s) is named and cut out, and the
nodes it fed are served directly by the controller, from the offset each already holds;
so are the nodes behind one too slow to keep up. When the nodes cannot ssh to each
other, every node is served directly (a star), with one line saying why. What goes by
broadcast, the nodes' order and when one is too slow are cpuaccel.connectors.broadcast_policy's.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from cpuaccel.connectors import commandline, openssh, programs
from cpuaccel.connectors.base import Connector, Process
from cpuaccel.connectors.broadcast_policy import CHAIN, LAG, feeders, relays, slow
from cpuaccel.connectors.connect_options import ConnectOptions
from cpuaccel.errors import CpuaccelError
from cpuaccel.inventory.host import Host
from cpuaccel.jsonsource import loads
from cpuaccel.node import relay
from cpuaccel.node.relay import FEED

STALL = 20.0  # seconds without a relay's heartbeat (it sends one every half second)
IDLE = 60.0  # seconds a relay waits for a byte, or a hop for its bytes, before it gives up
READ = 1 << 20


class Pool(Protocol):
    """Where the broadcast gets each host's open connection (an executor's
    ConnectionPool), and the options it verified them with."""

    options: ConnectOptions

    def get(self, host: Host) -> Connector: ...


def _quiet(line: str) -> None:
    """A note nobody takes."""


@dataclass(frozen=True)
class Listeners:
    """Who hears of a broadcast as it goes: ``note`` takes the lines that name a node
    cut out or the fall-back to a star; ``on_bytes`` the bytes that every live node now
    holds, as they grow; ``progress`` (those bytes, of the total)."""

    note: Callable[[str], None] = _quiet
    on_bytes: Callable[[int], None] | None = None
    progress: Callable[[int, int], None] | None = None


@dataclass(frozen=True)
class PayloadFile:
    """One file of the stream: where it lands below each node's root, and what it is."""

    rel: str  # '/'-separated, normalised, below the node's root
    local: str  # its path on the controller
    size: int
    sha256: str
    mode: int
    mtime_ns: int | None = None  # set on the node's copy (rsync's quick check), or not


@dataclass
class Delivery:
    """One node's outcome."""

    host: str
    kept: dict[str, str] = field(default_factory=dict)  # rel -> sha256, verified twice
    bad: list[str] = field(default_factory=list)  # files that arrived wrong (removed)
    error: str | None = None  # why the node failed, when it did
    direct: bool = False  # served by the controller, not by another node

    @property
    def ok(self) -> bool:
        return self.error is None and not self.bad


@dataclass
class _Node:
    host: Host
    conn: Connector
    keep: frozenset[str]
    socket: str = field(default_factory=lambda: "cpuaccel-relay-" + secrets.token_hex(12))
    key: str = field(default_factory=lambda: secrets.token_hex(32))
    parent: str | None = None  # None: the controller feeds it
    children: list[str] = field(default_factory=list)
    kept: programs.Kept | None = None
    got: int = 0
    moved: float = field(default_factory=time.monotonic)  # when ``got`` last grew
    hops: dict[str, bool | None] = field(default_factory=dict)  # up, lost, or not yet known
    ready: bool = False
    ended: bool = False
    feeding: bool = False  # a direct feed of the controller's is running
    cut_children: bool = False
    kept_files: dict[str, str] = field(default_factory=dict)
    bad_files: list[str] = field(default_factory=list)
    delivery: Delivery | None = None


class Broadcast:
    """Send ``files`` to every host of ``hosts`` below its root (``roots``), each host
    keeping the files ``keep`` names for it (all by default), through one pipeline.

    ``pool`` gives a host's open connection; ``listen`` hears of the broadcast as it
    goes; ``fanout`` is how many nodes each node feeds (broadcast_policy.feeders);
    ``python`` the interpreter to run on a host (``host.python`` by default)."""

    def __init__(
        self,
        pool: Pool,
        hosts: Sequence[Host],
        roots: Mapping[str, str],
        files: Sequence[PayloadFile],
        *,
        keep: Mapping[str, frozenset[str]] | None = None,
        fanout: int = CHAIN,
        listen: Listeners = Listeners(),
        python: Callable[[Host], str] | None = None,
    ) -> None:
        self.connect = pool.get
        # the node's interpreter for the relay and the feeds: cpuaccel's (host.python) by
        # default; a playbook's runs before that one exists, with the module interpreter
        self.python = python or (lambda host: host.python)
        self.progress = listen.progress
        self.options = pool.options
        self.hosts = list(hosts)
        self.roots = dict(roots)
        self.files = list(files)
        self.total = sum(f.size for f in self.files)
        self.keep = keep
        self.fanout = fanout
        self.note = listen.note
        self.on_bytes = listen.on_bytes
        self.nodes: dict[str, _Node] = {}
        self.events: queue.Queue[tuple[str, dict[str, Any] | None, str]] = queue.Queue()
        self._feeds: list[Process] = []
        self._feeds_lock = threading.Lock()
        self._reported = 0
        self._started = time.monotonic()
        self._hop_why: dict[tuple[str, str], str] = {}  # (parent, child) -> ssh's words
        # Seconds from ``run`` to the first byte: the set-up (connections, relays, hops).
        self.setup_seconds: float | None = None

    # ------------------------------------------------------------- the one loop
    def run(self) -> dict[str, Delivery]:
        """Every node's Delivery, once each has kept every file or failed."""
        everything = frozenset(f.rel for f in self.files)
        self._started = time.monotonic()
        # every host's connection at once: a pool's open one is there already, a new one
        # is a handshake, and handshakes one after another would be the set-up's most
        with ThreadPoolExecutor(max_workers=min(32, len(self.hosts) or 1)) as pool:
            reached = list(pool.map(self._reach, self.hosts))
        for host, (conn, error) in zip(self.hosts, reached, strict=True):
            keep = self.keep.get(host.name, everything) if self.keep is not None else everything
            self.nodes[host.name] = _Node(host, conn, keep)  # type: ignore[arg-type]
            if conn is None:
                self._fail(host.name, error)
        self._lay_out()
        for node in self.nodes.values():
            if node.delivery is None:
                threading.Thread(target=self._start_relay, args=(node,), daemon=True).start()
        try:
            self._loop()
        finally:
            self._close()
        return {h.name: self.nodes[h.name].delivery or Delivery(h.name) for h in self.hosts}

    def _reach(self, host: Host) -> tuple[Connector | None, str]:
        try:
            return self.connect(host), ""
        except CpuaccelError as exc:
            return None, str(exc)

    def _lay_out(self) -> None:
        """Each node's parent (broadcast_policy.feeders), among the nodes reached that
        relay; the others (the controller itself) are fed directly."""
        chain = [n.host.name for n in self.nodes.values() if n.delivery is None and relays(n.host)]
        for child, parent in feeders(chain, self.fanout).items():
            self.nodes[child].parent = parent
            self.nodes[parent].children.append(child)

    def _loop(self) -> None:
        started = False
        settle_by = time.monotonic() + self.options.connect_timeout + 15
        while not all(n.delivery is not None for n in self.nodes.values()):
            try:
                name, event, why = self.events.get(timeout=1.0)
            except queue.Empty:
                name, event, why = "", {}, ""
            if name:
                try:
                    self._take(self.nodes[name], event, why)
                except relay.OtherVersion as exc:
                    self._fail(name, str(exc))
                except (ValueError, TypeError, KeyError, AttributeError):
                    self._fail(name, f"its relay's answer was not understood: {event!r:.80}")
            if not started and (self._settled() or time.monotonic() > settle_by):
                started = True
                self._begin()
            if started:
                self._watch()
            self._progress()

    def _settled(self) -> bool:
        """Every live relay is listening and every hop is up or lost."""
        live = [n for n in self.nodes.values() if n.delivery is None]
        return all(n.ready and None not in n.hops.values() for n in live)

    def _begin(self) -> None:
        """The first byte: hops that failed to come up are said, in one line when none did."""
        self.setup_seconds = time.monotonic() - self._started
        lost = [
            (n.host.name, child)
            for n in self.nodes.values()
            for child, up in n.hops.items()
            if up is not True
        ]
        tried = sum(len(n.hops) for n in self.nodes.values())
        if tried and len(lost) == tried:
            parent, child = lost[0]
            why = self._hop_why.get((parent, child), "")
            if all(_ssh_words(self._hop_why.get(hop, "")) for hop in lost):
                cause = f"the nodes cannot reach each other over ssh ({parent} -> {child}: {why})"
            else:
                cause = self._lost_hop(parent, child)
            self.note(f"{cause}: sending to each node from the controller")
        else:
            for parent, child in lost:
                self.note(f"{self._lost_hop(parent, child)}: {child} is served directly")
        for node in self.nodes.values():
            node.moved = time.monotonic()
        for parent, child in lost:
            self._tell(self.nodes[parent], relay.Drop(child))
            self.nodes[child].parent = None
        for node in self.nodes.values():
            if node.delivery is None and node.parent is None:
                self._feed(node)

    def _lost_hop(self, parent: str, child: str) -> str:
        """Why ``child`` took no stream from ``parent``, naming the part that failed: ssh
        (its words), or the relay there (the feed's words, ssh having come up)."""
        why = self._hop_why.get((parent, child), "")
        if not why:  # neither up nor lost when the stream began
            return f"{child} did not answer {parent}'s feed in time (its ssh, or its relay)"
        if not _ssh_words(why):
            return f"{child}'s relay took no stream from {parent} ({_feed_words(why)})"
        return f"{parent} cannot ssh to {child} ({why})"

    def _watch(self) -> None:
        """Cut out the nodes that fall behind the node that feeds them."""
        for node in self.nodes.values():
            if node.delivery is not None or node.cut_children or not node.children:
                continue
            if node.parent is None:
                continue
            behind = self.nodes[node.parent].got - node.got
            still = time.monotonic() - node.moved
            if slow(behind, still):
                how = f"{behind >> 20} MiB behind" if behind > LAG else f"{still:.0f} s still,"
                self.note(
                    f"{node.host.name} is slow ({how} {node.parent}): "
                    "the nodes it feeds are served directly"
                )
                self._cut_children(node)

    def _take(self, node: _Node, event: dict[str, Any] | None, why: str) -> None:
        if node.delivery is not None:
            return
        if event is None:
            self._fail(node.host.name, why)
            return
        said = relay.answer_of(event)
        if isinstance(said, relay.Ready):
            node.ready = True
            node.hops = dict.fromkeys(node.children)
        elif isinstance(said, (relay.HopUp, relay.HopLost)):
            child = said.hop
            if child not in node.hops:
                return
            if isinstance(said, relay.HopUp):
                node.hops[child] = True
            else:
                first = node.hops[child] is None
                node.hops[child] = False
                self._hop_why[(node.host.name, child)] = said.lost
                if not first:  # lost mid-stream: the child is fed directly from here on
                    self._reroute(child, f"its feed from {node.host.name} ended")
        elif isinstance(said, relay.Got):
            if said.got > node.got:
                node.got, node.moved = said.got, time.monotonic()
        elif isinstance(said, (relay.Kept, relay.Bad)):
            self._file(node, said)
        elif isinstance(said, relay.Ended):
            node.ended = True
            node.got = said.got
            node.delivery = Delivery(
                node.host.name, node.kept_files, node.bad_files, direct=node.parent is None
            )
            if not said.end:
                failure = f": {said.failure}" if said.failure else ""
                node.delivery.error = (
                    f"its relay ended with {node.got} of {self.total} bytes{failure}"
                )
                self._cut_children(node)
        else:
            self._fail(node.host.name, f"no byte came within {IDLE:g} s")

    def _file(self, node: _Node, said: relay.Kept | relay.Bad) -> None:
        rel = said.file
        wanted = next((f.sha256 for f in self.files if f.rel == rel), None)
        if isinstance(said, relay.Kept) and said.kept == wanted:
            node.kept_files[rel] = said.kept
        elif isinstance(said, relay.Kept):  # it kept another file: not to be trusted
            self._fail(
                node.host.name,
                f"it reported sha256 {said.kept[:16]}... for {rel}, "
                f"not the sent {str(wanted)[:16]}...",
            )
        else:
            node.bad_files.append(rel)
            if said.error:  # it arrived whole: its name could not be given to it
                self.note(f"{node.host.name}: {rel} not kept there: {said.error[:200]}")
            else:
                self.note(f"{node.host.name}: {rel} arrived with another sha256; removed there")

    def _fail(self, name: str, why: str) -> None:
        node = self.nodes[name]
        if node.delivery is not None and node.delivery.error:
            return
        node.delivery = Delivery(name, error=why, direct=node.parent is None)
        if node.kept is not None:
            node.kept.close()
        if node.parent is not None and node.parent in self.nodes:
            self._tell(self.nodes[node.parent], relay.Drop(name))
        if node.children:
            self.note(f"{name} failed ({why}): the nodes it fed are served directly")
        self._cut_children(node)

    def _cut_children(self, node: _Node) -> None:
        node.cut_children = True
        for child in node.children:
            self._tell(node, relay.Drop(child))
            self._reroute(child, f"{node.host.name} was cut out")

    def _reroute(self, name: str, why: str) -> None:
        child = self.nodes[name]
        if child.delivery is not None or child.feeding:
            return
        child.parent = None
        self._tell(child, relay.Reroute())
        self._feed(child)

    # ------------------------------------------------------------- the relays
    def _start_relay(self, node: _Node) -> None:
        name = node.host.name
        try:
            node.kept = programs.Kept(node.conn, "relay", [], self.python(node.host))
            node.kept.send(json.dumps(self._request(node).wire()).encode() + b"\n")
            while True:
                answer = node.kept.answer("the broadcast relay", STALL)
                self.events.put((name, answer, ""))
                if "end" in answer:
                    return
        except CpuaccelError as exc:
            self.events.put((name, None, str(exc)))
        except Exception as exc:
            self.events.put((name, None, f"{type(exc).__name__}: {exc}"))

    def _request(self, node: _Node) -> relay.Request:
        children = [self.nodes[c] for c in node.children]
        # the relay names its own in-memory known_hosts on ssh's command line, which wins
        # over the config's: /dev/null here, so that no other file could ever be trusted
        known = "/dev/null"
        config = "".join(openssh.ssh_config_stanza(c.host, self.options, known) for c in children)
        config += _FAST + openssh.ssh_config_default(known)
        keys = []
        for child in children:
            key = child.conn.host_key()
            if key:
                keys.append(openssh.known_hosts_line(child.host, key))
        return relay.Request(
            relay.VERSION,
            node.socket,
            node.key,
            self.roots[node.host.name],
            [
                relay.RelayFile(f.rel, f.size, f.sha256, f.mode, f.rel in node.keep, f.mtime_ns)
                for f in self.files
            ],
            [
                relay.Hop(
                    c.host.name,
                    commandline.shell_line(self._feed_argv(c.host)),
                    c.socket,
                    c.key,
                )
                for c in children
            ],
            config,
            "".join(keys),
            IDLE,
        )

    def _feed_argv(self, host: Host) -> list[str]:
        """The feed run on ``host`` (its interpreter, no site: stdlib only)."""
        return [self.python(host), "-S", "-c", FEED]

    def _tell(self, node: _Node, order: relay.Order) -> None:
        if node.kept is not None and node.kept.alive:
            with contextlib.suppress(CpuaccelError):
                node.kept.send(relay.wire(order).encode())

    # ------------------------------------------------------------- the controller's feeds
    def _feed(self, node: _Node) -> None:
        """Serve ``node`` from the controller, from the offset its relay asks for."""
        node.feeding = True
        if node.delivery is None and node.parent is None:
            threading.Thread(target=self._send, args=(node,), daemon=True).start()

    def _send(self, node: _Node) -> None:
        name = node.host.name
        try:
            process = node.conn.start(self._feed_argv(node.host))
        except CpuaccelError as exc:
            self.events.put((name, None, f"cannot start the controller's feed: {exc}"))
            return
        with self._feeds_lock:
            self._feeds.append(process)
        lines = process.lines()
        try:
            process.send(relay.header(node.socket, node.key, IDLE))
            said: list[str] = []
            start = _from(lines, said)
            if start is None:  # no relay took the feed: the node cannot be served
                why = _feed_words(said[-1]) if said else "no answer"
                self.events.put((name, None, f"the controller's feed ended: {why}"))
                return
            for chunk in _stream(self.files, start):
                process.send(chunk)
            process.end_input()
            for _ in lines:  # the relay's closing line, then the end
                pass
        except (OSError, ValueError, CpuaccelError):
            pass  # the relay's own answers say what became of the node
        finally:
            with contextlib.suppress(Exception):
                process.close()

    def _progress(self) -> None:
        live = [n.got for n in self.nodes.values() if n.delivery is None or n.ended]
        held = min(live) if live else self.total
        if held > self._reported:
            if self.on_bytes is not None:
                self.on_bytes(held - self._reported)
            if self.progress is not None:
                self.progress(held, self.total)
            self._reported = held

    def _close(self) -> None:
        for node in self.nodes.values():
            if node.kept is not None:
                node.kept.close()
        with self._feeds_lock:
            feeds = list(self._feeds)
        for process in feeds:
            with contextlib.suppress(Exception):
                process.close()


# An ssh between nodes moves bulk data: no compression (the data is often packed
# already), and the ciphers fastest where the CPU has AES instructions first (every
# OpenSSH has them; ssh takes the first the server also offers).
_FAST = (
    "Host *\n    Compression no\n"
    "    Ciphers aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com,"
    "aes128-ctr,aes256-ctr\n"
)


def _ssh_words(why: str) -> bool:
    """A lost hop's words are ssh's own (the feed never ran), not the feed's."""
    return bool(why) and not why.startswith(relay.FEED_SAYS)


def _feed_words(line: str) -> str:
    """A feed's error line without the mark that tells it from ssh's."""
    return line[len(relay.FEED_SAYS) :] if line.startswith(relay.FEED_SAYS) else line


def _from(lines: Any, said: list[str]) -> int | None:
    """The offset the relay asks for, its first line through the feed (the feed's
    error lines before it go to ``said``)."""
    for stream, line in lines:
        if stream != "out":
            said.append(line)
            continue
        with contextlib.suppress(ValueError, TypeError, KeyError):
            return int(loads(line)["from"])
        return None
    return None


def _stream(files: Sequence[PayloadFile], start: int) -> Any:
    """The files' bytes one after another, from ``start``."""
    at = 0
    for f in files:
        if at + f.size <= start:
            at += f.size
            continue
        with open(f.local, "rb") as fh:
            if start > at:
                fh.seek(start - at)
            sent = max(start - at, 0)
            while sent < f.size:
                chunk = fh.read(min(READ, f.size - sent))
                if not chunk:
                    raise ValueError(f"{f.local} is shorter than when the broadcast began")
                sent += len(chunk)
                yield chunk
        at += f.size


def payload_file(
    local: str, rel: str, sha256: str | None = None, *, keep_mtime: bool = False
) -> PayloadFile:
    """A file of the controller's as one of the stream's (hashed here unless given),
    with its mtime for the node's copy when ``keep_mtime``."""
    import hashlib
    import stat

    st = os.stat(local)
    if sha256 is None:
        digest = hashlib.sha256()
        with open(local, "rb") as fh:
            while chunk := fh.read(READ):
                digest.update(chunk)
        sha256 = digest.hexdigest()
    mode = stat.S_IMODE(st.st_mode) & 0o777
    return PayloadFile(rel, local, st.st_size, sha256, mode, st.st_mtime_ns if keep_mtime else None)
