"""The paramiko connector's processes (connectors/ssh.py): a process whose connection died
names its node, a channel whose socket closed closes quietly, waiting for an exit status
is bounded; and a proxy in ansible_ssh_common_args is refused before any connection."""

from __future__ import annotations

import threading
import time
from typing import cast

import paramiko
import pytest

from cpuaccel.connectors.connect_options import ConnectOptions
from cpuaccel.connectors.local import LocalConnector
from cpuaccel.connectors.ssh import SSHConnector, SSHProcess
from cpuaccel.errors import CommandTimeout, Unreachable
from cpuaccel.inventory.host import Host

pytestmark = pytest.mark.usefixtures("home")

CHECKED = ConnectOptions()


class _FakeTransport:
    def __init__(self, active: bool) -> None:
        self.active = active

    def is_active(self) -> bool:
        return self.active


class _FakeChannel:
    """What SSHProcess.wait reads of a paramiko channel."""

    def __init__(self, status: int | None, transport_active: bool) -> None:
        self.status_event = threading.Event()
        self.exit_status = -1
        if status is not None:
            self.exit_status = status
            self.status_event.set()
        self._transport = _FakeTransport(transport_active)

    def get_transport(self) -> _FakeTransport:
        return self._transport


def test_a_process_whose_connection_died_names_its_node() -> None:
    # A dead transport closes its channels: the status event is set, with no status.
    chan = _FakeChannel(None, transport_active=False)
    chan.status_event.set()
    proc = SSHProcess(cast(paramiko.Channel, chan), "node2", CHECKED)
    with pytest.raises(Unreachable, match=r"^node2: the connection was lost") as info:
        proc.wait(1)
    assert f"after {CHECKED.keepalive_window} s" in str(info.value)
    # Killed by a signal on a live connection: no status either, but not a lost node.
    chan = _FakeChannel(None, transport_active=True)
    chan.status_event.set()
    assert SSHProcess(cast(paramiko.Channel, chan), "node2", CHECKED).wait(1) == -1
    chan = _FakeChannel(3, transport_active=True)
    assert SSHProcess(cast(paramiko.Channel, chan), "node2", CHECKED).wait(1) == 3


class _DeadChannel(_FakeChannel):
    """A channel whose transport's socket closed under it: paramiko raises EOFError."""

    def close(self) -> None:
        raise EOFError

    def sendall(self, data: bytes) -> None:
        raise EOFError


def test_a_channel_whose_socket_closed_closes_quietly_and_refuses_input() -> None:
    """A failed sudo's clean-up closes the agent's channel on a connection the node had
    dropped: paramiko's EOFError escaped, masking the become error as exit 130."""
    proc = SSHProcess(cast(paramiko.Channel, _DeadChannel(None, False)), "node2", CHECKED)
    proc.close()
    with pytest.raises(BrokenPipeError, match="input is closed"):
        proc.send(b"x")


def test_waiting_for_an_exit_status_is_bounded() -> None:
    chan = _FakeChannel(None, transport_active=True)
    proc = SSHProcess(cast(paramiko.Channel, chan), "node2", CHECKED)
    started = time.monotonic()
    with pytest.raises(CommandTimeout, match=r"^node2: no exit status 0.2 s"):
        proc.wait(0.2)
    assert time.monotonic() - started < 2
    local = LocalConnector(Host("localhost", {"ansible_connection": "local"}), CHECKED)
    waiting = local.start(["cat"])  # ends when its stdin closes
    try:
        with pytest.raises(CommandTimeout, match=r"^localhost: no exit status"):
            waiting.wait(0.2)
    finally:
        waiting.close()
    assert waiting.wait(10) == 0


@pytest.mark.parametrize("option", ["ProxyJump=jump", "ProxyCommand=nc %h %p"])
def test_a_proxy_in_ansible_ssh_args_is_refused_naming_the_host(option: str) -> None:
    host = Host("n1", {"ansible_host": "192.0.2.1", "ansible_ssh_common_args": f"-o '{option}'"})
    with pytest.raises(Unreachable, match=r"^n1: .* in ansible_ssh_common_args is not supported"):
        SSHConnector(host, CHECKED).connect()  # refused before any connection
