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
from cpuaccel.errors import HostError
from cpuaccel.inventory.host import Host

if TYPE_CHECKING:
    from cpuaccel.connectors.base import ConnectOptions

DEFAULT_PORT = 22


def ssh_argv(host: Host, options: ConnectOptions) -> list[str]:
    """``ssh`` and its options (no host, no command)."""
    timeout = max(1, round(options.connect_timeout))
    argv = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={timeout}"]
    # The same keepalives as paramiko's (connectors/base.py): a dead node ends ssh.
    argv += ["-o", f"ServerAliveInterval={options.keepalive_interval}"]
    argv += ["-o", f"ServerAliveCountMax={options.keepalive_count}"]
    # Only a port the inventory sets: otherwise ssh reads its own ~/.ssh/config.
    if host.port is not None:
        argv += ["-p", str(host.port)]
    if host.user:
        argv += ["-l", host.user]
    if host.key_file:
        argv += ["-i", os.path.expanduser(host.key_file)]
    return argv + host_key_policy(host, options).openssh_options()


def port_of(host: Host) -> int:
    """The port every connection to ``host`` uses: the inventory's, else the one
    ssh_config gives its address (Fabric's lookup of the files ``ssh`` reads), else 22.

    The SSH connector connects there and names it in errors; sync's memory keys a node
    by it. The OpenSSH argv passes only the inventory's, and ssh finds the same.
    """
    if host.port is not None:
        return host.port
    if host.is_local:
        return DEFAULT_PORT  # no ssh involved: spare the config files
    from fabric import Config  # imported here: connecting imports it anyway

    config = Config()
    value = config.base_ssh_config.lookup(host.address).get("port", config.port)
    try:
        return int(value)
    except ValueError:
        raise HostError(
            host.name,
            f"ssh_config gives {host.address} the port {value!r}, not a number",
            hint="fix Port in ~/.ssh/config, or set ansible_port in the inventory",
        ) from None


def remote_spec(host: Host, path: str) -> str:
    """``host:path`` as rsync and scp read it (IPv6 addresses in brackets)."""
    address = host.address
    try:
        if ipaddress.ip_address(address).version == 6:
            address = f"[{address}]"
    except ValueError:
        pass
    return f"{address}:{path}"
