"""The broadcast relay (cpuaccel/node/relay.py) against what others on its node, or a
forged request, can send it: the real program in a real interpreter, over its abstract
socket. Connections that never send do not hold a feed back; names that would lead out
of its root are refused by the relay itself, in one error line, before anything is
written."""

from __future__ import annotations

import array
import contextlib
import hashlib
import json
import os
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cpuaccel import node
from cpuaccel.connectors import programs
from cpuaccel.node.relay import (
    FEED,
    KEY_SECONDS,
    VERSION,
    RelayFile,
    Request,
    header,
    name_problem,
)
from tests.unit.node.test_relay import Relay

SILENT = 12  # connections that never send a byte


def test_connections_that_never_send_do_not_hold_a_feed_back(tmp_path: Path) -> None:
    root = tmp_path / "dest"
    root.mkdir()
    data = os.urandom(1 << 20)
    relay = Relay(root, [("f", data, True)], tmp_path)
    silent = []
    try:
        for _ in range(SILENT):
            sock = socket.socket(socket.AF_UNIX)
            try:
                sock.connect("\0" + relay.socket)
            except ConnectionRefusedError:  # its listening queue is full
                sock.close()
                break
            silent.append(sock)
        started = time.monotonic()
        fed = relay.feed(data)  # the feed tries for 5 s, as its header says
        took = time.monotonic() - started
        assert fed.returncode == 0, fed.stderr
        assert took < 2.0, took
        assert len(silent) == SILENT  # every one was taken, none refused
        # the silent ones are closed by the relay once their time for the key is up
        time.sleep(KEY_SECONDS + 1.0)
        for sock in silent:
            sock.settimeout(1.0)
            assert sock.recv(1) == b""
    finally:
        for sock in silent:
            sock.close()
    relay.end(close=False)
    assert (root / "f").read_bytes() == data


def test_descriptors_passed_before_a_key_are_not_held(tmp_path: Path) -> None:
    """A connection that passes descriptors message after message, never ending its
    first line: the relay keeps at most one of them (a feed passes one: its stdin)."""
    root = tmp_path / "dest"
    root.mkdir()
    relay = Relay(root, [("f", b"waits for its feed", True)], tmp_path)
    before = len(os.listdir(f"/proc/{relay.proc.pid}/fd"))
    read, write = os.pipe()
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect("\0" + relay.socket)
            fds = array.array("i", [read, write, read, write])
            for _ in range(200):
                sock.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
            time.sleep(1.0)
            held = len(os.listdir(f"/proc/{relay.proc.pid}/fd")) - before
        assert held <= 4, f"the relay holds {held} more descriptors"
    finally:
        os.close(read)
        os.close(write)
        relay.end()


# ---------------------------------------------------------------- names


def start(root: Path, names: list[str], data: bytes) -> tuple[int, list[str], bytes]:
    """A relay told to write ``data`` at each of ``names`` below root, then fed the
    stream with its real key (as the controller and the hops do) when it says ready;
    its exit code, answer lines and stderr."""
    sha = hashlib.sha256(data).hexdigest()
    request = Request(
        VERSION,
        "cpuaccel-relay-test-" + secrets.token_hex(8),
        secrets.token_hex(16),
        str(root),
        [RelayFile(rel, len(data), sha, 0o644, True) for rel in names],
        [],
        idle=5,
    )
    proc = subprocess.Popen(
        programs.argv(sys.executable, "relay"),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    proc.stdin.write(node.program("relay") + json.dumps(request.wire()).encode() + b"\n")
    proc.stdin.flush()
    first = proc.stdout.readline()
    if b"ready" in first:
        subprocess.run(
            [sys.executable, "-S", "-c", FEED],
            input=header(request.socket, request.key, 5) + data * len(names),
            capture_output=True,
            timeout=30,
        )
    with contextlib.suppress(BrokenPipeError):
        proc.stdin.close()
    rest = proc.stdout.read()
    code = proc.wait(30)
    return code, (first + rest).decode().splitlines(), proc.stderr.read()


FORGED = [
    pytest.param("../outside/f", "would lead out of the root", id="dotdot"),
    pytest.param("sub/../../outside/f", "would lead out of the root", id="dotdot-inside"),
    pytest.param("/OUTSIDE/f", "absolute name", id="absolute"),
    pytest.param("sub/f\0x", "NUL", id="nul"),
    pytest.param("sub//f", "not a normalised name", id="empty-part"),
    pytest.param("./f", "not a normalised name", id="dot"),
    pytest.param("", "not a name", id="empty"),
]


@pytest.mark.parametrize(("rel", "words"), FORGED)
def test_a_name_out_of_the_root_is_refused_by_the_relay_in_one_line(
    tmp_path: Path, rel: str, words: str
) -> None:
    root = tmp_path / "root"
    root.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    rel = rel.replace("/OUTSIDE", str(outside))
    code, lines, stderr = start(root, ["ok", rel], b"payload")
    assert list(outside.iterdir()) == [] and list(root.iterdir()) == []
    assert code == 2, lines
    assert b"Traceback" not in stderr, stderr
    assert len(lines) == 1, lines
    error = json.loads(lines[0])["error"]
    assert "refused" in error and words in error and "file name" in error, error


def test_a_link_in_the_root_leads_nowhere_out_of_it(tmp_path: Path) -> None:
    """A name through a link already in the root: the link is replaced by a folder and
    the file lands below the root; what the link pointed to is untouched."""
    root = tmp_path / "root"
    root.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "f").write_bytes(b"keep me")
    (root / "sub").symlink_to(outside)
    data = os.urandom(1000)
    relay = Relay(root, [("sub/f", data, True)], tmp_path)
    assert relay.feed(data).returncode == 0
    relay.end(close=False)
    assert (outside / "f").read_bytes() == b"keep me"
    assert not (root / "sub").is_symlink() and (root / "sub/f").read_bytes() == data


PARTS = st.sampled_from(["a", "b.txt", ".", "..", "", "\0", "..a", "a..", "...", " "])


@given(st.lists(PARTS, min_size=1, max_size=6), st.booleans())
def test_a_name_is_taken_only_when_it_stays_below_the_root(parts: list[str], slash: bool) -> None:
    rel = ("/" if slash else "") + "/".join(parts)
    # an oracle of another kind: the path's own normal form, joined to a root
    below = (
        "\0" not in rel
        and os.path.normpath(rel) == rel
        and os.path.normpath(os.path.join("/root", rel)).startswith("/root/")
    )
    assert (name_problem(rel) is None) == below, rel
