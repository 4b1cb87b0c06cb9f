"""The test bed's delaying TCP relay (testsupport/relay.py): it forwards bytes
intact both ways, holds each chunk for its delay, and ends cleanly by its pid."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from testsupport.relay import Relay, parse_route, relayed_known_hosts


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def echo_port() -> Iterator[int]:
    """A server that echoes each connection's bytes back, reversed per chunk's order kept."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def serve_one(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=serve_one, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield port
    server.close()


def _round_trip(port: int, payload: bytes) -> tuple[bytes, float]:
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sender = threading.Thread(target=sock.sendall, args=(payload,))
        sender.start()
        got = bytearray()
        while len(got) < len(payload):
            chunk = sock.recv(65536)
            if not chunk:
                break
            got += chunk
        sender.join()
    return bytes(got), time.monotonic() - started


def test_forwards_bytes_intact_both_ways(echo_port: int) -> None:
    payload = os.urandom(3 * 1024 * 1024 + 17)  # many chunks, and a ragged end
    port = _free_port()
    with Relay.start([(port, "127.0.0.1", echo_port)], "127.0.0.1", 0.0):
        got, _ = _round_trip(port, payload)
    assert got == payload


def test_adds_the_delay_each_way(echo_port: int) -> None:
    port = _free_port()
    with Relay.start([(port, "127.0.0.1", echo_port)], "127.0.0.1", 0.1):
        got, elapsed = _round_trip(port, b"ping")
    assert got == b"ping"
    assert elapsed >= 0.2  # 0.1 s there and 0.1 s back: a lower bound, never flaky


def test_several_routes_reach_their_own_targets(echo_port: int) -> None:
    second = socket.create_server(("127.0.0.1", 0))  # accepts, never answers
    ports = [_free_port(), _free_port()]
    routes = [(ports[0], "127.0.0.1", echo_port), (ports[1], "127.0.0.1", second.getsockname()[1])]
    with Relay.start(routes, "127.0.0.1", 0.0):
        assert _round_trip(ports[0], b"one")[0] == b"one"
        with socket.create_connection(("127.0.0.1", ports[1]), timeout=5) as sock:
            sock.sendall(b"x")
            conn, _ = second.accept()
            assert conn.recv(1) == b"x"
            conn.close()
    second.close()


def test_ends_cleanly_by_pid_with_connections_open(echo_port: int) -> None:
    port = _free_port()
    relay = Relay.start([(port, "127.0.0.1", echo_port)], "127.0.0.1", 0.0)
    held = socket.create_connection(("127.0.0.1", port), timeout=5)
    pid = relay.proc.pid
    assert relay.stop() == 0  # SIGTERM honoured: no SIGKILL needed
    assert not Path(f"/proc/{pid}").exists() or relay.proc.poll() is not None
    held.settimeout(5)
    assert held.recv(1) == b""  # the relay's side of the connection is closed
    held.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_a_busy_port_fails_the_start() -> None:
    busy = socket.create_server(("127.0.0.1", 0))
    with pytest.raises(RuntimeError, match="relay did not start"):
        Relay.start([(busy.getsockname()[1], "127.0.0.1", 22)], "127.0.0.1", 0.0)
    busy.close()


def test_parse_route_refuses_bad_text() -> None:
    assert parse_route("30001=10.0.0.1:22") == (30001, "10.0.0.1", 22)
    for bad in ("30001", "x=10.0.0.1:22", "30001=10.0.0.1", "30001=:22"):
        with pytest.raises(ValueError, match="LISTENPORT=HOST:PORT"):
            parse_route(bad)


def test_known_hosts_names_each_key_at_the_relay(tmp_path: Path) -> None:
    source = tmp_path / "known_hosts"
    source.write_text("node1,10.0.0.1 ssh-ed25519 AAAA1\nnode2,10.0.0.2 ssh-ed25519 AAAA2\n")
    out = relayed_known_hosts(source, {"node1": 30001}, "10.0.0.254", tmp_path / "kh")
    lines = out.read_text().splitlines()
    assert "[10.0.0.254]:30001 ssh-ed25519 AAAA1" in lines
    assert not any("AAAA2" in line and "[" in line for line in lines)


def test_ends_quietly_with_connections_mid_transfer() -> None:
    """SIGTERM with open connections: exit 0, no asyncio complaint on stderr."""
    server = socket.create_server(("127.0.0.1", 0))
    port = _free_port()
    argv = [sys.executable, "-m", "testsupport.relay", "--listen", "127.0.0.1"]
    argv += ["--delay-ms", "1", f"{port}=127.0.0.1:{server.getsockname()[1]}"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    clients = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(4)]
    accepted = [server.accept()[0] for _ in clients]
    for client in clients:
        client.sendall(b"x")
    assert all(conn.recv(1) == b"x" for conn in accepted)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=10)
    assert (proc.returncode, err) == (0, "")
    for sock in [*clients, *accepted, server]:
        sock.close()


def test_refuses_a_bad_delay_on_its_command_line() -> None:
    argv = [sys.executable, "-m", "testsupport.relay", "--listen", "127.0.0.1"]
    proc = subprocess.run([*argv, "--delay-ms", "-1", "1=a:2"], capture_output=True, text=True)
    assert proc.returncode == 2 and "--delay-ms" in proc.stderr
