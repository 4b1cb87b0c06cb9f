"""How every connection to a node is made: timeouts, keepalives, host keys, login.

``ConnectOptions`` is what the shared host options (``-T``, ``-u``, ``--private-key``,
``--no-host-key-checking``) settle for one command; every connector and every ssh argv
cpuaccel builds reads it.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_CONNECT_TIMEOUT = 10.0  # seconds, as Ansible's and pdsh's defaults
DEFAULT_COMMAND_TIMEOUT = 120.0
# Keepalives, one pair for paramiko and OpenSSH (ServerAliveInterval/CountMax): sshd
# answers them itself, so a busy rank cannot delay one. A node is given up after 3
# unanswered 5-second probes: that rides out a brief blip (a switch port flapping) yet
# ends a run on a dead node in about 20 s, not after TCP's 15-minute retransmissions.
KEEPALIVE_INTERVAL = 5
KEEPALIVE_COUNT = 3


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
