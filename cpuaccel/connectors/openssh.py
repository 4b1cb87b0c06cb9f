"""argv for the OpenSSH client, for the tools that bring their own transport.

rsync (sync) and MPI's hydra bootstrap (run) start ``ssh`` themselves; they get the
same user, port, key and host-key policy as cpuaccel's own connections.
"""

from __future__ import annotations

import ipaddress
import os

from cpuaccel.connectors.base import ConnectOptions
from cpuaccel.inventory.host import Host


def ssh_options(host: Host, options: ConnectOptions) -> list[str]:
    """Options for ``ssh`` (no host, no command)."""
    argv = ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, round(options.connect_timeout))}"]
    if host.port != 22:
        argv += ["-p", str(host.port)]
    if host.user:
        argv += ["-l", host.user]
    if host.key_file:
        argv += ["-i", os.path.expanduser(host.key_file)]
    checking = (
        options.host_key_checking
        if options.host_key_checking is not None
        else host.host_key_checking
    )
    if checking:
        files = [os.path.expanduser("~/.ssh/known_hosts")]
        if host.known_hosts_file:
            files.append(os.path.expanduser(host.known_hosts_file))
        argv += [
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "UserKnownHostsFile=" + " ".join(files),
        ]
    else:
        argv += ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]
    return argv


def remote_spec(host: Host, path: str) -> str:
    """``host:path`` as rsync and scp read it (IPv6 addresses in brackets)."""
    address = host.address
    try:
        if ipaddress.ip_address(address).version == 6:
            address = f"[{address}]"
    except ValueError:
        pass
    return f"{address}:{path}"
