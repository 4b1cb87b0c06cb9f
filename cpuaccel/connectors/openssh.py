"""argv for the OpenSSH client, for the tools that bring their own transport.

rsync (sync, the playbook's synchronize) and MPI's hydra bootstrap (run's ssh.sh) start
``ssh`` themselves; they get it from their host's connector (``Connector.ssh_argv``),
built here with the same user, port, key, ProxyJump hops and host-key policy as
cpuaccel's own connections.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cpuaccel.connectors.hostkeys import (
    add_key_hint,
    address_and_port,
    forget_key_hint,
    host_key_policy,
)
from cpuaccel.errors import HostError
from cpuaccel.inventory.host import Host

if TYPE_CHECKING:
    from cpuaccel.connectors.connect_options import ConnectOptions

DEFAULT_PORT = 22


def ssh_argv(host: Host, options: ConnectOptions, hops: list[Hop] | None = None) -> list[str]:
    """``ssh`` and its options (no host, no command). Whoever appends the host puts
    ``--`` before it (rsync_argv does), so that no host is ever read as an option.
    ``hops``: the host's ProxyJump hops (``jump_hops``), looked up when not given."""
    argv = ["ssh", *_session_options(options)]
    # Only a port the inventory sets: otherwise ssh reads its own ~/.ssh/config.
    if host.port is not None:
        argv += ["-p", str(host.port)]
    user = login_user(host, options)
    if user:
        argv += ["-l", user]
    key = key_file(host, options)
    if key:
        argv += ["-i", os.path.expanduser(key)]
    policy = host_key_policy(host, options).openssh_options()
    # A ProxyJump from ssh_config would start the hop's ssh with none of these options
    # (its key checked against ~/.ssh/known_hosts alone): the hops are spelt out instead.
    command = _jump_command(jump_hops(host) if hops is None else hops, policy, options)
    return argv + policy + (["-o", f"ProxyCommand={command}"] if command else [])


def _session_options(options: ConnectOptions) -> list[str]:
    timeout = max(1, round(options.connect_timeout))
    argv = ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={timeout}"]
    # The same keepalives as paramiko's (connectors/base.py): a dead node ends ssh.
    argv += ["-o", f"ServerAliveInterval={options.keepalive_interval}"]
    return [*argv, "-o", f"ServerAliveCountMax={options.keepalive_count}"]


# ---------------------------------------------------------------- ProxyJump hops


@dataclass(frozen=True)
class Hop:
    """A ProxyJump hop as the paramiko path reaches it (``gateway_of``)."""

    address: str
    port: int
    user: str | None
    keys: tuple[str, ...]


def jump_hops(host: Host) -> list[Hop]:
    """The ProxyJump hops in front of ``host``, the nearest to it first: the chain the
    SSH connector takes (``gateway_of``), so that rsync's ssh takes the same way. A
    ProxyCommand (a string) is left to ssh's own config."""
    if host.is_local or not config_may_set("proxyjump"):
        return []
    from fabric import Connection  # imported here: as in port_of

    found: list[Hop] = []
    gateway = gateway_of(host.address)
    while isinstance(gateway, Connection):
        keys = gateway.connect_kwargs.get("key_filename") or []
        keys = [keys] if isinstance(keys, str) else keys
        found.append(Hop(gateway.host, int(gateway.port), gateway.user, tuple(keys)))
        gateway = gateway.gateway
    return found


# The files ssh_config's lookups read (Fabric's and OpenSSH's), and the one Include
# Debian's /etc/ssh/ssh_config holds; any other Include could bring in any keyword.
_CONFIG_FILES = ("~/.ssh/config", "/etc/ssh/ssh_config")
_CONFIG_DIR = "/etc/ssh/ssh_config.d"
_KNOWN_INCLUDE = re.compile(r"^\s*include\s+/etc/ssh/ssh_config\.d/\*\.conf\s*$", re.I | re.M)
_INCLUDE = re.compile(r"^\s*include\b", re.I | re.M)


def config_may_set(keyword: str) -> bool:
    """False only when no ssh_config file the lookups read sets ``keyword``: Fabric,
    paramiko and cryptography (slow to import) are then not needed to learn that
    it is unset. Conservative: an unreadable file or an unknown
    Include says True, and the full lookup decides."""
    files = [os.path.expanduser(path) for path in _CONFIG_FILES]
    with contextlib.suppress(OSError):
        files += sorted(os.path.join(_CONFIG_DIR, n) for n in os.listdir(_CONFIG_DIR))
    for path in files:
        try:
            if not os.path.exists(path):
                continue
            if not os.path.isfile(path) or os.path.getsize(path) > 1 << 20:
                return True
            with open(path, encoding="utf-8", errors="replace") as stream:
                text = stream.read()
        except OSError:
            return True
        said = re.compile(rf"^\s*{keyword}(?:\s|=)", re.I | re.M)  # not in a comment
        if said.search(text) or _INCLUDE.search(_KNOWN_INCLUDE.sub("", text)):
            return True
    return False


def gateway_of(address: str, depth: int = 0) -> Any:
    """Fabric's ``gateway`` for ``address``: ssh_config's ``ProxyJump`` read as OpenSSH
    reads it (``a,b``: a is reached first, b through a, the node through b; a by its own
    config), else its ``ProxyCommand`` (a string), else False (no gateway). Fabric's own
    reading turns ``a,b`` around (the node through a, a through b)."""
    from fabric import Config, Connection
    from fabric.connection import derive_shorthand

    found = Config().base_ssh_config.lookup(address)
    jump = found.get("proxyjump")
    if not jump or jump.lower() == "none" or depth > 8:  # 8: a config whose hops loop
        return found.get("proxycommand") or False
    gateway: Any = None
    for spec in jump.split(","):
        hop = derive_shorthand(spec)["host"]
        if hop in (address, found.get("hostname")):
            return False  # a wildcard Host block that names the host its own hop
        earlier = gateway_of(hop, depth + 1) if gateway is None else gateway
        gateway = Connection(spec, gateway=earlier)
    return gateway


def _jump_command(hops: list[Hop], policy: list[str], options: ConnectOptions) -> str | None:
    """The ProxyCommand that reaches the target through ``hops`` (nearest first): an ssh
    to the nearest hop with the target's host-key ``policy``, itself reaching that hop
    through the rest. ssh expands %-tokens in a ProxyCommand, so every literal ``%``
    is doubled, once more at each level of nesting."""
    if not hops:
        return None
    hop, rest = hops[0], hops[1:]
    words = [*_session_options(options), "-p", str(hop.port)]
    words += ["-l", hop.user] if hop.user else []
    for key in hop.keys:
        words += ["-i", os.path.expanduser(key)]
    words += policy
    inner = _jump_command(rest, policy, options)
    words += ["-o", f"ProxyCommand={inner}"] if inner else []
    literal = [word.replace("%", "%%") for word in ["ssh", *words]]
    return shlex.join([*literal, "-W", "[%h]:%p", "--", hop.address.replace("%", "%%")])


# OpenSSH's words when strict checking refuses a key (ssh's sshconnect.c); a pattern
# compiled by re on first use, as only a refused connection reads it.
_REFUSED = (
    r"^(?:Host key for (?P<changed>\S+) has changed"
    r"|No (?:\S+ )?host key is known for (?P<unknown>\S+))"
    r" and you have requested strict checking"
)


def refused_key(stderr: str, hops: list[Hop]) -> tuple[str, str] | None:
    """(message, hint) when ssh (under rsync) refused a host key, naming the machine
    whose key it was: the target, or which hop."""
    found = re.search(_REFUSED, stderr, re.MULTILINE)
    if found is None:
        return None
    name = found.group("changed") or found.group("unknown")
    address, port = address_and_port(name)
    what = "the ProxyJump hop " if address in {hop.address for hop in hops} else ""
    if found.group("changed"):
        message = f"host key of {what}{address} has CHANGED since it was recorded (rsync's ssh)"
        return message, forget_key_hint(address, port)
    return f"host key of {what}{address} is not known (rsync's ssh)", add_key_hint(address, port)


def login_user(host: Host, options: ConnectOptions) -> str | None:
    """The user to log in as: the host's ansible_user, else -u/--user, else None (ssh's
    own choice: ssh_config's User, else the local user). Ansible's precedence: a
    command-line value is below every variable, so the inventory and -e win over -u."""
    return host.user or options.user


def key_file(host: Host, options: ConnectOptions) -> str | None:
    """The private key: ansible_ssh_private_key_file, else --private-key (same order)."""
    return host.key_file or options.private_key


def port_of(host: Host) -> int:
    """The port every connection to ``host`` uses: the inventory's, else the one
    ssh_config gives its address (Fabric's lookup of the files ``ssh`` reads), else 22.

    The SSH connector connects there and names it in errors; sync's memory keys a node
    by it. The OpenSSH argv passes only the inventory's, and ssh finds the same.
    """
    if host.port is not None:
        return host.port
    if host.is_local or not config_may_set("port"):
        return DEFAULT_PORT  # no ssh involved, or no config file says Port: spare Fabric
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
    """``host:path`` as rsync and scp read it (IPv6 addresses in brackets).

    rsync sends the path through its protocol (``--secluded-args``), where no shell
    expands ``~``: a path in the home folder is written relative, which the node's rsync
    resolves from the login folder, the home.
    """
    address = host.address
    try:
        if ipaddress.ip_address(address).version == 6:
            address = f"[{address}]"
    except ValueError:
        pass
    return f"{address}:{home_relative(host, path)}"


def home_relative(host: Host, path: str) -> str:
    """``~`` and ``~/x`` as the login folder's ``.`` and ``x``; another user's ``~name``
    cannot be said without a shell, so it is refused."""
    if path == "~" or path == "~/":
        return "."
    if path.startswith("~/"):
        return path[2:].lstrip("/") or "."
    if path.startswith("~"):
        raise HostError(
            host.name,
            f"cannot copy to {path}: another user's ~ folder",
            hint="write the destination as an absolute path",
        )
    return path


# ---------------------------------------------------------------- MPI's ssh_config

# What an ssh_config word may hold: ssh splits on blanks and quotes (quoted here), expands
# %-tokens (doubled here) and, from OpenSSH 8.4, ${VAR} (no escape: refused), and a file
# is read line by line (no line breaks). Quotes and backslashes are refused too: older
# OpenSSH releases read them without escapes.
_CONFIG_REFUSED = ("\n", "\r", "\0", '"', "\\", "${")
_HOST_PATTERN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")


def _config_word(owner: str, what: str, value: str, tokens: bool = True) -> str:
    """``value`` as one double-quoted ssh_config argument (``~`` left for ssh)."""
    bad = next((s for s in _CONFIG_REFUSED if s in value), None)
    if bad is not None:
        raise HostError(
            owner,
            f"{what} {value!r} holds {bad!r}, which MPI's ssh_config cannot carry",
            hint=f"use a {what} without quotes, backslashes, line breaks or ${{",
        )
    return '"' + (value.replace("%", "%%") if tokens else value) + '"'


def _config_user(host: Host, options: ConnectOptions) -> str | None:
    """The user the controller logs in as: the inventory's (or -u's), else the
    controller's ssh_config's, else the controller's own (Fabric's order), so that the
    head's ssh logs in as the same user, not as whoever it runs as."""
    user = login_user(host, options)
    if user or host.is_local:
        return user
    from fabric import Config

    config = Config()
    return str(config.base_ssh_config.lookup(host.address).get("user") or config.user)


def ssh_config_stanza(
    host: Host, options: ConnectOptions, known_hosts: str, also: str | None = None
) -> str:
    """One ``Host`` block of the ssh_config that MPI's launcher uses to reach ``host``
    from the head node (``ssh -F``): the address, port, user and key the controller
    uses, and its host-key policy, with ``known_hosts`` (a path on the head) as the
    only file of known keys. Paths keep ``~`` for the head's ssh to expand. ``also``:
    another name the block answers to (the node's address in the hostfile, when the
    hostfile names nodes by address).
    """
    if not _HOST_PATTERN.match(host.name):
        raise HostError(
            host.name,
            "this inventory name cannot be an ssh_config Host",
            hint="name hosts with letters, digits, '.', '_' and '-' only",
        )
    policy = host_key_policy(host, options)
    patterns = host.name
    if also and also != host.name and _HOST_PATTERN.match(also):
        patterns += f" {also}"
    lines = [
        f"Host {patterns}",
        f"HostName {_config_word(host.name, 'ansible_host', host.address)}",
        f"Port {port_of(host)}",
    ]
    user = _config_user(host, options)
    if user:
        lines.append(f"User {_config_word(host.name, 'ansible_user', user, tokens=False)}")
    key = key_file(host, options)
    if key:
        word = _config_word(host.name, "ansible_ssh_private_key_file", key)
        lines.append(f"IdentityFile {word}")
    if policy.check:
        lines += [
            "StrictHostKeyChecking yes",
            f"UserKnownHostsFile {_config_word(host.name, 'known_hosts', known_hosts)}",
            "GlobalKnownHostsFile /dev/null",  # only the keys the controller verified
        ]
    else:
        lines += ["StrictHostKeyChecking no", "UserKnownHostsFile /dev/null"]
    timeout = max(1, round(options.connect_timeout))
    lines += ["BatchMode yes", f"ConnectTimeout {timeout}"]
    # MPI's own connections get the same keepalives as cpuaccel's: a node that vanishes
    # ends the launcher's ssh to it instead of leaving the job waiting.
    lines += [
        f"ServerAliveInterval {options.keepalive_interval}",
        f"ServerAliveCountMax {options.keepalive_count}",
    ]
    return lines[0] + "\n" + "".join(f"    {line}\n" for line in lines[1:])


def ssh_config_default(known_hosts: str) -> str:
    """The block after every host's own: any other name is checked against the same
    keys, and ssh never asks (MPI has no terminal)."""
    path = _config_word("the run folder", "path", known_hosts)
    return (
        f"Host *\n    StrictHostKeyChecking yes\n    UserKnownHostsFile {path}\n    BatchMode yes\n"
    )


MUX_PREFIX = "/tmp/cpuaccel-mux-"  # + the run id: the head's ssh masters of one run
MUX_PERSIST = 30  # seconds a master stays after its last session (then it exits itself)


def mux_dir(run_id: str) -> str:
    """Where the head keeps the run's ssh master connections (node/jobctl.py makes it,
    0700 and exclusively, in the preflight's launcher check, and the sweep removes it).
    Short on purpose: a socket path has 107 bytes, and ssh adds 17 to it while binding."""
    return MUX_PREFIX + run_id


def ssh_config_mux(run_id: str) -> str:
    """The block that lets MPI's ssh reuse the connections the preflight's launcher
    check opened (``ssh.sh -N NODE``, which stays ControlPersist seconds): the
    launch then costs no second SSH handshake a node. ``ControlMaster`` stays no for
    every other ssh, so a missing master means a plain connection, never a new master."""
    return f"Host *\n    ControlPath {mux_dir(run_id)}/%C\n    ControlPersist {MUX_PERSIST}\n"


def ssh_config_master() -> str:
    """Appended to the preflight's own copy of the ssh_config only: its ``ssh.sh -N
    NODE`` opens the masters (kept ControlPersist seconds) that the launch reuses, or
    finds the one an earlier pass of the same run left (``auto``: ``-N`` through a
    live master returns at once; with ``yes`` it would connect on its own and stay)."""
    return "Host *\n    ControlMaster auto\n"


def known_hosts_line(host: Host, key: str) -> str:
    """A known_hosts line giving ``key`` ("TYPE BASE64", as the controller verified it)
    to the names ssh looks the host up by: the inventory name and the address, as
    ``[name]:port`` when the port is not 22."""
    port = port_of(host)
    names = list(dict.fromkeys([host.name, host.address]))
    if port != DEFAULT_PORT:
        names = [f"[{name}]:{port}" for name in names]
    return f"{','.join(names)} {key}\n"
