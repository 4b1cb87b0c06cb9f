"""Slow and greedy clients against the real dashboard (``cpuaccel dashboard`` in its own
process, real sockets): sockets that trickle a header byte a second (slowloris) are
closed within the request bound while the owner's page is answered at once; sockets
past the connection bound are closed as they come; a body past the size bound is
refused or cut. The bounds are cpuaccel.dashboard.server's."""

from __future__ import annotations

import re
import select
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from cpuaccel.dashboard.server import BODY_BYTES, MAX_CONNECTIONS, REQUEST_SECONDS, STATIC
from testsupport.command import start_cpuaccel

URL = re.compile(r"dashboard: http://127\.0\.0\.1:(\d+)/\?token=(\S+)")
SLOW = 50  # slowloris sockets
OWNER_SECONDS = 2.0  # the owner's answer while they are connected
SLACK = 2.0  # past REQUEST_SECONDS, for the server's timer and this test's polling


class Dashboard:
    def __init__(self, port: int, token: str) -> None:
        self.port, self.token = port, token

    def ping(self) -> tuple[int, float]:
        """The owner's request (the page's own, with its token): status and seconds."""
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/api/ping", headers={"X-Cpuaccel-Token": self.token}
        )
        started = time.monotonic()
        with urllib.request.urlopen(request, timeout=30) as answer:
            answer.read()
            return answer.status, time.monotonic() - started

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=5)


@pytest.fixture
def dashboard(tmp_path: Path) -> Iterator[Dashboard]:
    proc = start_cpuaccel(
        "dashboard", "--no-browser", "--port", "0", cwd=tmp_path,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        found = None
        deadline = time.monotonic() + 60
        seen = []
        while found is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            seen.append(line)
            found = URL.search(line)
        assert found, "".join(seen)
        yield Dashboard(int(found[1]), found[2])
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def closed_by_peer(sock: socket.socket) -> bool:
    """The server ended the connection (EOF or reset), read without blocking."""
    if not select.select([sock], [], [], 0)[0]:
        return False
    try:
        while sock.recv(65536):
            if not select.select([sock], [], [], 0)[0]:
                return False
    except OSError:
        return True
    return True


class Trickle:
    """Sockets each sending one header byte a second, never ending their headers; when
    the server closed each (seconds after it connected)."""

    def __init__(self, dashboard: Dashboard, count: int) -> None:
        self.socks = []
        self.opened: list[float] = []
        for _ in range(count):
            sock = dashboard.connect()
            sock.sendall(b"GET /api/ping HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            self.socks.append(sock)
            self.opened.append(time.monotonic())
        self.closed: dict[int, float] = {}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.wait(1.0):
            for i, sock in enumerate(self.socks):
                if i in self.closed:
                    continue
                if closed_by_peer(sock):
                    self.closed[i] = time.monotonic() - self.opened[i]
                    continue
                try:
                    sock.send(b"a")
                except OSError:
                    self.closed[i] = time.monotonic() - self.opened[i]

    def stop(self) -> None:
        self.done.set()
        self.thread.join(10)
        for sock in self.socks:
            sock.close()


def test_slowloris_sockets_are_closed_in_time_and_the_owner_is_answered_meanwhile(
    dashboard: Dashboard,
) -> None:
    trickle = Trickle(dashboard, SLOW)
    try:
        time.sleep(1.5)
        assert not trickle.closed  # still connected while the owner asks
        status, took = dashboard.ping()
        assert status == 200 and took < OWNER_SECONDS, (status, took)
        deadline = trickle.opened[-1] + REQUEST_SECONDS + SLACK + 1.0
        while len(trickle.closed) < SLOW and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(trickle.closed) == SLOW, (
            f"{SLOW - len(trickle.closed)} of {SLOW} slow sockets still open "
            f"{REQUEST_SECONDS + SLACK:g} s after they connected"
        )
        assert max(trickle.closed.values()) < REQUEST_SECONDS + SLACK, trickle.closed
    finally:
        trickle.stop()
    status, took = dashboard.ping()
    assert status == 200 and took < OWNER_SECONDS, (status, took)


def test_connections_past_the_bound_are_closed_as_they_come(dashboard: Dashboard) -> None:
    extra = 8
    socks = [dashboard.connect() for _ in range(MAX_CONNECTIONS + extra)]
    try:
        deadline = time.monotonic() + REQUEST_SECONDS / 2
        shut: set[int] = set()
        while len(shut) < extra and time.monotonic() < deadline:
            shut |= {i for i, s in enumerate(socks) if i not in shut and closed_by_peer(s)}
            time.sleep(0.05)
        assert len(shut) >= extra, f"{len(shut)} of {len(socks)} idle connections closed"
    finally:
        for sock in socks:
            sock.close()
    # the idle ones are gone by the request bound: the owner is served again
    time.sleep(REQUEST_SECONDS + SLACK)
    status, took = dashboard.ping()
    assert status == 200 and took < OWNER_SECONDS, (status, took)


def test_a_client_that_reads_none_of_its_answers_is_dropped_in_time(
    dashboard: Dashboard,
) -> None:
    """ASKS pipelined requests for the page's largest file (more than the system's
    socket buffers hold), none of it read for a while: the server drops the connection
    rather than wait on the reader, so that reading afterwards ends short of them all."""
    asks = 120
    path = "/static/vendor/uPlot.iife.min.js"
    size = (STATIC / "vendor" / "uPlot.iife.min.js").stat().st_size
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", dashboard.port))
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode() * asks)
        time.sleep(REQUEST_SECONDS + SLACK)
        sock.settimeout(10)
        got = 0
        try:
            while chunk := sock.recv(1 << 20):
                got += len(chunk)
        except (ConnectionResetError, TimeoutError):
            pass
    assert got < asks * size, f"all {asks} answers ({got} bytes) waited for the reader"


def test_a_declared_body_past_the_bound_is_refused_unread(dashboard: Dashboard) -> None:
    with dashboard.connect() as sock:
        sock.sendall(
            b"POST /api/runs/x/stop HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            + f"X-Cpuaccel-Token: {dashboard.token}\r\n".encode()
            + f"Content-Length: {BODY_BYTES * 100}\r\n\r\n".encode()
        )
        answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]


def test_a_body_sent_on_and_on_ends_its_connection_in_time(dashboard: Dashboard) -> None:
    """A chunked body (no length up front) the server stops reading: the connection is
    closed by the request bound, not held while the client keeps pushing."""
    chunk = b"a" * (16 << 10)
    with dashboard.connect() as sock:
        sock.sendall(
            b"POST /api/runs/x/stop HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            + f"X-Cpuaccel-Token: {dashboard.token}\r\n".encode()
            + b"Transfer-Encoding: chunked\r\n\r\n"
        )
        started = time.monotonic()
        sock.settimeout(0.2)
        ended = None
        while ended is None and time.monotonic() - started < REQUEST_SECONDS + SLACK + 3:
            try:
                sock.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
            except TimeoutError:
                pass  # the server reads no more: its buffers are full
            except OSError:
                ended = time.monotonic() - started
                break
            if closed_by_peer(sock):
                ended = time.monotonic() - started
    assert ended is not None and ended < REQUEST_SECONDS + SLACK, ended
