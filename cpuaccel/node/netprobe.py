"""The node program ``netprobe``: one node's part of the network doctor
(cpuaccel.network.doctor). It listens where a job's peers will connect, and connects
where the job will, and says what each connection met.

Run as ``python -c BOOT LENGTH --bound=SECONDS --token=TOKEN PORT...`` (TOKEN: a word the
controller gave this node's probe alone). It listens on each TCP PORT
(0: a port the kernel picks, as gloo's and MPI's are), on every address, and answers one
line ``{"listening": [PORT or null, ...], "errors": [null or TEXT, ...]}`` in the
words' order. Then, until EOF on stdin or SECONDS after its start (SIGALRM's default
action: it never waits on a controller that is gone):

- it serves the echo protocol below to its peers on those ports, a thread a connection;
- it answers request lines ``{"words": ["connect"], "payload": TEXT}`` (the shape of the
  controller's kept channel, cpuaccel.connectors.programs.Kept.request), TEXT being
  ``{"targets": [[ADDRESS, PORT], ...], "connect": S, "exchange": S, "transfer": S,
  "size": BYTES}``, with ``{"results": [RESULT, ...]}``, the targets tried at once.

The echo protocol, on one connection: the client sends ``NETPROBE SIZE\\n``; the server
answers ``NETPROBE IFACE MTU TOKEN\\n`` (the interface its end of the connection uses,
and its token: the controller tells which node answered, should an address be on
several, as docker0's is), then
echoes SIZE bytes back as they come; the client closes first, so that no connection
leaves the server's port (the job's master port) in TIME_WAIT.

A RESULT says how a connection to one target went (``classify`` and ``try_target``):
``ok``; ``refused`` (a reset: nothing listens, or a firewall's REJECT); ``filtered``
(the connection timed out: a firewall's DROP); ``no route`` (the kernel or a router has
no way there); ``silent`` (connected, but the small message got no answer); ``foreign``
(something that is not this probe answered); ``mtu`` (the small exchange passed, the
large transfer stalled: packets of the interface's full size vanish on the way); or
``error`` (anything else, its text in ``detail``). Each end's interface and MTU come
with it.
"""

from __future__ import annotations

import errno
import json
import os
import select
import signal
import socket
import sys
import threading
import time

from cpuaccel.node.boundedjson import loads

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

BOUND = "--bound="
TOKEN = "--token="
MAGIC = b"NETPROBE"
LINE_LIMIT = 200  # bytes of a protocol line: longer is not this probe
MAX_SIZE = 16 << 20  # the most bytes a peer may ask to have echoed
MAX_TARGETS = 4096
PARALLEL = 64  # targets tried at once
SERVING = 256  # connections served at once; more wait in the listen backlog
REQUEST_LIMIT = 1 << 20  # bytes of a request line

OK = "ok"
REFUSED = "refused"
FILTERED = "filtered"
NO_ROUTE = "no route"
SILENT = "silent"
FOREIGN = "foreign"
MTU = "mtu"
ERROR = "error"
STATUSES = (OK, REFUSED, FILTERED, NO_ROUTE, SILENT, FOREIGN, MTU, ERROR)

_SIOCGIFADDR = 0x8915
_SIOCGIFMTU = 0x8921


# ---------------------------------------------------------------- interfaces


def _ioctl(name: str, request: int) -> bytes | None:
    try:
        import fcntl
        import struct

        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            return fcntl.ioctl(sock.fileno(), request, struct.pack("256s", name.encode()[:15]))
    except (ImportError, OSError):
        return None


def _ipv6_interface(address: str) -> str | None:
    """The interface that holds IPv6 ``address`` (/proc/net/if_inet6)."""
    try:
        packed = socket.inet_pton(socket.AF_INET6, address).hex()
        with open("/proc/net/if_inet6") as f:
            for line in f:
                fields = line.split()
                if len(fields) >= 6 and fields[0] == packed:
                    return fields[5]
    except (OSError, ValueError):
        pass
    return None


def interface_of(address: str) -> str | None:
    """The name of the interface that holds ``address`` (a socket's own end)."""
    if address.startswith("::ffff:") and "." in address:  # IPv4 on a dual-stack socket
        address = address[len("::ffff:") :]
    if ":" in address:
        return _ipv6_interface(address)
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return None
    for name in names:
        raw = _ioctl(name, _SIOCGIFADDR)
        if raw is not None and socket.inet_ntoa(raw[20:24]) == address:
            return name
    return None


def mtu_of(name: str) -> int | None:
    """The MTU of interface ``name``: SIOCGIFMTU, else /sys/class/net/NAME/mtu."""
    import struct

    raw = _ioctl(name, _SIOCGIFMTU)
    if raw is not None:
        return int(struct.unpack("i", raw[16:20])[0])
    try:
        with open(os.path.join("/sys/class/net", os.path.basename(name), "mtu")) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def end_of(sock: socket.socket) -> dict[str, Any]:
    """This end of a connection: its address, interface and that interface's MTU."""
    try:
        address = str(sock.getsockname()[0])
    except OSError:
        return {"address": None, "iface": None, "mtu": None}
    iface = interface_of(address)
    return {"address": address, "iface": iface, "mtu": mtu_of(iface) if iface else None}


# ---------------------------------------------------------------- serving


def listen(port: int) -> socket.socket:
    """A socket listening on ``port`` on every address: IPv6 and IPv4 on one socket where
    the kernel has IPv6, else IPv4 alone. SO_REUSEADDR, as a job's server sets it."""
    try:
        sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("::", port))
        except OSError:
            sock.close()
            raise
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError:
            sock.close()
            raise
    sock.listen(128)
    return sock


def read_line(sock: socket.socket) -> bytes:
    """One line (its newline dropped) of at most LINE_LIMIT bytes, read a byte at a
    time so that nothing after it is taken; b"" when the peer ends or says more."""
    line = b""
    while len(line) <= LINE_LIMIT:
        byte = sock.recv(1)
        if not byte:
            return b""
        if byte == b"\n":
            return line
        line += byte
    return b""


def serve_one(conn: socket.socket, deadline: float, token: bytes) -> None:
    """The echo protocol's server side on one accepted connection."""
    try:
        conn.settimeout(max(0.1, deadline - time.monotonic()))
        words = read_line(conn).split()
        if len(words) != 2 or words[0] != MAGIC or not words[1].isdigit():
            return
        size = min(int(words[1]), MAX_SIZE)
        end = end_of(conn)
        iface = (end["iface"] or "-").encode()
        conn.sendall(b"%s %s %d %s\n" % (MAGIC, iface, end["mtu"] or 0, token))
        while size > 0:
            chunk = conn.recv(min(size, 1 << 16))
            if not chunk:
                return
            conn.sendall(chunk)
            size -= len(chunk)
        conn.recv(1)  # the client's EOF: it closes first (TIME_WAIT stays on its side)
    except OSError:
        pass
    finally:
        conn.close()


def serve(sock: socket.socket, bound: float, slots: threading.Semaphore, token: bytes) -> None:
    """Accept connections on ``sock`` and serve each in a thread of its own."""
    while True:
        try:
            conn, _ = sock.accept()
        except OSError:
            return
        slots.acquire()

        def one(conn: socket.socket = conn) -> None:
            try:
                serve_one(conn, time.monotonic() + bound, token)
            finally:
                slots.release()

        threading.Thread(target=one, daemon=True).start()


# ---------------------------------------------------------------- connecting


def classify(exc: OSError) -> str:
    """The status a failed connect stands for."""
    if isinstance(exc, ConnectionRefusedError):
        return REFUSED
    if isinstance(exc, socket.timeout):
        return FILTERED
    if exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EADDRNOTAVAIL):
        return NO_ROUTE
    return ERROR


def _result(status: str, detail: str, started: float, **more: Any) -> dict[str, Any]:
    found = {"status": status, "detail": detail, "seconds": round(time.monotonic() - started, 3)}
    found.update(more)
    return found


def transfer(sock: socket.socket, size: int, deadline: float) -> int:
    """Send ``size`` bytes and read their echo at the same time (neither side's buffer
    fills while the other waits), until all came back or ``deadline``: the bytes back."""
    sock.setblocking(False)
    data = memoryview(b"\x5a" * size)
    sent = received = 0
    while received < size:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        readable, writable, _ = select.select([sock], [sock] if sent < size else [], [], left)
        try:
            if writable:
                sent += sock.send(data[sent : sent + (1 << 16)])
            if readable:
                chunk = sock.recv(1 << 16)
                if not chunk:
                    break
                received += len(chunk)
        except BlockingIOError:  # select's word was stale: ask again
            continue
    return received


def try_target(address: str, port: int, limits: dict[str, float]) -> dict[str, Any]:
    """Connect to ``address``:``port``, then the small exchange and the large transfer."""
    started = time.monotonic()
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.settimeout(limits["connect"])
        try:
            sock.connect((address, port))
        except OSError as exc:
            status = classify(exc)
            return _result(status, str(exc) or type(exc).__name__, started)
        local = end_of(sock)
        size = int(limits["size"])
        sock.settimeout(limits["exchange"])
        try:
            sock.sendall(b"%s %d\n" % (MAGIC, size))
            answer = read_line(sock).split()
        except socket.timeout:  # noqa: UP041 - an alias of TimeoutError only from 3.10
            return _result(SILENT, "no answer to a small message", started, local=local)
        except OSError as exc:
            return _result(ERROR, f"in the small exchange: {exc}", started, local=local)
        if len(answer) != 4 or answer[0] != MAGIC or not answer[2].isdigit():
            return _result(FOREIGN, "the answer is not this probe's", started, local=local)
        remote = {
            "iface": answer[1].decode("ascii", "replace"),
            "mtu": int(answer[2]) or None,
            "token": answer[3].decode("ascii", "replace"),
        }
        try:
            back = transfer(sock, size, time.monotonic() + limits["transfer"])
        except OSError as exc:
            return _result(ERROR, f"in the transfer: {exc}", started, local=local, remote=remote)
        if back < size:
            detail = f"{back} of {size} bytes came back within {limits['transfer']:g} s"
            return _result(MTU, detail, started, local=local, remote=remote)
        return _result(OK, "", started, local=local, remote=remote)
    finally:
        sock.close()


def connect_all(request: dict[str, Any]) -> dict[str, Any]:
    """Every target of a connect request tried at once (PARALLEL at most); results in
    the targets' order."""
    targets = request.get("targets")
    if not isinstance(targets, list) or len(targets) > MAX_TARGETS:
        raise ValueError(f"targets must be a list of at most {MAX_TARGETS}")
    checked = []
    for target in targets:
        if not (isinstance(target, list) and len(target) == 2 and isinstance(target[0], str)):
            raise ValueError("a target is [ADDRESS, PORT]")
        if not (isinstance(target[1], int) and 0 < target[1] < 65536):
            raise ValueError(f"a target's port must be in 1..65535, not {target[1]!r}")
        checked.append((target[0], target[1]))
    limits = {}
    for key, default, most in (
        ("connect", 1.5, 60),
        ("exchange", 1.0, 60),
        ("transfer", 2.0, 60),
        ("size", 1 << 18, MAX_SIZE),
    ):
        value = request.get(key, default)
        if not isinstance(value, (int, float)) or not 0 < value <= most:
            raise ValueError(f"{key} must be a number in (0, {most}], not {value!r}")
        limits[key] = float(value)
    results: list[Any] = [None] * len(checked)
    slots = threading.Semaphore(PARALLEL)

    def one(index: int) -> None:
        try:
            results[index] = try_target(checked[index][0], checked[index][1], limits)
        except Exception as exc:  # said in the result: one target never hides the others
            results[index] = _result(ERROR, f"{type(exc).__name__}: {exc}", time.monotonic())
        finally:
            slots.release()

    threads = []
    for index in range(len(checked)):
        slots.acquire()
        thread = threading.Thread(target=one, args=(index,), daemon=True)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    return {"results": results}


# ---------------------------------------------------------------- the program


def answer(line: bytes) -> dict[str, Any]:
    """The answer to one request line."""
    try:
        asked = loads(line, REQUEST_LIMIT)
        words = asked["words"]
        if words != ["connect"]:
            return {"error": f"netprobe answers only 'connect', not {words!r}"}
        return connect_all(loads(str(asked.get("payload", "")), REQUEST_LIMIT))
    except (ValueError, KeyError, TypeError) as exc:
        return {"error": f"a request netprobe cannot read: {exc}"}


def main() -> None:
    words = sys.argv[2:]  # after BOOT's LENGTH (cpuaccel.connectors.programs)
    if len(words) < 2 or not words[0].startswith(BOUND) or not words[1].startswith(TOKEN):
        sys.exit(f"netprobe: usage: {BOUND}SECONDS {TOKEN}TOKEN PORT...")
    bound = int(words[0][len(BOUND) :])
    token = words[1][len(TOKEN) :].encode("ascii", "replace")[:64] or b"-"
    if b" " in token or b"\n" in token:
        sys.exit("netprobe: a token is one word")
    signal.alarm(max(1, bound))  # its default action ends the program, threads and all
    listening: list[int | None] = []
    errors: list[str | None] = []
    slots = threading.Semaphore(SERVING)
    for word in words[2:]:
        try:
            sock = listen(int(word))
        except (OSError, ValueError, OverflowError) as exc:
            listening.append(None)
            errors.append(str(exc))
            continue
        listening.append(int(sock.getsockname()[1]))
        errors.append(None)
        threading.Thread(target=serve, args=(sock, bound, slots, token), daemon=True).start()
    out = sys.stdout
    out.write(json.dumps({"listening": listening, "errors": errors}) + "\n")
    out.flush()
    while True:
        line = sys.stdin.buffer.readline(REQUEST_LIMIT + 1)  # the buffer BOOT read from
        if not line:
            return
        out.write(json.dumps(answer(line)) + "\n")
        out.flush()
