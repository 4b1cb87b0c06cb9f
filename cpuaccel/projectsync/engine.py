"""Sync one source manifest to many nodes: scan, plan, transfer, verify, record.

Each node costs one connection. First every node looks at its destination, changing
nothing: the node program resolves it, judges it (cpuaccel.node.destination) and reports
its tree (hashes cached by size, mtime, ctime and inode, so an unchanged tree costs only
stats). When any node refuses its destination, the sync stops there, before any node is
changed. Then the controller plans what differs, and the changes go over rsync or a tar
stream on the same channel. Nodes that see the same destination folder (a shared
filesystem) are written once.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from cpuaccel.connectors import broadcast, broadcast_policy
from cpuaccel.connectors.base import Connector
from cpuaccel.connectors.choose import keeps_connection
from cpuaccel.connectors.connect_options import ConnectOptions
from cpuaccel.connectors.openssh import port_of
from cpuaccel.errors import HostError
from cpuaccel.executor import ConnectionPool, HostResult, Status, run_on_hosts
from cpuaccel.inventory.host import Host
from cpuaccel.node.tree import Entry
from cpuaccel.projectsync import transfer
from cpuaccel.projectsync.location import DestinationRefused, raise_refusals, render_dest
from cpuaccel.projectsync.manifest import SourceChanging, SourceManifest, plan
from cpuaccel.projectsync.memory import SyncMemory
from cpuaccel.projectsync.node_result import NodeReport
from cpuaccel.projectsync.receiver import NodeSession, request


@dataclass(frozen=True)
class SyncOptions:
    dest_template: str
    delete: bool = False
    check: bool = False
    copy_links: bool = False


@dataclass(frozen=True)
class SyncListeners(broadcast.Listeners):
    """Who hears of a sync as it goes: the broadcast's listeners (its lines, and the
    bytes sent, ``on_bytes`` counting every transfer's), and ``on_result`` each node's
    result as it is known."""

    on_result: Callable[[HostResult[NodeReport]], None] | None = None


class Syncer:
    def __init__(
        self,
        source: SourceManifest,
        options: SyncOptions,
        dests: dict[str, str],
        memory: SyncMemory | None = None,
        hosts: Sequence[Host] = (),
        listen: SyncListeners = SyncListeners(),
    ) -> None:
        self.source = source
        self.listen = listen
        # Files each node holds already from the broadcast, verified there by sha256.
        self.delivered: dict[str, frozenset[str]] = {}
        self.options = options
        self.dests = dests
        self.on_bytes = listen.on_bytes
        self.shared = SharedDestinations()
        self.memory = memory
        self._memory_lock = threading.Lock()
        # Filesystem ids remembered for more than one chosen node: those nodes share a
        # folder and must go through the writer election, never the one-trip path.
        remembered = [self._remembered(h) for h in hosts]
        fsids = [last[1] for last in remembered if last is not None]
        self._shared_fsids = {f for f in fsids if fsids.count(f) > 1}
        self.looked: dict[str, dict[str, Any]] = {}  # each node's answer to ``look``
        # One receiver a node for the whole sync: the look's, which then writes.
        self.sessions: dict[str, NodeSession] = {}
        self._sessions_lock = threading.Lock()
        # The change from a remembered tree (by its hash) to the source: planned, and its
        # tar made, once for every node that holds that tree (_trip).
        self._trips: dict[str, _Trip] = {}
        self._trips_lock = threading.Lock()

    def _session(self, conn: Connector) -> NodeSession:
        with self._sessions_lock:
            if conn.host.name not in self.sessions:
                self.sessions[conn.host.name] = NodeSession(conn, self._dest(conn))
            return self.sessions[conn.host.name]

    def close(self) -> None:
        """End every node's receiver, then wait (bounded) for them all."""
        for session in self.sessions.values():
            session.close()
        deadline = time.monotonic() + 10
        for session in self.sessions.values():
            session.wait(deadline)

    def start_early(self, hosts: Sequence[Host], pool: ConnectionPool) -> None:
        """Start the receivers of ``hosts`` (the first --forks of them) and return at
        once: their handshakes and the nodes' interpreters proceed while the controller
        hashes the source. Only where starting does not wait: a paramiko connection
        would shake hands here, so it is left to the look. What fails here is done
        again by the look, which reports it as that node's result."""
        for host in hosts:
            if not (host.is_local or keeps_connection(host, pool.options)):
                continue
            with contextlib.suppress(Exception):
                self._session(pool.get(host)).start()

    def look(self, conn: Connector) -> dict[str, Any] | DestinationRefused:
        """The first phase, on every node before any is changed: the node's verdict on
        its destination and, when it accepts it, its tree (changing nothing)."""
        last = self._remembered(conn.host)
        try:  # a tree as remembered, or as the source's, answers in a few bytes
            found = self._session(conn).request(
                "look", expect=last[0] if last else self.source.hash
            )
        except DestinationRefused as refused:
            return refused
        if found["entries"] is None:
            found["entries"] = last[2] if last else self.source.entries
        if last is not None and found["hash"] == last[0] and not self.options.check:
            # The one-trip change this node will get, made while other nodes still look;
            # a failure here is met again, and reported, by _one_trip.
            with contextlib.suppress(Exception):
                self._trip(last[0], last[2])
        return found

    def broadcast(self, hosts: Sequence[Host], pool: ConnectionPool) -> None:
        """Send the large files that several nodes need through one broadcast, before
        each node's own transfer: a node then gets only the rest, and trusts what the
        broadcast delivered (its relay checked the sha256 before the file took its name).
        A node the broadcast failed gets those files the usual way, from the controller."""
        if self.options.check:
            return
        sizes = {rel: int(e[2]) for rel, e in self.source.entries.items() if e[0] == "f"}
        changed: dict[str, list[str]] = {}
        for host in hosts:
            looked = self.looked.get(host.name)
            if looked is None or not broadcast_policy.relays(host) or not host_has_ssh(pool, host):
                continue
            entries = looked["entries"] if looked["entries"] is not None else self.source.entries
            changed[host.name] = plan(self.source, entries)[0]
        needs = broadcast_policy.choose(changed, sizes)
        if not needs:
            return
        # a destination not made yet: made now (the scan), as the node's own transfer
        # would, so that its filesystem id tells whether other nodes share the folder
        new = [h for h in hosts if h.name in needs and self.looked[h.name].get("fsid") is None]
        for made in run_on_hosts(new, self._make, forks=len(new) or 1, pool=pool):
            if not made.ok:
                needs.pop(made.host.name, None)
        # nodes that share a folder (one writes it for all) stay on the usual path
        fsids = [self.looked[name].get("fsid") for name in needs]
        needs = {
            name: rels
            for name, rels in needs.items()
            if fsids.count(self.looked[name].get("fsid")) == 1
            and self.looked[name].get("fsid") not in self._shared_fsids
        }
        if not broadcast_policy.worth(needs, sizes):
            return
        chosen = [h for h in hosts if h.name in needs]
        union = sorted(set().union(*needs.values()))
        files = [
            broadcast.PayloadFile(
                rel,
                self.source.local[rel],
                int(self.source.entries[rel][2]),
                str(self.source.entries[rel][3]),
                int(self.source.entries[rel][1]),
            )
            for rel in union
        ]
        roots = {h.name: str(self.looked[h.name]["dest"]) for h in chosen}
        sender = broadcast.Broadcast(pool, chosen, roots, files, keep=needs, listen=self.listen)
        done = sender.run()
        broadcast_policy.fall_back(done, self.listen.note, "sending it directly")
        self.delivered = {name: frozenset(d.kept) for name, d in done.items() if d.ok}

    def _make(self, conn: Connector) -> None:
        self.looked[conn.host.name] = self._session(conn).request("scan", expect=self.source.hash)

    def _key(self, host: Host) -> str:
        port = port_of(host)  # the port really used (ssh_config's when the inventory has none)
        return SyncMemory.node_key(host.name, host.address, port, self.dests[host.name])

    def _remembered(self, host: Host) -> tuple[str, str, dict[str, Entry]] | None:
        return self.memory.last(self._key(host)) if self.memory else None

    def _remember(self, host: Host, tree_hash: str | None, fsid: str | None) -> None:
        if self.memory is None:
            return
        with self._memory_lock:
            if tree_hash == self.source.hash:  # the node holds exactly the source's tree
                self.memory.confirm(self._key(host), tree_hash, fsid, self.source.entries)
            else:
                self.memory.forget(self._key(host))

    def __call__(self, conn: Connector) -> NodeReport:
        runs = self.looked[conn.host.name].get("runs")
        report = self._sync_node(conn)
        if isinstance(runs, dict):
            report.runs = runs
        return report

    def _sync_node(self, conn: Connector) -> NodeReport:
        fsid = None
        try:
            scanned = self.looked[conn.host.name]
            if not self.options.check:
                quick = self._one_trip(conn, scanned)
                if isinstance(quick, NodeReport):
                    return quick
                if quick is not None:
                    scanned = quick
                elif scanned.get("fsid") is None:  # a new destination: make it, and its id
                    scanned = self._session(conn).request("scan", expect=self.source.hash)
            if scanned["entries"] is None:  # exactly the source's tree
                scanned["entries"] = self.source.entries
            fsid = scanned.get("fsid")
            if fsid is not None:
                writer = self.shared.claim(fsid, conn.host.name)
                if writer is not None:
                    self._remember(conn.host, None, None)
                    return self._follow(conn, scanned["dest"], *writer)
            report = self._write(conn, scanned)
            return report
        except BaseException:
            self._remember(conn.host, None, None)
            raise
        finally:
            self.shared.done(fsid)
            self._session(conn).close()  # its end overlaps the other nodes' work

    def _one_trip(
        self, conn: Connector, looked: dict[str, Any]
    ) -> NodeReport | dict[str, Any] | None:
        """Send the difference from what the node held last time (and still holds, as it
        just said), in one round trip.

        Returns the report when the node applied it; the node's scan when its tree was not
        what we remembered (the caller goes on from there); None when not worth trying.
        """
        last = self._remembered(conn.host)
        if last is None or last[1] in self._shared_fsids:
            return None
        base, fsid, before = last
        if looked["hash"] != base or looked.get("fsid") != fsid or looked.get("leftovers"):
            return None
        trip = self._trip(base, before)
        changed, deleted, sent = trip.changed, trip.deleted, trip.sent
        if not changed and not deleted:
            return None  # nothing to send: the node's own answer says whether it is in sync
        if deleted and not self.options.delete:
            return None  # the node keeps files the source dropped: its tree won't match
        if sent >= transfer.RSYNC_MIN_BYTES:
            return None  # rsync's turf
        header = {
            "base": base,
            "fsid": fsid,
            "target": self.source.hash,
            "delete": deleted,
            "tar": bool(changed),
        }
        payload = json.dumps(header).encode() + b"\n" + trip.tar
        result = self._session(conn).request("apply", payload, last=True)
        if result.get("base_mismatch"):
            scanned: dict[str, Any] = result["scan"]
            return scanned
        if result["mismatches"]:
            self._remember(conn.host, None, None)
            raise HostError(
                conn.host.name,
                "the tree differs from the source after the sync",
                hint="was the source edited during the sync? run cpuaccel sync again",
            )
        self._remember(conn.host, result["hash"], result["fsid"])
        if self.on_bytes is not None:
            self.on_bytes(sent)
        method = "tar" if changed or deleted else "none"
        dest = self.dests[conn.host.name]
        added = [rel for rel in changed if rel not in before]
        return NodeReport(dest, changed, deleted, sent, method, in_sync=True, added=added)

    def _trip(self, base: str, before: dict[str, Entry]) -> _Trip:
        """What differs between the remembered tree ``base`` (``before``) and the source,
        with the tar of the changed files when a one-trip change would send them (below
        RSYNC_MIN_BYTES); made once (under the lock, so a second node waits for the first
        one's rather than make its own), kept in memory."""
        with self._trips_lock:
            if base not in self._trips:
                changed, deleted = plan(self.source, before)
                sent = _file_bytes(self.source, changed)
                tar = b""
                if changed and sent < transfer.RSYNC_MIN_BYTES:
                    with transfer.tar_stream(self.source, changed, b"") as stream:
                        tar = stream.read()
                self._trips[base] = _Trip(changed, deleted, sent, tar)
            return self._trips[base]

    def _dest(self, conn: Connector) -> str:
        return self.dests[conn.host.name]

    def _follow(
        self, conn: Connector, dest: str, writer: str, finished: threading.Event
    ) -> NodeReport:
        finished.wait()
        after = self._session(conn).request("look", expect=self.source.hash, last=True)
        entries = after["entries"] if after["entries"] is not None else self.source.entries
        mismatches = [
            rel for rel, entry in self.source.entries.items() if entries.get(rel) != entry
        ]
        return NodeReport(
            dest, shared_with=writer, in_sync=not mismatches, mismatches=mismatches[:50]
        )

    def _write(self, conn: Connector, scanned: dict[str, Any]) -> NodeReport:
        dest = scanned["dest"]
        changed, deleted = plan(self.source, scanned["entries"])
        if not self.options.delete:
            deleted = []
        sent = _file_bytes(self.source, changed)
        added = [rel for rel in changed if rel not in scanned["entries"]]
        report = NodeReport(dest, changed, deleted, sent, added=added)
        if self.options.check:
            report.method = "check"
            report.in_sync = not changed and not deleted
            return report
        if (
            not changed
            and not deleted
            and scanned.get("recorded") == self.source.hash
            and not scanned.get("leftovers")  # apply clears an interrupted sync's files
        ):
            report.in_sync = True
            self._remember(conn.host, scanned["hash"], scanned.get("fsid"))
            return report
        result = self._transfer(conn, scanned, changed, deleted)
        self._remember(conn.host, result.get("tree_hash"), result.get("fsid"))
        report.mismatches = list(result["mismatches"])
        report.in_sync = not report.mismatches
        report.method = result["method"]
        if report.mismatches:
            raise HostError(
                conn.host.name,
                f"{len(report.mismatches)} path(s) differ from the source after the sync, "
                f"e.g. {report.mismatches[0]}",
                hint="was the source edited during the sync? run cpuaccel sync again",
            )
        return report

    def _transfer(
        self, conn: Connector, scanned: dict[str, Any], changed: list[str], deleted: list[str]
    ) -> dict[str, Any]:
        node = scanned["entries"]
        delivered = self.delivered.get(conn.host.name, frozenset())
        given = [rel for rel in changed if rel in delivered]
        changed = [rel for rel in changed if rel not in delivered]
        sent = _file_bytes(self.source, changed)
        retyped = any(
            rel in node and node[rel][0] != self.source.entries[rel][0] for rel in changed
        )
        use_rsync = (
            conn.rsync_ok
            and scanned.get("rsync") is not None
            and transfer.have_local_rsync()
            and sent >= transfer.RSYNC_MIN_BYTES
            and not retyped  # rsync will not replace a folder by a file; the tar path does
        )
        if use_rsync:
            transfer.rsync_push(
                conn,
                self.source,
                changed,
                scanned["dest"],
                self.options.copy_links,
                self.on_bytes,
                temp_dir=not scanned.get("created"),  # a folder this sync made
            )
            header = request(self.source, deleted, tar=False, trusted=[*changed, *given])
            result = self._session(conn).request("apply", header, last=True)
            result["method"] = "broadcast+rsync" if given else "rsync"
            return result
        if given and not changed:
            header = request(self.source, deleted, tar=False, trusted=given)
            result = self._session(conn).request("apply", header, last=True)
            result["method"] = "broadcast"
            return result
        header = request(self.source, deleted, tar=True, trusted=given)
        stream = transfer.tar_stream(self.source, changed, header)
        with stream:
            result = self._session(conn).request("apply", stream, last=True)
        if self.on_bytes is not None:
            self.on_bytes(sent)
        result["method"] = "broadcast+tar" if given else "tar"
        return result


def sync(
    hosts: Sequence[Host],
    source: SourceManifest,
    options: SyncOptions,
    *,
    forks: int,
    connect: ConnectOptions,
    pool: ConnectionPool | None = None,
    listen: SyncListeners = SyncListeners(),
) -> list[HostResult[NodeReport]]:
    """Sync to every host in parallel, on ``pool``'s connections (a pool of its own on
    ``connect`` without one). Large files that several nodes need go through one
    broadcast (``Syncer.broadcast``): ``listen.note`` takes its lines (a node cut out,
    the fall-back to the star), ``listen.progress`` its bytes (so far, of the total).

    Destinations are checked as text before any connection, then by every node as it
    resolves them, before any node is changed: DestinationRefused (exit 64) when one
    refuses, and then nothing is written on the controller either (hash cache, sync
    memory).

    A node that failed while source files changed under the sync (a log being written)
    is synced once more from the tree as it is then; when files change again, SourceChanging
    names them (exit 64), with the hint to exclude them."""
    held: list[HostResult[NodeReport]] = []  # failures: reported once we know their fate
    report = listen.on_result or (lambda r: None)
    once = _Pass(options, forks, connect, pool, listen)
    results = once(
        hosts,
        source,
        lambda r: (report if r.ok or r.status is Status.UNREACHABLE else held.append)(r),
    )
    if not held or not source.changed_since_build():
        for r in held:
            report(r)
        return results
    source.rebuild()  # the tree as it is now, for the nodes that failed
    again = {r.host.name: r for r in once([r.host for r in held], source, report)}
    if any(not r.ok for r in again.values()) and (moved := source.changed_since_build()):
        raise SourceChanging(moved)
    return [again.get(r.host.name, r) for r in results]


@dataclass(frozen=True)
class _Pass:
    """One pass of a sync over some of its hosts (``sync`` makes a second one, for the
    nodes that failed while the source changed)."""

    options: SyncOptions
    forks: int
    connect: ConnectOptions
    pool: ConnectionPool | None
    listen: SyncListeners

    def __call__(
        self,
        hosts: Sequence[Host],
        source: SourceManifest,
        on_result: Callable[[HostResult[NodeReport]], None],
    ) -> list[HostResult[NodeReport]]:
        options, forks, pool = self.options, self.forks, self.pool
        dests = {h.name: render_dest(h, options.dest_template) for h in hosts}
        memory = None if options.check else SyncMemory(source.roots, options.dest_template)
        listen = replace(self.listen, on_result=on_result)
        syncer = Syncer(source, options, dests, memory, hosts, listen)
        with contextlib.ExitStack() as stack:
            if pool is None:  # one connection a host for both phases
                pool = stack.enter_context(ConnectionPool(self.connect))
            stack.callback(syncer.close)  # before the pool closes the connections
            if source.pending:  # files to hash (a cold cache): the nodes' start overlaps it
                syncer.start_early(hosts[:forks], pool)
                source.finish()
            looked = run_on_hosts(hosts, syncer.look, forks=forks, pool=pool)
            raise_refusals([r.value for r in looked])
            source.save_cache()  # the destinations are accepted: from here on, state is kept
            done: dict[str, HostResult[NodeReport]] = {}
            for seen in looked:
                if isinstance(seen.value, dict):
                    syncer.looked[seen.host.name] = seen.value
                    continue
                # unreachable, or the node program failed: reported as it is
                failed = HostResult[NodeReport](
                    seen.host, seen.status, None, seen.error, seen.hint, seen.seconds
                )
                done[seen.host.name] = failed
                on_result(failed)
            ready = [h for h in hosts if h.name in syncer.looked]
            syncer.broadcast(ready, pool)
            for r in run_on_hosts(ready, syncer, forks=forks, on_result=on_result, pool=pool):
                done[r.host.name] = r
            if memory is not None:  # while the nodes' programs end (syncer.close waits)
                memory.save()
        return [done[h.name] for h in hosts]


@dataclass(frozen=True)
class _Trip:
    """The change from one remembered tree to the source (Syncer._trip)."""

    changed: list[str]
    deleted: list[str]
    sent: int  # the changed files' bytes
    tar: bytes  # the changed files' tar; empty when none, or when rsync sends them


def host_has_ssh(pool: ConnectionPool, host: Host) -> bool:
    """Whether the host is reached over ssh (it can then take part in a broadcast)."""
    return bool(pool.get(host).rsync_ok)


def _file_bytes(source: SourceManifest, rels: Sequence[str]) -> int:
    return sum(int(source.entries[r][2]) for r in rels if source.entries[r][0] == "f")


# ---------------------------------------------------------------- nodes that share a destination
# Nodes that see the same destination folder (a shared filesystem): one writes, the
# others wait for it and then verify.
class SharedDestinations:
    """Elects one writer per filesystem id; the others wait for it and then verify."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._writers: dict[str, tuple[str, threading.Event]] = {}

    def claim(self, fsid: str, host: str) -> tuple[str, threading.Event] | None:
        """None when host is the writer, else (writer, event set when it is done)."""
        with self._lock:
            if fsid not in self._writers:
                self._writers[fsid] = (host, threading.Event())
                return None
            return self._writers[fsid]

    def done(self, fsid: str | None) -> None:
        if fsid is not None:
            with self._lock:
                writer = self._writers.get(fsid)
            if writer is not None:
                writer[1].set()
