"""The key exchange a master of check's and sync's OpenSSH connections offers
(connectors/kex.py): sntrup761 left out only where cpuaccel opens the master, the local
ssh has it, and neither ssh_config nor the inventory names a KexAlgorithms."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from cpuaccel.connectors import kex
from cpuaccel.connectors.connect_options import ConnectOptions
from cpuaccel.connectors.openssh_session import OpenSSHConnector
from cpuaccel.inventory.host import Host
from cpuaccel.node import mux

FAST = ["-o", "KexAlgorithms=-sntrup761x25519-sha512*"]


@pytest.fixture(autouse=True)
def home(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A home of its own (short, for the socket's path), with no ~/.ssh/config."""
    folder = Path(tempfile.mkdtemp(prefix="cpxk-", dir="/tmp"))
    monkeypatch.setenv("HOME", str(folder))
    monkeypatch.setattr(kex, "config_may_set", lambda keyword: False)  # no /etc/ssh reading
    monkeypatch.setattr(kex, "_local_ssh_has_sntrup", lambda: True)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_a_master_cpuaccel_opens_leaves_sntrup761_out(tmp_path: Path) -> None:
    assert kex.master_options(Host("n1"), str(tmp_path / "socket")) == FAST


def test_a_master_to_reuse_is_asked_nothing(tmp_path: Path) -> None:
    socket = tmp_path / "socket"
    socket.touch()  # a live master's socket: ssh negotiates nothing
    assert kex.master_options(Host("n1"), str(socket)) == []


def test_the_users_own_choice_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    socket = str(tmp_path / "socket")
    for args in ("-o KexAlgorithms=sntrup761x25519-sha512@openssh.com", "-oKexAlgorithms=x"):
        host = Host("n1", {"ansible_ssh_common_args": args})
        assert kex.master_options(host, socket) == []
    monkeypatch.setattr(kex, "config_may_set", lambda keyword: keyword == "kexalgorithms")
    assert kex.master_options(Host("n1"), socket) == []  # ssh_config says it: ssh decides


def test_an_ssh_without_sntrup761_gets_no_option(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kex, "_local_ssh_has_sntrup", lambda: False)
    assert kex.master_options(Host("n1"), str(tmp_path / "socket")) == []


def test_the_option_is_not_part_of_the_sockets_name() -> None:
    """A master opened with either offer is reused by the next command: the socket's
    name (a hash of the argv) is the same whether the option is in the argv or not."""
    conn = OpenSSHConnector(Host("n1", {"ansible_host": "10.0.0.1"}), ConnectOptions(keep=True))
    argv = conn.ssh_argv()
    assert argv[argv.index(FAST[1]) - 1 : argv.index(FAST[1]) + 1] == FAST
    path = conn.control_path()
    Path(path).touch()  # now a master is there: the next connector's argv has no option
    again = OpenSSHConnector(Host("n1", {"ansible_host": "10.0.0.1"}), ConnectOptions(keep=True))
    assert FAST[1] not in again.ssh_argv() and again.control_path() == path


@pytest.mark.skipif(shutil.which("ssh") is None, reason="no ssh binary")
def test_the_local_ssh_is_asked_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.undo()  # the real question, of the real ssh
    kex._local_ssh_has_sntrup.cache_clear()
    calls: list[str] = []

    def asked(ssh: str) -> bool:
        calls.append(ssh)
        return mux.lists_sntrup761(ssh)

    monkeypatch.setattr(kex, "lists_sntrup761", asked)
    first = kex._local_ssh_has_sntrup()
    assert kex._local_ssh_has_sntrup() is first and calls == ["ssh"]
    kex._local_ssh_has_sntrup.cache_clear()
