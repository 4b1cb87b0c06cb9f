"""The broadcast relay: keep a stream of files on this node and pass it on to the next.

Part of cpuaccel's node package (see ``cpuaccel.node``): stdlib only, Python 3.8+. The
controller (cpuaccel.connectors.broadcast) starts one relay a node, all at once, and
sends each its request, a ``Request`` (a JSON object, its files ``RelayFile`` lists),
as one line on stdin:

  version  VERSION: the controller and this program ship together; a request of
           another version is refused in one line
  socket   the abstract Unix socket name it listens on (Linux: one namespace a network
           namespace, no file to leave behind), where its upstream's feed connects
  key      what a feed must present first (never in argv: ``ps`` shows argv)
  root     the folder the files land below; ``files``: the stream's files in order
           (``RelayFile``: a file not kept is only passed on; a kept one gets the mtime
           given, else keeps the time it was written)
  hops     the nodes it passes the stream to (``Hop``: name, the quoted remote command
           of their feed, and their socket and key); ``ssh_config``/``known_hosts``: the
           texts of the ssh files it reaches them with, kept in memory files (memfd) that
           its ssh reads as /proc/self/fd/N: nothing on disk, and nothing left if the
           relay is killed
  idle     seconds without a byte or a word from the controller before it gives up

The request is checked before anything is made (``Request.read``): a file name that is
absolute, holds ``..``, an empty or ``.`` part or a NUL is refused with one error line,
whoever sent it. Anyone on the node can connect to the socket: the ``Gate`` takes every
connection as it comes and reads each key with a short deadline in a thread of its own,
so connections that never send hold no feed back.

Every hop's ssh starts at once, before a byte moves. A feed (FEED, run on the next node
by that ssh, or by the controller's own connection when a node is served directly)
connects to the next relay's socket, presents the key with its own stdin (ssh's pipe),
and hears from which offset the relay wants the stream: the relay keeps what it has
across a change of upstream, and reads the stream from that pipe itself. The hops' ssh
leave out the costly sntrup761 key exchange (mux.fast_kex), as the head's do.

A file is written under a temporary name (common.TMP_MARK) in its folder, reached by
descriptors (nofollow), hashed as it arrives, and renamed onto its name only when its
sha256 is the expected one; a file that differs is removed. What a killed relay left
of a name is removed when a relay writes that name again (a live relay holds a lock on
each of its temporary files: only those nobody holds go). Chunks are kept in memory
for the hops (at most WINDOW bytes ahead of the slowest), so a slow next node does not
slow this one until it falls that far behind.

Answers are JSON lines on stdout, each the fields of a record (``answer_of`` reads
them back): ``Ready`` (with the version), ``HopUp`` or ``HopLost`` (with ssh's words),
``Got`` (a heartbeat every HEARTBEAT s, with the bytes each hop has taken), ``Kept`` or
``Bad`` (a file), ``Stalled``, ``Ended``. The controller's orders on stdin after the
request, read by ``order_of``: ``Drop`` (stop passing on to a hop), ``Reroute`` (end the
current upstream, take the next feed). EOF on stdin before the end: abort, temporary
files removed.
"""

from __future__ import annotations

import array
import bisect
import fcntl
import hashlib
import hmac
import json
import os
import select
import socket
import stat
import subprocess
import sys
import threading
import time
from typing import NamedTuple

from cpuaccel.node.boundedjson import loads
from cpuaccel.node.common import TMP_MARK, create_new
from cpuaccel.node.mux import fast_kex
from cpuaccel.node.nofollow import open_folder, parent_of

TYPE_CHECKING = False
if TYPE_CHECKING:  # only NamedTuple is imported at run time: the node pays for every import
    from typing import IO, Any, BinaryIO, TypeAlias

CHUNK = 1 << 20
F_SETPIPE_SZ = 1031  # fcntl's name for it only from Python 3.10
WINDOW = 64 << 20  # bytes held for the hops before the receiver waits for the slowest
# Where a filesystem takes no locks, a temporary file untouched for this many idle bounds
# is an ended relay's (a relay ends itself after two without a word from the controller).
STALE_IDLES = 3
HEARTBEAT = 0.5
ACCEPT_POLL = 0.2
REQUEST_LIMIT = 1 << 24  # the first line: the file list of a large tree fits
# Anyone on the node can connect to the relay's socket. A feed presents its key as it
# connects; a connection silent for KEY_SECONDS is closed, at most PENDING wait for
# their key at once (a new one past that closes the oldest), and the listening queue
# holds BACKLOG: connections that never send cannot keep a feed from its relay.
KEY_SECONDS = 3.0
PENDING = 64
BACKLOG = 128
# What a feed's own error lines start with (ssh's are ssh's): the controller tells a
# relay that took no stream from a node it could not reach.
FEED_SAYS = "relay feed: "  # FEED's ``m``

# A feed, run as ``python -S -c FEED``: the header line on stdin (``header``'s words),
# then the stream. It connects to the relay, retrying within ``wait`` s (the relay may
# still be starting), and no more once its stdin has no writer left and nothing in it
# (the upstream is gone: so is the feed). It presents the key and hands the relay its
# stdin (SCM_RIGHTS), so that the relay reads the stream straight from ssh: no byte
# passes through the feed. It copies the relay's answer (the offset it wants) to
# stdout, and last the relay's closing line. Its waits are bounded: ``wait`` s for the
# answer, and for the closing line ``wait`` s from the moment its stdin has no writer
# left (the upstream ended); a relay that closes the connection first ends the feed
# with one line.
FEED = """import array,json,os,select,socket,sys,time
h=b""
while h[-1:]!=b"\\n" and len(h)<4096:
 c=os.read(0,1)
 if not c:break
 h+=c
h=h.decode().split();s=socket.socket(socket.AF_UNIX);m="relay feed: "
w=float(h[2]);t=time.monotonic()+w;q=select.poll();q.register(0,select.POLLIN)
while 1:
 try:s.connect("\\0"+h[0]);break
 except OSError:
  if time.monotonic()>t:sys.exit(m+"no relay listening on this node")
  e=dict(q.poll(50)).get(0,0)
  if e==select.POLLHUP:sys.exit(m+"the upstream ended before the relay listened")
  if e:time.sleep(0.05)
b=b""
def line(d):
 global b
 p=select.poll();p.register(s,select.POLLIN);p.register(0,0)
 while b"\\n" not in b:
  r=d-time.monotonic() if d else 1
  if r<=0:raise OSError("no answer in %gs"%w)
  e=dict(p.poll(min(r,1)*1000))
  if e.get(0):p.unregister(0);d=d or time.monotonic()+w
  if e.get(s.fileno()):
   c=s.recv(4096)
   if not c:raise OSError("it ended the connection")
   b+=c
 l,_,b=b.partition(b"\\n");return l+b"\\n"
try:
 s.sendmsg([json.dumps({"key":h[1]}).encode()+b"\\n"],[(socket.SOL_SOCKET,socket.SCM_RIGHTS,array.array("i",[0]))])
 for d in(time.monotonic()+w,None):sys.stdout.buffer.write(line(d));sys.stdout.flush()
except OSError as e:sys.exit(m+"the relay stopped taking the stream: %s"%(e.strerror or e))
"""


VERSION = 1  # of ``Request``: a relay reads its own version only


class RelayFile(NamedTuple):
    """One file of the stream (a JSON list in the request)."""

    rel: str  # '/'-separated, normalised, below the relay's root
    size: int
    sha256: str
    mode: int  # -1: a new file's here, 0o666 less the umask
    keep: bool  # False: only passed on
    mtime_ns: int | None = None  # the kept copy's mtime, or the time it was written


class Hop(NamedTuple):
    """A node the relay passes the stream to."""

    name: str
    command: str  # the quoted remote command of its feed
    socket: str
    key: str


class Request(NamedTuple):
    """What a relay is asked to do: the first line the controller sends it."""

    version: int
    socket: str
    key: str
    root: str
    files: list[RelayFile]
    hops: list[Hop]
    ssh_config: str = ""
    known_hosts: str = ""
    idle: float = 120

    def wire(self) -> dict[str, Any]:
        """The request as its JSON object (each file a list, each hop an object)."""
        return {**self._asdict(), "hops": [hop._asdict() for hop in self.hops]}

    @classmethod
    def read(cls, request: object) -> Request:
        """The request a JSON object says; ValueError naming the first part of it the
        relay will not act on (it checks what it is sent, whoever sends it)."""
        if not isinstance(request, dict):
            raise ValueError("not an object")
        version = request.get("version")
        if version != VERSION:
            raise ValueError(
                f"version {version!r}, where this relay reads {VERSION}: "
                "the controller and the node program must come from the same cpuaccel"
            )
        for word in ("socket", "key", "root"):
            value = request.get(word)
            if not isinstance(value, str) or not value or "\0" in value:
                raise ValueError(f"{word} is not a name")
        files = request.get("files")
        if not isinstance(files, list):
            raise ValueError("files is not a list")
        stream = [_file(f) for f in files]
        hops = request.get("hops", [])
        if not isinstance(hops, list) or not all(
            isinstance(h, dict) and all(isinstance(h.get(k), str) for k in Hop._fields)
            for h in hops
        ):
            raise ValueError("hops is not a list of {name, command, socket, key}")
        idle = request.get("idle", 120)
        if type(idle) not in (int, float) or not 0 < idle < 86400:
            raise ValueError("idle is not a number of seconds")
        return cls(
            VERSION,
            str(request["socket"]),
            str(request["key"]),
            str(request["root"]),
            stream,
            [Hop(*(str(h[k]) for k in Hop._fields)) for h in hops],
            str(request.get("ssh_config", "")),
            str(request.get("known_hosts", "")),
            float(idle),
        )


class Ready(NamedTuple):
    """The relay listens, every hop's ssh started; the version of its records."""

    ready: bool = True
    version: int = VERSION


class HopUp(NamedTuple):
    """A hop's relay took the stream."""

    hop: str
    up: bool = True


class HopLost(NamedTuple):
    """A hop took no stream, or stopped taking it: ``lost`` says why (ssh's words, or
    its feed's, marked FEED_SAYS)."""

    hop: str
    lost: str


class Got(NamedTuple):
    """The heartbeat: the bytes here, and each hop's taken."""

    got: int
    sent: dict[str, int]


class Kept(NamedTuple):
    """A file took its name here, its sha256 the one expected."""

    file: str
    kept: str


class Bad(NamedTuple):
    """A file not kept: it arrived with another sha256 (``bad``), or whole but its name
    could not be given to it (``error``)."""

    file: str
    bad: str
    error: str | None = None


class Ended(NamedTuple):
    """The relay's last word: whether every byte came (and was passed on)."""

    end: bool
    got: int
    sent: dict[str, int] | None = None
    failure: str | None = None  # why the receiver stopped, when it did before the end


class Stalled(NamedTuple):
    """No byte came within the idle bound."""

    stalled: int


class Drop(NamedTuple):
    """The controller's order: stop passing on to hop ``drop`` (it was cut out)."""

    drop: str


class Reroute(NamedTuple):
    """The controller's order: end the current upstream and take the next one."""

    reroute: bool = True


if TYPE_CHECKING:
    Order: TypeAlias = Drop | Reroute


if TYPE_CHECKING:
    Answer: TypeAlias = Ready | HopUp | HopLost | Got | Kept | Bad | Ended | Stalled


def wire(answer: Answer | Order) -> str:
    """An answer (or the controller's order) as its JSON line: an object of the fields
    that are set."""
    return json.dumps({k: v for k, v in answer._asdict().items() if v is not None}) + "\n"


class OtherVersion(ValueError):
    """A relay's records are of another version than the controller's."""


def answer_of(said: dict[str, Any]) -> Answer:
    """The answer a relay's JSON line says; OtherVersion for a Ready of another version,
    ValueError (or TypeError, KeyError) for a line that is no answer of a relay."""
    if said.get("ready"):
        if said.get("version") != VERSION:
            raise OtherVersion(
                f"its relay's records are version {said.get('version')!r}, "
                f"this controller's {VERSION}"
            )
        return Ready()
    if "hop" in said:
        hop = str(said["hop"])
        return HopUp(hop) if said.get("up") else HopLost(hop, str(said.get("lost", "")))
    if "end" in said:
        failure = said.get("failure")
        return Ended(bool(said["end"]), int(said["got"]), said.get("sent"), failure)
    if "got" in said:
        return Got(int(said["got"]), dict(said.get("sent") or {}))
    if "file" in said and "kept" in said:
        return Kept(str(said["file"]), str(said["kept"]))
    if "file" in said:
        error = said.get("error")
        return Bad(str(said["file"]), str(said.get("bad", "")), str(error) if error else None)
    if "stalled" in said:
        return Stalled(int(said["stalled"]))
    raise ValueError("no answer of a relay")


def order_of(said: object) -> Order | None:
    """The order a controller's JSON line says; None for anything else (ignored)."""
    if not isinstance(said, dict):
        return None
    if "drop" in said:
        return Drop(str(said["drop"]))
    if said.get("reroute"):
        return Reroute()
    return None


def _file(f: object) -> RelayFile:
    """One file of a request's list; ValueError naming what is wrong with it."""
    if not isinstance(f, list) or not 5 <= len(f) <= 6:
        raise ValueError(f"a file is not [name, size, sha256, mode, keep, mtime]: {f!r:.80}")
    file = RelayFile(*f)
    why = name_problem(file.rel)
    if why is not None:
        raise ValueError(f"file name {file.rel!r:.200}: {why}")
    whole = all(type(v) is int for v in (file.size, file.mode))
    whole = whole and (file.mtime_ns is None or type(file.mtime_ns) is int)
    typed = isinstance(file.sha256, str) and isinstance(file.keep, bool)
    if not whole or file.size < 0 or not typed:
        raise ValueError(f"file {file.rel!r:.200}: size, sha256, mode, keep or mtime malformed")
    return file


def header(socket_name: str, key: str, wait: float) -> bytes:
    """A feed's first line: the relay's socket, its key and how long to try (hex words)."""
    return f"{socket_name} {key} {wait:g}\n".encode()


class Relay:
    def __init__(self, request: Request) -> None:
        self.request = request
        self.files = request.files
        self.total = sum(f.size for f in self.files)
        self.idle = request.idle
        self.got = 0
        self.lock = threading.Condition()
        self.out = threading.Lock()
        # What the hops have yet to take: chunks and their offsets in the stream.
        self.chunks: list[memoryview] = []
        self.offsets: list[int] = []
        self.sent: dict[str, int] = {}
        self.hops: dict[str, subprocess.Popen[bytes]] = {}
        self.dropped: set[str] = set()
        self.aborted = False
        self.upstream: socket.socket | None = None
        self.temps: list[tuple[int, str]] = []  # (folder descriptor, temporary name) open now
        # The names kept in each folder (by its relative path), whose leftovers are swept
        # from that folder once, before its first file is written.
        self.unswept: dict[str, set[str]] = {}
        for f in self.files:
            if f.keep:
                parent, _, name = f.rel.rpartition("/")
                self.unswept.setdefault(parent, set()).add(name)
        self.last_word = time.monotonic()
        self.failure = ""
        self.umask = _umask()  # why the receiver stopped, when it did before the end

    # ------------------------------------------------------------- answers
    def say(self, answer: Answer) -> None:
        with self.out:
            sys.stdout.write(wire(answer))
            sys.stdout.flush()

    # ------------------------------------------------------------- hops
    def start_hops(self) -> None:
        if not self.request.hops:
            return
        # ssh closes every descriptor it inherits but 0-2 as it starts, so it reads the
        # files through this process's own (open until the relay ends)
        here = f"/proc/{os.getpid()}/fd"
        # last, so that any key exchange the hosts' own blocks name wins over it
        text = self.request.ssh_config + fast_kex()
        config = _memory_file("ssh_config", text)
        known = _memory_file("known_hosts", self.request.known_hosts)
        for hop in self.request.hops:
            self.start_hop(hop, f"{here}/{config}", f"{here}/{known}")

    def start_hop(self, hop: Hop, config: str, known: str) -> None:
        """One hop's ssh, its config and known keys read from the memory files (the
        command line's UserKnownHostsFile wins over any the config names)."""
        name = hop.name
        argv = ["ssh", "-F", config, "-T", "-x", "-o", "ControlPath=none"]
        argv += ["-o", f"UserKnownHostsFile={known}", name, hop.command]
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            self.say(HopLost(name, f"cannot start ssh: {exc}"))
            self.dropped.add(name)
            return
        try:
            assert proc.stdin is not None
            _widen(proc.stdin.fileno())
            proc.stdin.write(header(hop.socket, hop.key, self.idle))
            proc.stdin.flush()
        except OSError:
            pass  # its end is read below
        self.hops[name] = proc
        self.sent[name] = 0
        threading.Thread(target=self.hop_up, args=(name, proc), daemon=True).start()

    def hop_up(self, name: str, proc: subprocess.Popen[bytes]) -> None:
        """The next relay's answer through the feed (the offset it wants), then pass the
        stream on from there."""
        assert proc.stdout is not None and proc.stdin is not None
        line = proc.stdout.readline()
        try:
            start = int(loads(line)["from"])
        except (ValueError, KeyError, TypeError):
            self.lose(name, proc)
            return
        self.say(HopUp(name))
        try:
            self.forward(name, proc.stdin, start)
            proc.stdin.close()
        except (OSError, ValueError):
            self.lose(name, proc)
            return
        # the next relay's closing line, or the feed's end
        closing = proc.stdout.readline()
        if not closing.strip() and name not in self.dropped:
            self.lose(name, proc)
            return
        self.finish_hop(name)

    def lose(self, name: str, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            proc.kill()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            pass
        why = ""
        if proc.stderr is not None:
            lines = proc.stderr.read().decode(errors="replace").strip().splitlines()
            why = lines[-1] if lines else ""
        with self.lock:
            already = name in self.dropped
            self.dropped.add(name)
            self.lock.notify_all()
        if not already:
            self.say(HopLost(name, why or f"its ssh ended (exit code {proc.returncode})"))

    def finish_hop(self, name: str) -> None:
        with self.lock:
            self.dropped.add(name)
            self.lock.notify_all()

    def forward(self, name: str, stream: IO[bytes], start: int) -> None:
        """Pass the stream from ``start`` to one hop, as it arrives."""
        at = start
        while at < self.total:
            with self.lock:
                while True:
                    if name in self.dropped or self.aborted:
                        return
                    piece = self._piece(at)
                    if piece is not None:
                        break
                    self.lock.wait(HEARTBEAT)
            stream.write(piece)
            stream.flush()
            at += len(piece)
            with self.lock:
                self.sent[name] = at
                self._trim()
                self.lock.notify_all()

    def _piece(self, at: int) -> memoryview | None:
        i = bisect.bisect_right(self.offsets, at) - 1
        if i < 0 or at >= self.got:
            return None
        return self.chunks[i][at - self.offsets[i] :]

    def _trim(self) -> None:
        """Drop the chunks every live hop has taken."""
        live = [self.sent[n] for n in self.hops if n not in self.dropped]
        low = min(live) if live else self.got
        cut = bisect.bisect_right(self.offsets, low) - 1
        if cut > 0:
            del self.chunks[:cut]
            del self.offsets[:cut]
        if self.chunks and self.offsets[0] + len(self.chunks[0]) <= low:
            self.chunks.clear()
            self.offsets.clear()

    def held(self) -> int:
        return self.got - self.offsets[0] if self.offsets else 0

    # ------------------------------------------------------------- the upstream
    def accept(self, gate: Gate) -> tuple[socket.socket, int] | None:
        """The next feed that presented the key (``Gate``), and the stream's descriptor
        it handed over (its stdin), told the offset to send from."""
        deadline = time.monotonic() + self.idle
        while not self.aborted and time.monotonic() < deadline:
            taken = gate.next(ACCEPT_POLL)
            if taken is None:
                continue
            conn, fd = taken
            try:
                with self.lock:
                    conn.sendall(json.dumps({"from": self.got}).encode() + b"\n")
                    self.upstream = conn
            except OSError:  # the feed went meanwhile: the next one
                os.close(fd)
                conn.close()
                continue
            return conn, fd
        return None

    def receive(self, gate: Gate) -> None:
        try:
            self._receive(gate)
        except OSError as exc:
            self.failure = f"{exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else "")
            with self.lock:
                self.aborted = True
                self.lock.notify_all()

    def _receive(self, gate: Gate) -> None:
        """Take the stream from feed after feed until every byte is here."""
        index, done_in_file = 0, 0
        index, current = self.advance(0, None)
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        while self.got < self.total and not self.aborted:
            taken = self.accept(gate)
            if taken is None:
                self.say(Stalled(self.got))
                return
            conn, fd = taken
            _widen(fd)
            try:
                while self.got < self.total and not self.aborted:
                    with self.lock:
                        while self.hops and self.held() > WINDOW and not self.aborted:
                            if all(n in self.dropped for n in self.hops):
                                break
                            self.lock.wait(HEARTBEAT)
                    size = min(CHUNK, self.total - self.got)
                    n = self.read(conn, fd, view[:size])
                    if n == 0:
                        break  # this upstream ended (or was rerouted): take the next one
                    data = memoryview(bytes(view[:n]))
                    pos = 0
                    while pos < n:
                        f = self.files[index]
                        room = f.size - done_in_file
                        part = data[pos : pos + room]
                        if current is not None:
                            current[2].update(part)
                            if current[0] >= 0:
                                _write_all(current[0], part)
                        pos += len(part)
                        done_in_file += len(part)
                        if done_in_file == f.size and current is not None:
                            self.close_file(index, current)
                            index, current = self.advance(index + 1, None)
                            done_in_file = 0
                    with self.lock:
                        if self.hops:
                            self.chunks.append(data)
                            self.offsets.append(self.got)
                        self.got += n
                        self.lock.notify_all()
                    self.last_word = time.monotonic()
                with self.lock:
                    if self.upstream is conn:
                        self.upstream = None
                if self.got >= self.total:
                    conn.sendall(json.dumps({"end": self.got}).encode() + b"\n")
            finally:
                os.close(fd)
                conn.close()

    def read(self, conn: socket.socket, fd: int, into: memoryview) -> int:
        """Bytes of the stream from the feed's descriptor into ``into``; 0 when the
        upstream ended, was rerouted (the feed's connection shut), or gave nothing for
        ``idle`` s."""
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        poller.register(conn, select.POLLIN)  # the feed says nothing more: only its end
        deadline = time.monotonic() + self.idle
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return 0
            ready = dict(poller.poll(left * 1000))
            if ready.get(conn.fileno()):
                return 0
            if ready.get(fd):
                try:
                    return os.readv(fd, [into])
                except BlockingIOError:
                    continue
                except OSError:
                    return 0

    def advance(self, index: int, current: list[Any] | None) -> tuple[int, list[Any] | None]:
        """File ``index`` opened (unless ``current`` is it), empty files kept at once."""
        while index < len(self.files):
            current = current or self.open_file(index)
            if self.files[index].size > 0:
                return index, current
            self.close_file(index, current)
            index, current = index + 1, None
        return index, None

    def reroute(self) -> None:
        with self.lock:
            conn = self.upstream
        if conn is not None:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    # ------------------------------------------------------------- files
    def open_file(self, index: int) -> list[Any]:
        """[descriptor or -1, (folder, name, temporary name), sha256] of file ``index``."""
        rel, keep = self.files[index].rel, self.files[index].keep
        digest = hashlib.sha256()
        if not keep:
            return [-1, None, digest]
        root = open_folder(self.root)
        try:
            way = parent_of(root, rel, create=True)
        finally:
            os.close(root)
        assert way is not None
        folder, name = way
        names = self.unswept.pop(rel.rpartition("/")[0], None)
        if names is not None:
            _remove_stale(folder, names, self.idle * STALE_IDLES)
        temp = "." + name + TMP_MARK + os.urandom(8).hex()
        fd = create_new(temp, 0o600, dir_fd=folder)
        _lock(fd)
        self.temps.append((folder, temp))
        return [fd, (folder, name, temp), digest]

    def close_file(self, index: int, current: list[Any]) -> None:
        rel, _size, sha, mode, keep, mtime = self.files[index]
        if not keep:
            return
        fd, (folder, name, temp), digest = current
        got = digest.hexdigest()
        # the temporary file is closed last: its lock (``_lock``) is held until it is
        # renamed or removed, so that no other relay's sweep takes it meanwhile
        try:
            if got != sha:
                os.unlink(temp, dir_fd=folder)
                self.say(Bad(rel, got))
                return
            os.fchmod(fd, mode & 0o777 if mode >= 0 else 0o666 & ~self.umask)
            if mtime is not None:  # the source's, to the nanosecond: rsync's quick check
                os.utime(fd, ns=(mtime, mtime))
            os.rename(temp, name, src_dir_fd=folder, dst_dir_fd=folder)
            self.say(Kept(rel, got))
        except OSError as exc:
            _unlink_quietly(temp, folder)
            self.say(Bad(rel, got, _standing(folder, name, exc)))
        finally:
            os.close(fd)
            self.temps.remove((folder, temp))
            os.close(folder)

    def remove_temps(self) -> None:
        for folder, temp in list(self.temps):
            _unlink_quietly(temp, folder)

    @property
    def root(self) -> str:
        return self.request.root


class Gate:
    """Takes every connection to the relay's socket as it comes and reads each one's
    first line (the key) and descriptor, all at once by poll, in its own thread: the
    receiver only ever sees feeds that presented the key. A connection that says
    nothing for KEY_SECONDS, or says a wrong key, is closed; past PENDING waiting, the
    oldest is."""

    def __init__(self, server: socket.socket, key: str) -> None:
        self.server = server
        self.key = key.encode()
        self.admitted: list[tuple[socket.socket, int]] = []
        self.ready = threading.Condition()
        self.closed = False
        # descriptor -> [connection, deadline, bytes so far, descriptors passed]
        self.pending: dict[int, list[Any]] = {}
        self.poller = select.poll()

    def next(self, wait: float) -> tuple[socket.socket, int] | None:
        """The first admitted feed, waiting up to ``wait`` s for one."""
        with self.ready:
            if not self.admitted:
                self.ready.wait(wait)
            return self.admitted.pop(0) if self.admitted else None

    def run(self) -> None:
        self.server.setblocking(False)
        self.poller.register(self.server, select.POLLIN)
        try:
            while not self.closed:
                now = time.monotonic()
                for fileno in [f for f, p in self.pending.items() if p[1] <= now]:
                    self._drop(fileno)
                first = min((p[1] for p in self.pending.values()), default=now + ACCEPT_POLL)
                wait = max(0.0, min(first - now, ACCEPT_POLL))
                for fileno, _events in self.poller.poll(wait * 1000):
                    if fileno == self.server.fileno():
                        self._take()
                    elif fileno in self.pending:
                        self._read(fileno)
        except OSError:
            pass  # the socket was closed: the relay is ending
        finally:
            for fileno in list(self.pending):
                self._drop(fileno)

    def close(self) -> None:
        self.closed = True
        with self.ready:
            for conn, fd in self.admitted:
                os.close(fd)
                conn.close()
            self.admitted.clear()

    def _take(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except (BlockingIOError, InterruptedError):
                return
            conn.setblocking(False)
            self.pending[conn.fileno()] = [conn, time.monotonic() + KEY_SECONDS, b"", []]
            self.poller.register(conn, select.POLLIN)
            if len(self.pending) > PENDING:
                self._drop(min(self.pending, key=lambda f: self.pending[f][1]))

    def _read(self, fileno: int) -> None:
        conn, _deadline, line, fds = entry = self.pending[fileno]
        space = socket.CMSG_SPACE(4 * array.array("i").itemsize)
        try:
            data, ancillary, _flags, _ = conn.recvmsg(4096, space)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(fileno)
            return
        for level, kind, given in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                whole = len(given) - len(given) % array.array("i").itemsize
                fds.extend(array.array("i", given[:whole]))
        for extra in fds[1:]:  # the stream's is the first; more would only hold ours
            os.close(extra)
        del fds[1:]
        if not data:
            self._drop(fileno)
            return
        line = entry[2] = line + data
        if b"\n" not in line and len(line) < 4096:
            return
        self.poller.unregister(fileno)
        del self.pending[fileno]
        try:
            given = str(loads(line.split(b"\n", 1)[0])["key"]).encode()
        except (ValueError, KeyError, TypeError):
            given = b""
        if not fds or not hmac.compare_digest(given, self.key):
            _close_all(conn, fds)
            return
        conn.setblocking(True)
        conn.settimeout(10)
        with self.ready:
            if self.closed:
                _close_all(conn, fds[:1])
                return
            self.admitted.append((conn, fds[0]))
            self.ready.notify_all()

    def _drop(self, fileno: int) -> None:
        conn, _deadline, _line, fds = self.pending.pop(fileno)
        try:
            self.poller.unregister(fileno)
        except KeyError:
            pass
        _close_all(conn, fds)


def _close_all(conn: socket.socket, fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)
    conn.close()


def _umask() -> int:
    """This process's umask (read by setting it back at once: no thread runs yet)."""
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def _widen(fd: int) -> None:
    """Let a pipe hold up to a chunk: the relay then takes what ssh wrote in fewer,
    larger reads (the system's limit, or a descriptor that is no pipe, leaves it as it is)."""
    try:
        fcntl.fcntl(fd, F_SETPIPE_SZ, CHUNK)
    except OSError:
        pass


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _memory_file(name: str, text: str) -> int:
    """A file in memory holding ``text`` (memfd: gone with the last descriptor)."""
    fd = os.memfd_create("cpuaccel-relay-" + name)
    data = text.encode()
    while data:
        data = data[os.write(fd, data) :]
    return fd


def _lock(fd: int) -> None:
    """Mark a temporary file as a live relay's: an exclusive flock, which the kernel
    lets go of when the relay ends however it ends (a filesystem without locks: none)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        pass


def _remove_stale(folder: int, names: set[str], age: float) -> None:
    """Remove what an ended relay (killed, its node rebooted) left of ``names`` in
    ``folder``: regular files named as this module names its temporaries that no live
    relay holds (``_lock``), untouched for FRESH s at least (a new one is locked the
    moment after it is made). Where the filesystem has no locks, only one untouched for
    ``age`` s (a live relay writes its file at least every idle bound, or gives up and
    removes it). Each is looked at without following a link: a link, or a file of
    another name, is left as it is."""
    now = time.time()
    with os.scandir(folder) as entries:
        for entry in entries:
            name, mark, tail = entry.name.rpartition(TMP_MARK)
            if not mark or name[1:] not in names or not name.startswith("."):
                continue
            if len(tail) != 16 or tail.strip("0123456789abcdef"):
                continue
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if not stat.S_ISREG(info.st_mode) or now - info.st_mtime < FRESH:
                continue
            try:
                fd = os.open(entry.name, LOOK, dir_fd=folder)
            except OSError:
                continue  # gone, swapped for a link (O_NOFOLLOW), or not ours to read
            try:
                here = os.fstat(fd)
                if not stat.S_ISREG(here.st_mode) or here.st_ino != info.st_ino:
                    continue
                if not _held(fd, now - here.st_mtime > age):
                    _unlink_quietly(entry.name, folder)
            finally:
                os.close(fd)


LOOK = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
FRESH = 2.0


def _held(fd: int, stale: bool) -> bool:
    """Whether a live relay holds this temporary file (its flock); where locks cannot
    be taken, whether it is not ``stale``."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return not stale
    return False


def _standing(folder: int, name: str, exc: OSError) -> str:
    """Why a file could not take its name, saying what stands there when it is no file."""
    try:
        there = os.stat(name, dir_fd=folder, follow_symlinks=False)
    except OSError:
        there = None
    if there is not None and stat.S_ISDIR(there.st_mode):
        return "a folder stands where the file goes"
    return f"{exc.strerror or exc}"


def _unlink_quietly(name: str, folder: int) -> None:
    try:
        os.unlink(name, dir_fd=folder)
    except OSError:
        pass


def _controller(relay: Relay, stdin: BinaryIO) -> None:
    """Requests after the first line; EOF before the end aborts."""
    while True:
        line = stdin.readline(4096)
        if not line:
            with relay.lock:
                if relay.got < relay.total or any(n not in relay.dropped for n in relay.hops):
                    relay.aborted = True
                relay.lock.notify_all()
            relay.reroute()
            for proc in relay.hops.values():
                if proc.poll() is None:
                    proc.kill()
            return
        relay.last_word = time.monotonic()
        try:
            order = order_of(loads(line))
        except ValueError:
            continue
        if isinstance(order, Drop):
            dropped = relay.hops.get(order.drop)
            with relay.lock:
                relay.dropped.add(order.drop)
                relay.lock.notify_all()
            if dropped is not None and dropped.poll() is None:
                dropped.kill()
        elif isinstance(order, Reroute):
            relay.reroute()


def serve(request: Request, stdin: BinaryIO) -> int:
    relay = Relay(request)
    os.makedirs(relay.root, exist_ok=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    gate = Gate(server, request.key)
    try:
        server.bind("\0" + request.socket)
        server.listen(BACKLOG)
        threading.Thread(target=gate.run, daemon=True).start()
        relay.start_hops()
        relay.say(Ready())
        threading.Thread(target=_controller, args=(relay, stdin), daemon=True).start()
        receiver = threading.Thread(target=relay.receive, args=(gate,), daemon=True)
        receiver.start()
        while receiver.is_alive():
            receiver.join(HEARTBEAT)
            with relay.lock:
                sent = {n: relay.sent[n] for n in relay.hops}
            relay.say(Got(relay.got, sent))
            if time.monotonic() - relay.last_word > relay.idle * 2:
                relay.aborted = True  # neither a byte nor a word: the controller is gone
        if relay.aborted or relay.got < relay.total:
            relay.remove_temps()
            relay.say(Ended(False, relay.got, failure=relay.failure))
            return 1
        # every byte is here: pass the rest on (while a hop takes bytes), then end
        moved, before = time.monotonic(), None
        while not relay.aborted and time.monotonic() - moved < relay.idle:
            with relay.lock:
                if all(n in relay.dropped for n in relay.hops):
                    break
                sent = {n: relay.sent[n] for n in relay.hops}
                relay.lock.wait(HEARTBEAT)
            if sent != before:
                moved, before = time.monotonic(), sent
            relay.say(Got(relay.got, sent))
        with relay.lock:
            sent = {n: relay.sent[n] for n in relay.hops}
        relay.say(Ended(True, relay.got, sent))
        return 0
    finally:
        gate.close()
        server.close()
        for proc in relay.hops.values():
            if proc.poll() is None:
                proc.kill()


NAME_LIMIT = 4096


def name_problem(rel: object) -> str | None:
    """Why the relay will not write ``rel`` below its root, or None: a name is a
    '/'-separated path of real names (no empty, '.' or '..' one), relative, without NUL.
    Each folder on its way is then reached by descriptors (nofollow): a link there is
    replaced, never followed, so no name leads out of the root."""
    if not isinstance(rel, str) or not rel:
        return "not a name"
    if "\0" in rel:
        return "it holds a NUL byte"
    if len(rel) > NAME_LIMIT:
        return f"longer than {NAME_LIMIT} characters"
    if rel.startswith("/"):
        return "an absolute name: the relay writes only below its root"
    parts = rel.split("/")
    if ".." in parts:
        return "a '..' in it would lead out of the root"
    if "" in parts or "." in parts:
        return "not a normalised name (an empty or '.' part)"
    return None


def main() -> None:
    # After BOOT's LENGTH (cpuaccel.connectors.programs): the request is stdin's next line.
    stdin = sys.stdin.buffer
    try:
        said = loads(stdin.readline(REQUEST_LIMIT), REQUEST_LIMIT)
        if not isinstance(said, dict):
            raise ValueError("not an object")
    except ValueError as exc:
        print(json.dumps({"error": f"the relay's request was not understood: {exc}"}))
        sys.exit(2)
    try:
        request = Request.read(said)
    except ValueError as exc:
        print(json.dumps({"error": f"the relay's request was refused: {exc}"}))
        sys.exit(2)
    try:
        code = serve(request, stdin)
    except OSError as exc:
        print(json.dumps({"error": f"{exc.strerror or exc}: {exc.filename or ''}".strip(": ")}))
        sys.stdout.flush()
        code = 1
    sys.stdout.flush()
    os._exit(code)
