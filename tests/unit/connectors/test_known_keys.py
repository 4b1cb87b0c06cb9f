"""known_hosts parsed once a command (connectors/known_keys.py), not once a host: the
same file gives the same shared keys, a changed file is read again, and a client sees
the keys as after paramiko's own load."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import paramiko
import pytest

from cpuaccel.connectors import known_keys, known_lines


def _key_line(name: str) -> str:
    key = paramiko.Ed25519Key.generate() if hasattr(paramiko.Ed25519Key, "generate") else None
    if key is None:  # paramiko cannot generate ed25519: an RSA key does as well here
        rsa = paramiko.RSAKey.generate(1024)
        return f"{name} {rsa.get_name()} {rsa.get_base64()}"
    return f"{name} {key.get_name()} {key.get_base64()}"


@pytest.fixture
def known_hosts(tmp_path: Path) -> Path:
    path = tmp_path / "known_hosts"
    path.write_text(_key_line("node1,10.0.0.1") + "\n" + _key_line("node2,10.0.0.2") + "\n")
    return path


def test_a_file_is_parsed_once_while_it_stays_the_same(known_hosts: Path) -> None:
    first = known_keys.shared_host_keys([str(known_hosts)])
    assert known_keys.shared_host_keys([str(known_hosts)]) is first
    assert first.lookup("node2") is not None and first.lookup("10.0.0.1") is not None


def test_a_changed_file_is_read_again(known_hosts: Path) -> None:
    before = known_keys.shared_host_keys([str(known_hosts)])
    known_hosts.write_text(known_hosts.read_text() + _key_line("node3") + "\n")
    stat = known_hosts.stat()
    os.utime(known_hosts, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    after = known_keys.shared_host_keys([str(known_hosts)])
    assert after is not before
    assert after.lookup("node3") is not None and before.lookup("node3") is None


def test_a_client_sees_what_paramikos_own_load_gives(known_hosts: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.write_text(_key_line("node9") + "\n")
    paths = [str(known_hosts), str(other)]
    ours, theirs = paramiko.SSHClient(), paramiko.SSHClient()
    known_keys.use_host_keys(ours, paths)
    for path in paths:
        theirs.load_system_host_keys(path)
    for name in ("node1", "10.0.0.2", "node9", "node4"):
        mine = ours._system_host_keys.lookup(name)
        want = theirs._system_host_keys.lookup(name)
        assert (dict(mine) if mine else None) == (dict(want) if want else None)


def test_an_unreadable_file_raises_and_readable_says_so(tmp_path: Path) -> None:
    missing = str(tmp_path / "absent")
    assert not known_keys.readable(missing)
    with pytest.raises(OSError):
        known_keys.must_read(missing)
    with pytest.raises(OSError):
        known_keys.shared_host_keys([missing])


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_a_known_hosts_that_is_no_file_is_refused_without_waiting(
    tmp_path: Path, kind: str
) -> None:
    # A FIFO named as known_hosts once hung paramiko's open (and would hang ssh's read)
    # until someone wrote to it: it is refused before anything reads it.
    path = tmp_path / "known_hosts"
    os.mkfifo(path) if kind == "fifo" else path.mkdir()
    said = "a FIFO (named pipe)" if kind == "fifo" else "a directory"
    signal.alarm(10)  # a regression would block here: fail, do not hang the suite
    try:
        with pytest.raises(OSError, match=rf"it is {re.escape(said)}, not a regular file"):
            known_keys.must_read(str(path))
        assert not known_keys.readable(str(path))
        assert known_lines.trusted_keys("node1", [str(path)]) == []
    finally:
        signal.alarm(0)
