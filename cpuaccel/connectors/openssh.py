"""argv for the OpenSSH client, for the tools that bring their own transport.

rsync (sync, the playbook's synchronize) and MPI's hydra bootstrap (run's ssh.sh) start
``ssh`` themselves; they get it from their host's connector (``Connector.ssh_argv``),
built here with the same user, port, key and host-key policy as cpuaccel's own
connections.
"""

from __future__ import annotations

import ipaddress
import os
from typing import TYPE_CHECKING

from cpuaccel.connectors.hostkeys import host_key_policy
from cpuaccel.inventory.host import Host

if TYPE_CHECKING:
    from cpuaccel.connectors.base import ConnectOptions


def ssh_argv(host: Host, options: ConnectOptions) -> list[str]:
    """``ssh`` and its options (no host, no command)."""
    timeout = max(1, round(options.connect_timeout))
    argv = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={timeout}"]
    if host.port != 22:
        argv += ["-p", str(host.port)]
    if host.user:
        argv += ["-l", host.user]
    if host.key_file:
        argv += ["-i", os.path.expanduser(host.key_file)]
    return argv + host_key_policy(host, options).openssh_options()


def remote_spec(host: Host, path: str) -> str:
    """``host:path`` as rsync and scp read it (IPv6 addresses in brackets)."""
    address = host.address
    try:
        if ipaddress.ip_address(address).version == 6:
            address = f"[{address}]"
    except ValueError:
        pass
    return f"{address}:{path}"
