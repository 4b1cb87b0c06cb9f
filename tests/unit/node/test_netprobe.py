"""The node program ``netprobe`` over loopback, run as the controller ships it: it listens
and says its ports, serves its echo to peers, connects and names what each connection
met (ok, refused, filtered, silent, foreign, a stalled large transfer), refuses requests
it cannot read, and leaves at EOF or after its bound. Faults that need a network of
their own (no route, a real MTU black hole, a firewall) are in
tests/cluster/test_network_doctor.py."""

from __future__ import annotations

import errno
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cpuaccel import node
from cpuaccel.connectors import programs
from cpuaccel.node import netprobe

LOOPBACK = "127.0.0.1"


class Probe:
    """The bundled program started with PORT words, kept open as the controller keeps it."""

    def __init__(self, *ports: int, bound: int = 30) -> None:
        words = [f"--bound={bound}", "--token=t0k3n", *map(str, ports)]
        argv = programs.argv(sys.executable, "netprobe", words)
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(node.program("netprobe"))
        self.proc.stdin.flush()
        self.first = json.loads(self.proc.stdout.readline())

    def ask(self, line: bytes) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line + b"\n")
        self.proc.stdin.flush()
        answer: dict[str, Any] = json.loads(self.proc.stdout.readline())
        return answer

    def connect(self, *targets: tuple[str, int], **limits: float) -> list[dict[str, Any]]:
        payload = json.dumps({"targets": [list(t) for t in targets], **limits})
        answer = self.ask(json.dumps({"words": ["connect"], "payload": payload}).encode())
        results: list[dict[str, Any]] = answer["results"]
        return results

    def close(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return self.proc.wait(10)


@pytest.fixture
def probe() -> Iterator[Probe]:
    started = Probe(0)
    yield started
    if started.proc.poll() is None:
        started.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def lo_mtu() -> int:
    return int(Path("/sys/class/net/lo/mtu").read_text())


def server(handle: Callable[[socket.socket], None]) -> Iterator[int]:
    """A listener on loopback whose every connection ``handle`` serves: a peer that is
    not the probe, or one that stalls."""
    listener = socket.socket()
    listener.bind((LOOPBACK, 0))
    listener.listen(8)
    held: list[socket.socket] = []

    def run() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            held.append(conn)
            handle(conn)

    threading.Thread(target=run, daemon=True).start()
    yield int(listener.getsockname()[1])
    listener.close()
    for conn in held:
        conn.close()


def test_it_listens_says_its_ports_and_its_peer_connects_ok(probe: Probe) -> None:
    port = probe.first["listening"][0]
    assert probe.first["errors"] == [None] and isinstance(port, int) and port > 0
    other = Probe(0)
    try:
        started = time.monotonic()
        [result] = other.connect((LOOPBACK, port))
        assert time.monotonic() - started < 1.0
    finally:
        other.close()
    assert result["status"] == "ok", result
    lo = {"iface": "lo", "mtu": lo_mtu()}
    assert result["local"] == {"address": LOOPBACK, **lo}
    assert result["remote"] == {**lo, "token": "t0k3n"}  # the server's end, and its word


def test_a_closed_port_is_refused_at_once(probe: Probe) -> None:
    [result] = probe.connect((LOOPBACK, free_port()))
    assert result["status"] == "refused" and result["seconds"] < 0.5


def test_a_port_whose_syns_vanish_is_filtered_after_the_connect_timeout(probe: Probe) -> None:
    """A listener whose accept queue is full drops new SYNs, as a firewall's DROP does."""
    with socket.socket() as full:
        full.bind((LOOPBACK, 0))
        full.listen(0)
        port = full.getsockname()[1]
        with socket.create_connection((LOOPBACK, port), 1):  # the queue's one place
            [result] = probe.connect((LOOPBACK, port), connect=0.5)
    assert result["status"] == "filtered", result
    assert 0.5 <= result["seconds"] < 1.0


def test_a_listener_that_never_answers_is_silent(probe: Probe) -> None:
    for port in server(lambda conn: None):
        [result] = probe.connect((LOOPBACK, port), exchange=0.3)
    assert result["status"] == "silent" and result["local"]["iface"] == "lo"


def test_another_program_on_the_port_is_foreign(probe: Probe) -> None:
    for port in server(lambda conn: conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")):
        [result] = probe.connect((LOOPBACK, port))
    assert result["status"] == "foreign", result


def test_a_large_transfer_that_stalls_after_the_small_exchange_is_mtu(probe: Probe) -> None:
    """A peer that answers the small message, then lets no byte back: what an MTU black
    hole looks like from the sending end."""

    def small_only(conn: socket.socket) -> None:
        netprobe.read_line(conn)
        conn.sendall(b"NETPROBE eth0 9000 t\n")

    for port in server(small_only):
        [result] = probe.connect((LOOPBACK, port), transfer=0.5)
    assert result["status"] == "mtu", result
    assert result["remote"] == {"iface": "eth0", "mtu": 9000, "token": "t"}
    assert result["detail"].startswith("0 of 262144 bytes came back")


def test_many_targets_are_tried_at_once_and_answered_in_order(probe: Probe) -> None:
    port = probe.first["listening"][0]
    closed = free_port()
    started = time.monotonic()
    with socket.socket() as full:
        full.bind((LOOPBACK, 0))
        full.listen(0)
        filtered = full.getsockname()[1]
        with socket.create_connection((LOOPBACK, filtered), 1):
            targets = [(LOOPBACK, filtered), (LOOPBACK, port), (LOOPBACK, closed)] * 4
            results = probe.connect(*targets, connect=0.5)
    assert time.monotonic() - started < 1.5  # not one after the other: 4 x 0.5 s
    assert [r["status"] for r in results] == ["filtered", "ok", "refused"] * 4


def test_a_port_in_use_is_said_and_the_others_still_listen() -> None:
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen(1)
        probe = Probe(taken.getsockname()[1], 0)
        try:
            assert probe.first["listening"][0] is None
            assert "in use" in probe.first["errors"][0]
            assert isinstance(probe.first["listening"][1], int)
        finally:
            probe.close()


def test_requests_it_cannot_read_are_refused_in_one_line(probe: Probe) -> None:
    assert "only 'connect'" in probe.ask(b'{"words": ["rm", "-rf"], "payload": ""}')["error"]
    assert "cannot read" in probe.ask(b"[[[")["error"]
    payload = json.dumps({"targets": [[LOOPBACK, 70000]]})
    bad_port = probe.ask(json.dumps({"words": ["connect"], "payload": payload}).encode())
    assert "1..65535" in bad_port["error"]
    payload = json.dumps({"targets": [], "transfer": 3600})
    too_long = probe.ask(json.dumps({"words": ["connect"], "payload": payload}).encode())
    assert "transfer must be" in too_long["error"]
    assert probe.connect() == []  # and it still answers


def test_it_ends_at_eof_and_leaves_its_port_free(probe: Probe) -> None:
    port = probe.first["listening"][0]
    other = Probe(0)
    try:
        assert other.connect((LOOPBACK, port))[0]["status"] == "ok"
    finally:
        other.close()
    assert probe.close() == 0
    # The client closed first: no TIME_WAIT on the server's port, which a job that does
    # not set SO_REUSEADDR could then not listen on.
    with socket.socket() as again:
        again.bind(("", port))


def test_it_leaves_by_itself_after_its_bound_with_its_input_open() -> None:
    started = time.monotonic()
    probe = Probe(0, bound=1)
    assert probe.proc.wait(10) != 0  # SIGALRM's default action
    assert time.monotonic() - started < 5


def test_connect_failures_are_classified_by_their_cause() -> None:
    assert netprobe.classify(ConnectionRefusedError(errno.ECONNREFUSED, "x")) == "refused"
    assert netprobe.classify(TimeoutError("timed out")) == "filtered"
    for code in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        assert netprobe.classify(OSError(code, "x")) == "no route"
    assert netprobe.classify(OSError(errno.EPERM, "x")) == "error"


def test_an_address_names_its_interface_and_mtu() -> None:
    assert netprobe.interface_of(LOOPBACK) == "lo"
    assert netprobe.interface_of("::ffff:127.0.0.1") == "lo"
    assert netprobe.interface_of("192.0.2.77") is None
    assert netprobe.mtu_of("lo") == lo_mtu()
    assert netprobe.mtu_of("no-such-if") is None
