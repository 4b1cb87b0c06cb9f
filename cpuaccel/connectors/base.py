"""What every connector offers: everything about reaching one host.

A connector runs commands on its host and collects their results, pushes trees to it
with rsync, and gives the ssh argv for the tools that start ``ssh`` themselves (MPI's
launcher), with the host-key policy of connectors/hostkeys.py throughout.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import BinaryIO

from cpuaccel.connectors import openssh
from cpuaccel.connectors.rsync import RsyncResult
from cpuaccel.errors import HostError
from cpuaccel.inventory.host import Host
from cpuaccel.inventory.variables import parse_bool

DEFAULT_CONNECT_TIMEOUT = 10.0  # seconds, as Ansible's and pdsh's defaults
DEFAULT_COMMAND_TIMEOUT = 120.0
# Keepalives, one pair for paramiko and OpenSSH (ServerAliveInterval/CountMax): sshd
# answers them itself, so a busy rank cannot delay one. A node is given up after 3
# unanswered 5-second probes: that rides out a brief blip (a switch port flapping) yet
# ends a run on a dead node in about 20 s, not after TCP's 15-minute retransmissions.
KEEPALIVE_INTERVAL = 5
KEEPALIVE_COUNT = 3


class Unreachable(HostError):
    """The host could not be connected to or authenticated against."""


class HostKeyError(Unreachable):
    """The host's key is unknown or changed: connecting could hand secrets to an impostor."""


def refuse_unreadable_known_hosts(host_name: str, path: str | None) -> None:
    """The inventory's own known_hosts file (cpuaccel_known_hosts, UserKnownHostsFile)
    must be a readable regular file, for paramiko and ssh alike: a missing one would
    turn every key into an unknown one, and a FIFO would hang whoever opens it."""
    if not path:
        return
    from cpuaccel.connectors.known_lines import open_regular

    try:
        os.close(open_regular(path))
    except OSError as exc:
        raise Unreachable(
            host_name,
            f"cannot read known_hosts file {path}: {exc.strerror}",
            hint="fix cpuaccel_known_hosts / UserKnownHostsFile in the inventory",
        ) from None


class CommandTimeout(HostError):
    """A command did not finish within its timeout."""


@dataclass(frozen=True)
class ConnectOptions:
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    command_timeout: float = DEFAULT_COMMAND_TIMEOUT
    # None: each host's own setting (checked unless the inventory turns it off).
    host_key_checking: bool | None = None
    keepalive_interval: int = KEEPALIVE_INTERVAL  # seconds between probes
    keepalive_count: int = KEEPALIVE_COUNT  # unanswered probes before the node is lost
    # -u/--user and --private-key: Ansible's command-line values, which (as in Ansible)
    # sit below every variable: a host's ansible_user / ansible_ssh_private_key_file
    # (inventory or -e) wins, and these fill in where none is set (openssh.login_user).
    user: str | None = None
    private_key: str | None = None
    # Set by the verbs whose connections may be OpenSSH masters kept across commands
    # (check, sync): connector_for decides which hosts get one.
    keep: bool = False

    @property
    def keepalive_window(self) -> int:
        """Seconds of silence after which a connection counts as dead."""
        return self.keepalive_interval * self.keepalive_count


@dataclass(frozen=True)
class CommandResult:
    host: str
    command: str
    exit_code: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class Process(abc.ABC):
    """A command started on a host and still running: read its lines, then its status."""

    @abc.abstractmethod
    def lines(self) -> Iterator[tuple[str, str]]:
        """("out" or "err", line without its newline), until both streams end."""

    @abc.abstractmethod
    def wait(self, timeout: float | None = None) -> int:
        """Wait for the exit status (after lines() is exhausted).

        Raises CommandTimeout past ``timeout``, and Unreachable when the connection died
        before the status came (the process may still run on its node).
        """

    @abc.abstractmethod
    def send(self, data: bytes) -> None:
        """Write to the process's stdin (it stays open for more)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Close stdin and the connection to the process (it learns of it by EOF)."""


def split_lines(pending: bytes, chunk: bytes) -> tuple[list[str], bytes]:
    """Complete lines of pending+chunk, and what is left of an unfinished one."""
    *lines, rest = (pending + chunk).split(b"\n")
    return [line.decode(errors="replace") for line in lines], rest


class Connector(abc.ABC):
    """A connection to one host. Use as a context manager; commands are argv lists."""

    rsync_ok = True  # rsync's protocol runs over it (not through srun: sync sends a tar)
    # True when connect() opens nothing and the first command is what reaches the host
    # and verifies its key (an OpenSSH master, connectors/openssh_session.py).
    opens_lazily = False

    def __init__(self, host: Host, options: ConnectOptions) -> None:
        self.host = host
        self.options = options

    @abc.abstractmethod
    def connect(self) -> None:
        """Open the connection; raises Unreachable (or HostKeyError) with the reason."""

    @abc.abstractmethod
    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | BinaryIO | None = None,
        timeout: float | None = None,
    ) -> CommandResult:
        """Run argv on the host and wait; raises CommandTimeout past the timeout.

        ``stdin`` is sent, then closed: bytes, or a binary file streamed in chunks.
        """

    @abc.abstractmethod
    def start(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> Process:
        """Start argv and return at once; its stdin stays open until Process.close()."""

    @abc.abstractmethod
    def rsync(
        self,
        flags: Sequence[str],
        source: str | list[str],
        dest: str,
        *,
        stdin: bytes | None = None,
        on_line: Callable[[str], None] | None = None,
    ) -> RsyncResult:
        """Push ``source`` (a path on the controller, or several) to ``dest`` on the host with
        ``rsync FLAGS``; its stdout lines go to on_line, or into the result."""

    def ssh_argv(self) -> list[str]:
        """``ssh`` and its options for a tool that starts ssh itself (rsync, MPI's
        ssh.sh): this host's user, port, key and host-key policy."""
        return openssh.ssh_argv(self.host, self.options)

    def failure(self, exit_code: int, stderr: str) -> HostError | None:
        """The connection's own error behind a started command's end (``start`` has no
        result to translate, as ``run`` does); None when the command itself failed."""
        return None

    def host_key(self) -> str | None:
        """The host key this connection verified ("TYPE BASE64"), for the run's own
        known_hosts; None when no ssh is involved."""
        return None

    def lost(self) -> bool:
        """True when this connection was open and has died (keepalives unanswered)."""
        return False

    @abc.abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> Connector:
        self.connect()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


# ansible_connection values reached over ssh (Ansible's spellings; "smart" is ssh).
_SSH_CONNECTIONS = (None, "ssh", "smart")


def keeps_connection(host: Host, options: ConnectOptions) -> bool:
    """Whether ``host`` is reached through the OpenSSH binary on a master kept across
    commands (connectors/openssh_session.py), as Ansible's default ``ssh`` connection.

    Only for the verbs that ask (``options.keep``: check and sync, whose whole cost is
    start-up and handshakes, and which need nothing but commands and rsync). run and
    provision stay on paramiko: run records the key each connection verified for the
    run's own known_hosts (``host_key``), watches its connections die (``lost``) and
    streams a job's output for hours; provision keeps one agent channel a host for the
    whole play, over one handshake already. ``ansible_connection: paramiko`` asks for
    paramiko, and ``cpuaccel_ssh_persist: false`` opts a host out; without an ``ssh``
    binary on PATH, or with a home too long for a socket's path below it, paramiko
    is the only way.
    """
    if not options.keep or host.is_local:
        return False
    if host.vars.get("ansible_connection") not in _SSH_CONNECTIONS:
        return False
    if parse_bool(host.vars.get("cpuaccel_ssh_persist", True)) is False:
        return False  # checked at load (inventory/variables.py): a typo keeps the default
    from cpuaccel.connectors.controlpath import folder_fits
    from cpuaccel.node.common import which  # not shutil's: its import, with bz2 and lzma,
    # cost check's start-up ~5 ms (issue 17)

    return folder_fits() and which("ssh") is not None


def connector_for(host: Host, options: ConnectOptions | None = None) -> Connector:
    """The connector a host's ``ansible_connection`` asks for."""
    options = options or ConnectOptions()
    if host.vars.get("ansible_connection") == "slurm":  # an allocated node: srun, no ssh
        from cpuaccel.connectors.srun import SrunConnector

        return SrunConnector(host, options)
    if host.is_local:
        from cpuaccel.connectors.local import LocalConnector

        return LocalConnector(host, options)
    if keeps_connection(host, options):
        from cpuaccel.connectors.openssh_session import OpenSSHConnector

        return OpenSSHConnector(host, options)
    from cpuaccel.connectors.ssh import SSHConnector

    return SSHConnector(host, options)
