"""SSH connector: a Fabric Connection (paramiko) with host keys checked by default.

Fabric opens the connection (ssh_config, gateways, keys) on the port that
``openssh.port_of`` gives; a ProxyJump hop gets the same host-key policy as the node.
Keepalives make a dead node end every read on its connection (``transports``).
Commands are driven on a paramiko channel directly, because we need what Fabric's
``run`` does not give: an EOF after stdin (the fact probe is sent that way), a hard
per-command deadline, and no inline ``export`` of environment values.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import time
from collections.abc import Iterator
from typing import Any, BinaryIO

import paramiko
from fabric import Connection
from paramiko.ssh_exception import NoValidConnectionsError

from cpuaccel import ui
from cpuaccel.connectors import known_keys, openssh, transports
from cpuaccel.connectors.base import (
    Command,
    Connector,
    Process,
    cannot_connect,
    split_lines,
)
from cpuaccel.connectors.connect_options import ConnectOptions
from cpuaccel.connectors.hostkeys import (
    HostKeyPolicy,
    add_key_hint,
    address_and_port,
    forget_key_hint,
    host_key_policy,
    refuse_inline_proxy,
    refuse_unreadable_known_hosts,
)
from cpuaccel.errors import CommandTimeout, HostKeyError, Unreachable

_READ_CHUNK = 1 << 16
# What paramiko raises when a channel or its connection is gone: EOFError, not OSError,
# when its socket closed under it (a node that dropped the connection, e.g. after sudo
# refused a password); uncaught, it would escape a failed become's clean-up and mask
# its error as exit 130 (click takes an EOFError for an aborted prompt).
_CHANNEL_ERRORS = (OSError, paramiko.SSHException, EOFError)


class _RejectUnknownKey(paramiko.MissingHostKeyPolicy):
    """Refuse hosts whose key is not in known_hosts, saying how to trust them."""

    def __init__(self, host_name: str, known_hosts: list[str], what: str = "") -> None:
        self.host_name = host_name
        self.known_hosts = known_hosts
        self.what = what  # "the ProxyJump hop " for a gateway

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: Any) -> None:
        fingerprint = key.fingerprint if hasattr(key, "fingerprint") else key.get_name()
        files = ", ".join(self.known_hosts) or "~/.ssh/known_hosts"
        raise HostKeyError(
            self.host_name,
            f"host key of {self.what}{hostname} is not known ({key.get_name()} "
            f"{fingerprint}; looked in {files})",
            hint=add_key_hint(*address_and_port(hostname)),
        )


class _AcceptAnyKey(paramiko.MissingHostKeyPolicy):
    """Used only when the user turned host key checking off explicitly."""

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: Any) -> None:
        return None


def _reason(exc: BaseException) -> str:
    """The OS's words for a failed connect ("Connection refused"), not paramiko's wrapper."""
    if isinstance(exc, NoValidConnectionsError) and exc.errors:
        exc = next(iter(exc.errors.values()))
    if isinstance(exc, socket.timeout | TimeoutError):
        return "timed out"
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


def _lost(host_name: str, options: ConnectOptions) -> Unreachable:
    return Unreachable(
        host_name,
        "the connection was lost (the node stopped answering, or its sshd ended the "
        f"session; keepalives give up after {options.keepalive_window} s)",
        hint="check that the node is up and its network reachable; its processes may "
        "still run there",
    )


class SSHProcess(Process):
    def __init__(self, chan: paramiko.Channel, host_name: str, options: ConnectOptions) -> None:
        self._chan = chan
        self._host_name = host_name
        self._options = options

    def lines(self) -> Iterator[tuple[str, str]]:
        chan = self._chan
        pending = {"out": b"", "err": b""}
        while True:
            with contextlib.suppress(OSError, ValueError):
                select.select([chan], [], [], 1.0)
            got = False
            for name, ready, recv in (
                ("out", chan.recv_ready, chan.recv),
                ("err", chan.recv_stderr_ready, chan.recv_stderr),
            ):
                while ready():
                    got = True
                    lines, pending[name] = split_lines(pending[name], recv(_READ_CHUNK))
                    for line in lines:
                        yield name, line
            if not got and (chan.eof_received or chan.closed):
                break
        for name, rest in pending.items():
            if rest:
                yield name, rest.decode(errors="replace")

    def wait(self, timeout: float | None = None) -> int:
        chan = self._chan
        if not chan.status_event.wait(timeout):
            raise CommandTimeout(
                self._host_name, f"no exit status {timeout:g} s after the output ended"
            )
        # A dead transport closes its channels, which sets the event with no status.
        if chan.exit_status == -1 and not chan.get_transport().is_active():
            raise _lost(self._host_name, self._options)
        return int(chan.exit_status)

    def send(self, data: bytes) -> None:
        try:
            self._chan.sendall(data)
        except _CHANNEL_ERRORS as exc:
            raise BrokenPipeError(f"the command's input is closed: {exc}") from None

    def close(self) -> None:
        with contextlib.suppress(*_CHANNEL_ERRORS):
            self._chan.close()

    def end_input(self) -> None:
        with contextlib.suppress(*_CHANNEL_ERRORS):
            self._chan.shutdown_write()  # EOF to the command; its output still comes


class SSHConnector(Connector):
    _conn: Connection | None = None

    def _connection(self) -> Connection:
        """Fabric's Connection (not yet open) with the user, key and port of openssh's
        rules: the inventory's, else -u / --private-key, else ssh_config's."""
        host = self.host
        connect_kwargs: dict[str, Any] = {
            "banner_timeout": self.options.connect_timeout,
            "auth_timeout": self.options.connect_timeout,
        }
        key = openssh.key_file(host, self.options)
        if key:
            connect_kwargs["key_filename"] = [os.path.expanduser(key)]
        return Connection(
            host=host.address,
            user=openssh.login_user(host, self.options),
            port=openssh.port_of(host),
            connect_timeout=max(1, round(self.options.connect_timeout)),
            connect_kwargs=connect_kwargs,
            gateway=openssh.gateway_of(host.address),  # ProxyJump's hops in OpenSSH's order
        )

    def connect(self) -> None:
        host = self.host
        refuse_inline_proxy(host)
        conn = self._connection()
        policy = host_key_policy(host, self.options)
        client = paramiko.SSHClient()  # a fresh client: Fabric's auto-adds unknown keys
        self._apply(policy, client)
        conn.client = client
        hops = transports.guard_hops(
            conn, self.options, lambda hop: self._apply(policy, hop, "the ProxyJump hop ")
        )
        started = time.monotonic()
        try:
            transports.open_hops(conn, self.options)
            conn.open()
            transports.keep_alive(conn, self.options)
        except HostKeyError:
            transports.close_hops(conn)
            raise
        except paramiko.BadHostKeyException as exc:
            transports.close_hops(conn)
            # paramiko names the hop it connected to ("[addr]:port" off port 22).
            name = exc.hostname.lstrip("[").split("]")[0]
            what = "the ProxyJump hop " if name in hops else ""
            raise HostKeyError(
                host.name,
                f"host key of {what}{name} has CHANGED since it was recorded "
                f"(got {exc.key.get_name()} {exc.key.fingerprint})",
                hint=forget_key_hint(*address_and_port(exc.hostname)),
            ) from None
        except paramiko.AuthenticationException as exc:
            raise Unreachable(
                host.name,
                f"authentication failed as {conn.user}@{host.address}: {exc}",
                hint="check ansible_user and ansible_ssh_private_key_file (or -u, --private-key)",
            ) from None
        except _CHANNEL_ERRORS as exc:
            transports.close_hops(conn)
            via = f" via ProxyJump {', '.join(hops)}" if hops else ""
            where = f"{host.address}:{conn.port}{via}"
            raise cannot_connect(host, where, _reason(exc)) from None
        self._conn = conn
        took = f"in {time.monotonic() - started:.2f} s"
        ui.detail(1, host.name, f"connected as {conn.user}@{host.address}:{conn.port} {took}")

    def _apply(self, policy: HostKeyPolicy, client: paramiko.SSHClient, what: str = "") -> None:
        """The host-key policy on paramiko's client: known keys loaded read-only, and
        unknown ones refused unless checking is off."""
        if not policy.check:
            client.set_missing_host_key_policy(_AcceptAnyKey())
            return
        # The user's and the system's, read-only; absent or unreadable: ssh skips it too.
        known = [path for path in policy.optional_known_hosts if known_keys.readable(path)]
        if policy.extra_known_hosts:  # parsed below, once a command, not once a host
            refuse_unreadable_known_hosts(self.host.name, policy.extra_known_hosts)
            known.append(policy.extra_known_hosts)
        known_keys.use_host_keys(client, known)
        client.set_missing_host_key_policy(_RejectUnknownKey(self.host.name, known, what))

    def host_key(self) -> str | None:
        transport = self._conn.client.get_transport() if self._conn is not None else None
        if transport is None:
            return None
        key = transport.get_remote_server_key()
        return f"{key.get_name()} {key.get_base64()}"

    def lost(self) -> bool:
        return self._conn is not None and not self._conn.is_connected

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            transports.close_hops(self._conn)
            self._conn = None

    def spawn(self, command: Command) -> Process:
        transport = self._transport()
        try:
            chan = transport.open_session(timeout=self.options.connect_timeout)
            chan.exec_command(command.line)
        except _CHANNEL_ERRORS as exc:
            raise Unreachable(self.host.name, f"cannot start a command: {exc}") from None
        return SSHProcess(chan, self.host.name, self.options)

    def _transport(self) -> paramiko.Transport:
        """The connection's live transport, connecting first; a dead one: lost."""
        if self._conn is None:
            self.connect()
        assert self._conn is not None
        transport: paramiko.Transport | None = self._conn.client.get_transport()
        if transport is None or not transport.is_active():
            raise _lost(self.host.name, self.options)
        return transport

    def execute(
        self, command: Command, stdin: bytes | BinaryIO | None, timeout: float
    ) -> tuple[int, bytes, bytes]:
        transport = self._transport()
        deadline = time.monotonic() + timeout
        try:
            chan = transport.open_session(timeout=self.options.connect_timeout)
            chan.exec_command(command.line)
            self._send(chan, stdin)
            out, err = self._collect(chan, deadline, command, timeout)
            code = chan.recv_exit_status()
            chan.close()
        except _CHANNEL_ERRORS as exc:
            raise Unreachable(
                self.host.name, f"connection lost while running a command: {exc}"
            ) from None
        if code == -1 and not transport.is_active():  # closed by the transport's death
            raise _lost(self.host.name, self.options)
        return code, out, err

    @staticmethod
    def _send(chan: paramiko.Channel, stdin: bytes | BinaryIO | None) -> None:
        try:
            if isinstance(stdin, bytes):
                chan.sendall(stdin)
            elif stdin is not None:
                while chunk := stdin.read(_READ_CHUNK * 4):
                    chan.sendall(chunk)
            chan.shutdown_write()
        except _CHANNEL_ERRORS:
            pass  # the command ended early; its exit status and stderr say why

    def _collect(
        self, chan: paramiko.Channel, deadline: float, command: Command, timeout: float
    ) -> tuple[bytes, bytes]:
        out: list[bytes] = []
        err: list[bytes] = []
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                chan.close()
                raise self.timed_out(command, timeout)
            # The channel's fileno is readable when stdout or stderr has data, or at EOF.
            with contextlib.suppress(OSError, ValueError):  # closed under us: loop checks
                select.select([chan], [], [], min(remaining, 1.0))
            while chan.recv_ready():
                out.append(chan.recv(_READ_CHUNK))
            while chan.recv_stderr_ready():
                err.append(chan.recv_stderr(_READ_CHUNK))
            if chan.exit_status_ready() and (chan.eof_received or chan.closed):
                # Drain what arrived between the checks above and the exit status.
                while chan.recv_ready():
                    out.append(chan.recv(_READ_CHUNK))
                while chan.recv_stderr_ready():
                    err.append(chan.recv_stderr(_READ_CHUNK))
                if not chan.recv_ready() and not chan.recv_stderr_ready():
                    return b"".join(out), b"".join(err)
