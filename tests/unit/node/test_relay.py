"""The broadcast relay (cpuaccel/node/relay.py) as the nodes run it: the bundled program
in a real interpreter, fed through the real FEED program over its abstract socket."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cpuaccel import node
from cpuaccel.connectors import programs
from cpuaccel.node.common import TMP_MARK
from cpuaccel.node.relay import (
    ACCEPT_POLL,
    FEED,
    VERSION,
    Bad,
    Drop,
    Ended,
    Got,
    Hop,
    HopLost,
    HopUp,
    Kept,
    OtherVersion,
    Ready,
    RelayFile,
    Request,
    Reroute,
    Stalled,
    answer_of,
    header,
    order_of,
    wire,
)
from tests.unit.node.interpreters import old_python


class Relay:
    """One relay process with no hops, its answers collected as they come."""

    def __init__(
        self,
        root: Path,
        files: list[tuple[str, bytes, bool]],
        tmp: Path,
        python: str = sys.executable,
        mode: int = 0o640,
    ) -> None:
        self.python = python
        self.socket = "cpuaccel-relay-test-" + secrets.token_hex(8)
        self.key = secrets.token_hex(16)
        request = Request(
            VERSION,
            self.socket,
            self.key,
            str(root),
            [
                RelayFile(rel, len(data), hashlib.sha256(data).hexdigest(), mode, keep)
                for rel, data, keep in files
            ],
            [],
            idle=5,
        ).wire()
        argv = programs.argv(python, "relay")
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(node.program("relay") + json.dumps(request).encode() + b"\n")
        self.proc.stdin.flush()
        self.answers: list[dict[str, Any]] = []
        assert json.loads(self.proc.stdout.readline()) == {"ready": True, "version": VERSION}
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.answers.append(json.loads(line))

    def feed(
        self, data: bytes, key: str | None = None, program: str = FEED
    ) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [self.python, "-S", "-c", program],
            input=header(self.socket, key or self.key, 5) + data,
            capture_output=True,
            timeout=30,
        )

    def end(self, close: bool = True) -> int:
        assert self.proc.stdin is not None
        if close:
            self.proc.stdin.close()
        code = self.proc.wait(30)
        self._reader.join(10)
        return code

    def said(self, key: str) -> list[dict[str, Any]]:
        return [a for a in self.answers if key in a]


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "dest"
    folder.mkdir()
    yield folder


def start_feed(socket_name: str, wait: float) -> subprocess.Popen[bytes]:
    """A FEED process told its header (key "k"), its pipes open for the test to drive."""
    feed = subprocess.Popen(
        [sys.executable, "-S", "-c", FEED],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert feed.stdin is not None
    feed.stdin.write(header(socket_name, "k", wait))
    feed.stdin.flush()
    return feed


def temporaries(root: Path) -> list[str]:
    return [str(p) for p in root.rglob("*") if TMP_MARK in p.name]


OLD_PYTHON = old_python()
PYTHONS = [
    pytest.param(sys.executable, id="this-python"),
    pytest.param(
        OLD_PYTHON or "",
        id="python3.8",
        marks=pytest.mark.skipif(OLD_PYTHON is None, reason="no Python 3.8 on this machine"),
    ),
]


@pytest.mark.parametrize("python", PYTHONS)
def test_files_are_kept_in_order_and_passed_over_when_not_kept(
    root: Path, tmp_path: Path, python: str
) -> None:
    one, two, three = os.urandom(3 << 20), b"", os.urandom(1000)
    relay = Relay(
        root,
        [("a/one", one, True), ("b/two", two, True), ("three", three, False)],
        tmp_path,
        python,
    )
    time.sleep(2 * ACCEPT_POLL)  # the relay has waited for a feed more than once
    fed = relay.feed(one + three)
    assert fed.returncode == 0, fed.stderr
    # the feed hears where to start, then the relay's closing line
    assert [json.loads(line) for line in fed.stdout.splitlines()] == [
        {"from": 0},
        {"end": len(one) + len(three)},
    ]
    assert relay.end(close=False) == 0
    assert (root / "a/one").read_bytes() == one
    assert (root / "b/two").read_bytes() == b""
    assert not (root / "three").exists()  # passed over: another node keeps it
    assert (root / "a/one").stat().st_mode & 0o777 == 0o640
    kept = {a["file"]: a["kept"] for a in relay.said("kept")}
    assert kept == {
        "a/one": hashlib.sha256(one).hexdigest(),
        "b/two": hashlib.sha256(b"").hexdigest(),
    }
    assert relay.said("end")[-1]["end"] is True
    assert temporaries(root) == []


def test_the_stream_goes_from_the_feeds_stdin_to_the_relay_not_through_the_feed(
    root: Path, tmp_path: Path
) -> None:
    """The feed hands the relay its stdin: of a stream of 8 MiB, the feed process itself
    reads no more than its start-up and its header."""
    data = os.urandom(8 << 20)
    relay = Relay(root, [("f", data, True)], tmp_path)
    # the feed as it is, then what its process read in all (/proc/self/io's rchar)
    counted = (
        "import atexit,sys\n"
        "atexit.register(lambda: sys.stderr.write(open('/proc/self/io').read()))\n" + FEED
    )
    fed = relay.feed(data, program=counted)
    assert fed.returncode == 0, fed.stderr
    assert relay.end(close=False) == 0
    assert (root / "f").read_bytes() == data
    io = dict(line.split(": ") for line in fed.stderr.decode().splitlines() if ": " in line)
    assert int(io["rchar"]) < 1 << 20, io


def test_a_feed_whose_relay_falls_silent_ends_once_its_upstream_has(tmp_path: Path) -> None:
    """A relay that took the stream's descriptor, answered and then hangs: the feed waits
    while its upstream still writes, and gives up ``wait`` s after that ends."""
    name = "cpuaccel-relay-test-" + secrets.token_hex(8)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind("\0" + name)
    server.listen(1)
    feed = start_feed(name, wait=1)
    assert feed.stdin is not None and feed.stdout is not None
    conn, _ = server.accept()
    conn.settimeout(10)
    _, ancillary, _, _ = conn.recvmsg(4096, socket.CMSG_SPACE(4))
    ((_, kind, given),) = ancillary
    assert kind == socket.SCM_RIGHTS
    os.close(int.from_bytes(given[:4], sys.byteorder))  # the feed's stdin, not read here
    conn.sendall(b'{"from": 0}\n')
    assert json.loads(feed.stdout.readline()) == {"from": 0}
    time.sleep(2)  # past ``wait``: while the upstream is there, the feed waits on
    assert feed.poll() is None
    feed.stdin.close()  # the upstream ended; the relay says nothing
    started = time.monotonic()
    assert feed.wait(10) != 0
    assert 0.5 < time.monotonic() - started < 5
    assert feed.stdout.read() == b""
    assert b"the relay stopped taking the stream" in feed.stderr.read()
    conn.close()
    server.close()


def test_a_file_without_a_mode_gets_a_new_files_mode_there(root: Path, tmp_path: Path) -> None:
    data = os.urandom(1000)
    relay = Relay(root, [("f", data, True)], tmp_path, mode=-1)
    assert relay.feed(data).returncode == 0
    relay.end(close=False)
    umask = os.umask(0o022)  # the relay's, inherited from this process
    os.umask(umask)
    assert (root / "f").stat().st_mode & 0o777 == 0o666 & ~umask


def test_a_feed_whose_upstream_ends_before_any_relay_listens_ends_at_once() -> None:
    """No relay on its socket (its node's relay is gone): the feed retries within
    ``wait``, but not past its upstream, which was all that would have kept it useful."""
    feed = start_feed("cpuaccel-relay-test-" + secrets.token_hex(8), wait=60)
    assert feed.stdin is not None and feed.stderr is not None
    time.sleep(0.5)
    assert feed.poll() is None  # still trying: the relay may be starting
    started = time.monotonic()
    feed.stdin.close()  # the upstream's ssh ended
    assert feed.wait(10) != 0 and time.monotonic() - started < 2
    assert b"the upstream ended before the relay listened" in feed.stderr.read()


def test_a_file_that_arrives_wrong_is_removed_and_said(root: Path, tmp_path: Path) -> None:
    data = os.urandom(1 << 20)
    (root / "big").write_bytes(b"the old content")
    relay = Relay(root, [("big", data, True)], tmp_path)
    wrong = bytearray(data)
    wrong[12345] ^= 0xFF
    assert relay.feed(bytes(wrong)).returncode == 0
    relay.end(close=False)
    assert (root / "big").read_bytes() == b"the old content"  # never replaced
    assert [a["file"] for a in relay.said("bad")] == ["big"]
    assert relay.said("kept") == []
    assert temporaries(root) == []


def test_a_feed_without_the_key_is_refused(root: Path, tmp_path: Path) -> None:
    data = os.urandom(1000)
    relay = Relay(root, [("f", data, True)], tmp_path)
    refused = relay.feed(b"x" * 1000, key="not-the-key")
    assert refused.returncode != 0 or b"from" not in refused.stdout
    assert not (root / "f").exists()
    assert relay.feed(data).returncode == 0  # the right one is still taken
    relay.end(close=False)
    assert (root / "f").read_bytes() == data


def test_a_second_feed_goes_on_from_what_the_first_left(root: Path, tmp_path: Path) -> None:
    data = os.urandom(5 << 20)
    relay = Relay(root, [("f", data, True)], tmp_path)
    first = relay.feed(data[: 2 << 20])  # its upstream ended early
    assert json.loads(first.stdout.splitlines()[0]) == {"from": 0}
    second = relay.feed(b"")  # only to hear where to start
    start = json.loads(second.stdout.splitlines()[0])["from"]
    assert start == 2 << 20
    assert relay.feed(data[start:]).returncode == 0
    relay.end(close=False)
    assert (root / "f").read_bytes() == data


def test_the_controller_gone_before_the_end_leaves_nothing_half_written(
    root: Path, tmp_path: Path
) -> None:
    data = os.urandom(4 << 20)
    relay = Relay(root, [("sub/f", data, True)], tmp_path)
    relay.feed(data[: 1 << 20])
    assert temporaries(root) != []  # the part that came is held under a temporary name
    assert relay.end(close=True) != 0
    assert not (root / "sub/f").exists()
    assert temporaries(root) == []
    assert relay.said("end")[-1] == {"end": False, "got": 1 << 20, "failure": ""}


def test_a_link_on_the_way_is_replaced_never_followed(root: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "f").write_bytes(b"keep me")
    (root / "sub").symlink_to(outside)
    (root / "g").symlink_to(outside / "f")
    data = os.urandom(1000)
    relay = Relay(root, [("sub/f", data, True), ("g", data, True)], tmp_path)
    assert relay.feed(data + data).returncode == 0
    relay.end(close=False)
    assert (outside / "f").read_bytes() == b"keep me"
    assert not (root / "sub").is_symlink() and (root / "sub/f").read_bytes() == data
    assert not (root / "g").is_symlink() and (root / "g").read_bytes() == data


def test_a_request_that_is_not_json_is_one_error_line(tmp_path: Path) -> None:
    argv = programs.argv(sys.executable, "relay")
    done = subprocess.run(
        argv, input=node.program("relay") + b"{not json\n", capture_output=True, timeout=30
    )
    assert done.returncode == 2
    assert "not understood" in json.loads(done.stdout)["error"]
    assert b"Traceback" not in done.stderr


def test_what_a_killed_relay_left_of_a_name_goes_when_that_name_is_written_again(
    root: Path, tmp_path: Path
) -> None:
    data = os.urandom(4 << 20)
    killed = Relay(root, [("sub/f", data, True)], tmp_path)
    killed.feed(data[: 1 << 20])
    killed.proc.kill()  # no chance to remove its temporary file
    killed.end(close=False)
    (left,) = temporaries(root)
    sub = root / "sub"
    live = sub / (".f" + TMP_MARK + "0123456789abcdef")
    live.write_bytes(b"a live relay's: it holds its lock")
    new = sub / (".f" + TMP_MARK + "00000000000000bb")
    new.write_bytes(b"made a moment ago, its lock not taken yet")
    link = sub / (".f" + TMP_MARK + "fedcba9876543210")
    outside = tmp_path / "outside"
    outside.write_bytes(b"keep me")
    link.symlink_to(outside)
    other = sub / (".g" + TMP_MARK + "00000000000000aa")
    other.write_bytes(b"another name's")
    # seconds ago, not three idle bounds (idle: 5 s): whether a relay holds it decides
    moment = time.time() - 10
    for path in (Path(left), live, other):
        os.utime(path, (moment, moment))
    os.utime(link, (moment, moment), follow_symlinks=False)

    with open(live, "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        again = Relay(root, [("sub/f", data, True)], tmp_path)
        assert again.feed(data).returncode == 0
        again.end(close=False)
    assert (sub / "f").read_bytes() == data
    assert not Path(left).exists()
    assert sorted(temporaries(root)) == sorted(str(p) for p in (live, new, link, other))
    assert outside.read_bytes() == b"keep me"


def test_a_folder_where_a_file_goes_is_said_as_such(root: Path, tmp_path: Path) -> None:
    (root / "f").mkdir()
    (root / "f" / "inside").write_bytes(b"the user's")
    data = os.urandom(1000)
    relay = Relay(root, [("f", data, True)], tmp_path)
    assert relay.feed(data).returncode == 0
    relay.end(close=False)
    (bad,) = relay.said("bad")
    assert bad["error"] == "a folder stands where the file goes", bad
    assert (root / "f" / "inside").read_bytes() == b"the user's"
    assert temporaries(root) == []


# ---------------------------------------------------------------- the request


def a_request() -> Request:
    return Request(
        VERSION,
        "cpuaccel-relay-test",
        "k" * 32,
        "/srv/root",
        [
            RelayFile("sub/big", 3 << 20, "ab" * 32, 0o640, True, 1_700_000_000_123_456_789),
            RelayFile("passed-on", 10, "cd" * 32, -1, False),
        ],
        [Hop("node2", "python3 -S -c ...", "cpuaccel-relay-next", "n" * 32)],
        "Host node2\n",
        "node2 ssh-ed25519 AAAA\n",
        7.5,
    )


def test_a_request_reads_back_as_it_was_sent_each_file_a_json_list() -> None:
    sent = a_request()
    line = json.dumps(sent.wire())
    assert json.loads(line)["files"][1] == ["passed-on", 10, "cd" * 32, -1, False, None]
    assert Request.read(json.loads(line)) == sent


@pytest.mark.parametrize("version", [None, 0, VERSION + 1, str(VERSION)])
def test_a_request_of_another_version_is_refused_naming_both(version: object) -> None:
    said = {**a_request().wire(), "version": version}
    if version is None:
        del said["version"]
    with pytest.raises(ValueError, match=f"version {version!r}, where this relay reads {VERSION}"):
        Request.read(said)


def test_the_relay_refuses_another_version_in_one_line_having_made_nothing(
    tmp_path: Path,
) -> None:
    root = tmp_path / "root"
    request = {**a_request()._replace(root=str(root), hops=[]).wire(), "version": VERSION + 1}
    done = subprocess.run(
        programs.argv(sys.executable, "relay"),
        input=node.program("relay") + json.dumps(request).encode() + b"\n",
        capture_output=True,
        timeout=30,
    )
    assert done.returncode == 2, done
    lines = done.stdout.decode().splitlines()
    assert len(lines) == 1 and b"Traceback" not in done.stderr, (lines, done.stderr)
    error = json.loads(lines[0])["error"]
    assert error.startswith("the relay's request was refused: version 2, where this relay reads 1")
    assert not root.exists()


# ---------------------------------------------------------------- the answers

ANSWERS = [
    Ready(),
    HopUp("node2"),
    HopLost("node2", "ssh: connect to host node2 port 22: Connection refused"),
    Got(3 << 20, {"node2": 1 << 20}),
    Kept("sub/big", "ab" * 32),
    Bad("sub/big", "cd" * 32),
    Bad("sub/big", "ab" * 32, "a folder stands where the file goes"),
    Ended(True, 3 << 20, {"node2": 3 << 20}),
    Ended(False, 1 << 20, failure=""),
    Stalled(1 << 20),
]


@pytest.mark.parametrize("said", ANSWERS, ids=lambda a: type(a).__name__)
def test_an_answer_reads_back_as_the_relay_said_it(said: Any) -> None:
    line = wire(said)
    assert line.endswith("\n") and "\n" not in line[:-1]
    assert answer_of(json.loads(line)) == said


def test_an_ended_relay_says_only_the_fields_it_has() -> None:
    line = wire(Ended(False, 1 << 20, failure=""))
    assert json.loads(line) == {"end": False, "got": 1 << 20, "failure": ""}


@pytest.mark.parametrize("order", [Drop("node3"), Reroute()], ids=lambda o: type(o).__name__)
def test_an_order_of_the_controller_reads_back_as_it_was_sent(order: Any) -> None:
    line = wire(order)
    assert line.endswith("\n") and "\n" not in line[:-1]
    assert order_of(json.loads(line)) == order


@pytest.mark.parametrize("said", [None, [], "drop", {}, {"reroute": False}, {"got": 1}])
def test_a_line_that_is_no_order_is_ignored(said: Any) -> None:
    assert order_of(said) is None


def test_a_ready_of_another_version_is_refused_naming_both() -> None:
    with pytest.raises(OtherVersion, match=f"records are version 2, this controller's {VERSION}"):
        answer_of({"ready": True, "version": 2})
    with pytest.raises(OtherVersion, match="records are version None"):
        answer_of({"ready": True})


def test_a_line_no_relay_says_is_refused() -> None:
    with pytest.raises(ValueError, match="no answer of a relay"):
        answer_of({"hello": 1})
