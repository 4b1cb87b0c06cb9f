"""The host-key policy: whether a host's key is checked, and against which files.

Decided here once, for both ways cpuaccel reaches a host: paramiko (``connectors/ssh.py``)
and the OpenSSH argv given to rsync and MPI (``connectors/openssh.py``), so the two can
never disagree about whether a connection may go to an unknown key.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cpuaccel.connectors.known_lines import open_regular
from cpuaccel.errors import Unreachable
from cpuaccel.inventory.host import Host, ssh_options
from cpuaccel.inventory.variables import parse_bool

if TYPE_CHECKING:
    from cpuaccel.connectors.connect_options import ConnectOptions

USER_KNOWN_HOSTS = "~/.ssh/known_hosts"
# Read by OpenSSH on its own (GlobalKnownHostsFile): paramiko must be told.
SYSTEM_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts"
_OFF = ("no", "off", "false")


@dataclass(frozen=True)
class HostKeyPolicy:
    """``check`` is True unless turned off explicitly; ``opted_out_by`` says where."""

    check: bool
    extra_known_hosts: str | None  # cpuaccel_known_hosts / UserKnownHostsFile, expanded
    opted_out_by: str | None = None

    @property
    def known_hosts(self) -> list[str]:
        """Every known_hosts file read, the user's own first (expanded paths)."""
        files = [os.path.expanduser(USER_KNOWN_HOSTS)]
        if self.extra_known_hosts:
            files.append(self.extra_known_hosts)
        return files

    def openssh_options(self) -> list[str]:
        """The same policy as ``-o`` options of the OpenSSH client."""
        if not self.check:
            return ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]
        # ssh splits the option's value at spaces: a path holding one is quoted.
        files = " ".join(f'"{f}"' if any(c.isspace() for c in f) else f for f in self.known_hosts)
        return ["-o", "StrictHostKeyChecking=yes", "-o", "UserKnownHostsFile=" + files]

    @property
    def optional_known_hosts(self) -> list[str]:
        """The files read if they exist, as OpenSSH does: the user's, then the system's
        (the extra file, which the inventory names, must exist)."""
        return [os.path.expanduser(USER_KNOWN_HOSTS), SYSTEM_KNOWN_HOSTS]


def _known_hosts_name(address: str, port: int) -> str:
    """How known_hosts names a host: ``address``, or ``[address]:port`` off port 22."""
    return address if port == 22 else f"[{address}]:{port}"


def address_and_port(name: str) -> tuple[str, int]:
    """A known_hosts name ("addr", or "[addr]:port" off port 22) as its parts, for the
    hints that give ssh-keyscan and ssh-keygen the port."""
    if name.startswith("[") and "]:" in name:
        address, _, port = name[1:].partition("]:")
        if port.isdigit():
            return address, int(port)
    return name, 22


def add_key_hint(address: str, port: int) -> str:
    """How to record a host's key after checking it, for this port."""
    scan = ["ssh-keyscan", *(["-p", str(port)] if port != 22 else []), address]
    return (
        f"check the fingerprint, then add it: {shlex.join(scan)} >> ~/.ssh/known_hosts "
        "(or set cpuaccel_known_hosts to your file); to skip the check set "
        "ansible_host_key_checking: false"
    )


def forget_key_hint(address: str, port: int) -> str:
    """How to drop a host's old key (its known_hosts name includes a non-22 port)."""
    forget = shlex.join(["ssh-keygen", "-R", _known_hosts_name(address, port)])
    return (
        f"if the node was reinstalled, remove its old line with {forget}; otherwise do not connect"
    )


def _inventory_opt_out(host: Host) -> str | None:
    """Which inventory setting turns checking off for ``host``, if one does.

    ``ansible_host_key_checking`` wins over ``-o StrictHostKeyChecking`` in
    ``ansible_ssh_common_args``, as in Ansible.
    """
    if "ansible_host_key_checking" in host.vars:
        value = host.vars["ansible_host_key_checking"]
        shown = str(value).lower() if isinstance(value, bool) else value  # as YAML says it
        # Checked at inventory load (inventory/variables.py); a word that is no boolean
        # (a Host built by hand) keeps checking on: a typo must never turn it off.
        return None if parse_bool(value) is not False else f"ansible_host_key_checking: {shown}"
    strict = ssh_options(host.vars).get("stricthostkeychecking")
    if strict is not None and strict.lower() in _OFF:
        return f"StrictHostKeyChecking={strict} in ansible_ssh_common_args"
    return None


def host_key_policy(host: Host, options: ConnectOptions) -> HostKeyPolicy:
    """The policy for one host: the command line's choice, else the inventory's."""
    extra = host.known_hosts_file
    extra = os.path.expanduser(extra) if extra else None
    if options.host_key_checking is True:
        return HostKeyPolicy(True, extra)
    if options.host_key_checking is False:
        return HostKeyPolicy(False, extra, "--no-host-key-checking")
    opted_out_by = _inventory_opt_out(host)
    return HostKeyPolicy(opted_out_by is None, extra, opted_out_by)


def opt_out_warnings(hosts: Sequence[Host], options: ConnectOptions) -> list[str]:
    """One line per reason for the hosts whose keys are not checked: an opt-out is
    never silent, since it lets an impostor receive commands and secrets."""
    by_reason: dict[str, list[str]] = {}
    for host in hosts:
        if host.is_local:
            continue
        policy = host_key_policy(host, options)
        if policy.opted_out_by is not None:
            by_reason.setdefault(policy.opted_out_by, []).append(host.name)
    return [
        f"host keys are not checked for {_some(names)} ({reason}): "
        "an impostor could receive the commands and secrets sent there"
        for reason, names in by_reason.items()
    ]


def _some(names: list[str], shown: int = 4) -> str:
    if len(names) <= shown + 1:
        return ", ".join(names)
    return f"{', '.join(names[:shown])} and {len(names) - shown} more"


def refuse_inline_proxy(host: Host) -> None:
    """A hop in ansible_ssh_common_args would be connected to unchecked (or ignored):
    hops are honoured from ~/.ssh/config, where every path reads them alike (the
    paramiko and the OpenSSH connector)."""
    for option in ("proxyjump", "proxycommand"):
        if option in ssh_options(host.vars):
            raise Unreachable(
                host.name,
                f"{option} in ansible_ssh_common_args is not supported",
                hint=f"put it under 'Host {host.address}' in ~/.ssh/config, which "
                "cpuaccel, rsync and MPI's ssh all read (a hop's key is checked too)",
            )


def refuse_unreadable_known_hosts(host_name: str, path: str | None) -> None:
    """The inventory's own known_hosts file (cpuaccel_known_hosts, UserKnownHostsFile)
    must be a readable regular file, for paramiko and ssh alike: a missing one would
    turn every key into an unknown one, and a FIFO would hang whoever opens it."""
    if not path:
        return
    try:
        os.close(open_regular(path))
    except OSError as exc:
        raise Unreachable(
            host_name,
            f"cannot read known_hosts file {path}: {exc.strerror}",
            hint="fix cpuaccel_known_hosts / UserKnownHostsFile in the inventory",
        ) from None
