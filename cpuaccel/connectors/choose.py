"""Which connector reaches a host: ``connector_for``, from its ``ansible_connection``.

srun for a node of a Slurm allocation, the controller itself for a local host, an
OpenSSH master kept across commands for the verbs that ask for one (check, sync), else
paramiko. The connector classes import ``base``; only this module imports them all.
"""

from __future__ import annotations

from cpuaccel.connectors.base import Connector
from cpuaccel.connectors.connect_options import ConnectOptions
from cpuaccel.inventory.host import Host
from cpuaccel.inventory.variables import parse_bool

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
    # would weigh on check's start-up

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
