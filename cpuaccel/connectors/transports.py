"""paramiko transports of the SSH connector: ProxyJump hops and keepalives.

A ProxyJump hop (from ssh_config, as ``openssh.gateway_of`` reads it) is a Fabric
Connection of its own, with a client that accepts any host key and no timeouts; these
functions give every hop the node's host-key policy and timeouts, open, watch and close
the chain. A chain is
``conn.gateway``, its ``gateway``, and so on (a ProxyCommand gateway is a string: the
user's own command, left as it is).
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator

import paramiko
from fabric import Connection

from cpuaccel.connectors.connect_options import ConnectOptions


def hops(conn: Connection) -> Iterator[Connection]:
    """The ProxyJump hops in front of ``conn``, the nearest to the node first."""
    gateway = conn.gateway
    while isinstance(gateway, Connection):
        yield gateway
        gateway = gateway.gateway


def guard_hops(
    conn: Connection, options: ConnectOptions, policy: Callable[[paramiko.SSHClient], None]
) -> list[str]:
    """Each hop gets a client with the node's host-key ``policy`` applied, and the node's
    timeouts; a hop's user and key stay its own (ssh_config's), as with OpenSSH.
    Returns the hops' addresses."""
    names: list[str] = []
    for hop in hops(conn):
        client = paramiko.SSHClient()
        policy(client)
        hop.client = client
        hop.connect_timeout = conn.connect_timeout
        timeout = options.connect_timeout
        hop.connect_kwargs.update(banner_timeout=timeout, auth_timeout=timeout)
        names.append(hop.host)
    return names


def open_hops(conn: Connection, options: ConnectOptions) -> None:
    """Open the hops innermost first, each bounding the channel it opens to the next
    machine by the connect timeout (paramiko's default wait is an hour)."""
    for hop in reversed(list(hops(conn))):
        hop.open()  # through the next inner hop, already open
        hop.transport.channel_timeout = options.connect_timeout


def keep_alive(conn: Connection, options: ConnectOptions) -> None:
    """Keepalives on the node's transport and its hops'.

    paramiko's keepalives ask for no answer, so alone they never notice a dead peer;
    but they keep data in flight, and TCP_USER_TIMEOUT then ends a socket whose data
    stays unacknowledged for the keepalive window: the transport closes, and with it
    every channel read on it. (Without TCP_USER_TIMEOUT, off Linux, TCP's own
    retransmission timeout ends it, much later.)
    """
    window_ms = options.keepalive_window * 1000
    for each in (conn, *hops(conn)):
        if each.transport is None:
            continue
        each.transport.set_keepalive(options.keepalive_interval)
        sock = each.transport.sock  # a channel of the next hop, behind a ProxyJump
        if isinstance(sock, socket.socket) and hasattr(socket, "TCP_USER_TIMEOUT"):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, window_ms)


def close_hops(conn: Connection) -> None:
    """Fabric's close() leaves a connection's gateways open: close them too."""
    for hop in hops(conn):
        hop.close()
