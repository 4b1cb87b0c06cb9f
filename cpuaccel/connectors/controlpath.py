"""Where OpenSSH's master connections live between commands (ControlPath), and when one
may be reused: the pure parts of connectors/openssh_session.py.

A master is reused only by a command that would open the very same connection: its
socket's name is a hash of the whole ssh argv (user, port, key, ProxyJump hops,
host-key policy, keepalives, timeouts), the address, and the identity of every
known_hosts file the policy reads (device, inode, size, modification time). A node
re-made at the same address with new host keys gets its new keys written into
known_hosts, which changes the name: the new connection checks the new key, and the old
master, if still alive, is never asked again (it ends after its idle time). A master
only ever speaks to the host key it verified when it was opened.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Sequence

from cpuaccel.connectors.openssh import MUX_PREFIX

try:  # CPython's own SHA-256, as random.py takes its sha512: hashlib's import loads
    # OpenSSL's libcrypto, a cost in every check's and sync's start-up.
    from _sha2 import sha256  # type: ignore[import-not-found,unused-ignore]  # 3.12+
except ImportError:
    try:
        from _sha256 import sha256  # type: ignore[import-not-found,no-redef,unused-ignore]
    except ImportError:
        from hashlib import sha256  # type: ignore[assignment,no-redef,unused-ignore]
from cpuaccel.errors import CpuaccelError

# As Ansible's ~/.ansible/cp; not below ~/.cpuaccel, which is the name of sync's state
# folder in a destination (a sync refused at the home must leave no such name there).
CONTROL_DIR = "~/.cpuaccel-cp"
PERSIST_SECONDS = 60  # a master ends on its own after this long without a session
# A unix socket's path holds 107 bytes; ssh binds a temporary name first, the path and
# 17 more characters (".XXXXXXXXXXXXXXXX"), then renames it.
_SOCKET_MAX = 107
_SSH_TEMP_SUFFIX = 17
_HASH_CHARS = 24  # 96 bits: no two connections of one user ever share a name


class ControlDirError(CpuaccelError):
    """The folder of the master connections' sockets cannot be trusted or used."""


def _fix(path: str) -> str:
    return (
        f"remove {path} (it is re-made, mode 0700) or set cpuaccel_ssh_persist: false "
        "in the inventory to connect without kept connections"
    )


def ensure_dir(path: str = CONTROL_DIR) -> str:
    """The folder (expanded), made 0700 if missing, and refused unless it is a real
    folder owned by this user that no one else may enter: another user who could
    write there could put a socket of their own in place of a master."""
    folder = os.path.expanduser(path)
    parent = os.path.dirname(folder)
    try:
        os.makedirs(parent, mode=0o700, exist_ok=True)
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise ControlDirError(
            f"cannot make the ssh connection folder {folder}: {exc.strerror}",
            hint=_fix(folder),
        ) from None
    check_dir(folder)
    return folder


def check_dir(folder: str) -> None:
    """Refuse ``folder`` unless it is a folder (not a link to one), owned by this user,
    with no permission for group or others."""
    try:
        info = os.lstat(folder)
    except OSError as exc:
        raise ControlDirError(
            f"cannot use the ssh connection folder {folder}: {exc.strerror}", hint=_fix(folder)
        ) from None
    if stat.S_ISLNK(info.st_mode):
        problem = "is a symbolic link"
    elif not stat.S_ISDIR(info.st_mode):
        problem = "is not a folder"
    elif info.st_uid != os.geteuid():
        problem = f"belongs to uid {info.st_uid}, not to you (uid {os.geteuid()})"
    elif info.st_mode & 0o077:
        problem = f"has mode {stat.S_IMODE(info.st_mode):04o}, not 0700"
    else:
        return
    raise ControlDirError(f"the ssh connection folder {folder} {problem}", hint=_fix(folder))


def file_identity(path: str) -> list[int] | None:
    """What changes when a known_hosts file is rewritten or edited (None: absent)."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return [info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns]


def control_path(
    folder: str, ssh_argv: Sequence[str], address: str, known_hosts: Sequence[str]
) -> str:
    """The socket of the master for this exact connection (see the module's doc)."""
    identity = [list(ssh_argv), address, [(f, file_identity(f)) for f in known_hosts]]
    digest = sha256(json.dumps(identity).encode()).hexdigest()[:_HASH_CHARS]
    path = os.path.join(folder, digest)
    if len(path.encode()) + _SSH_TEMP_SUFFIX > _SOCKET_MAX:
        raise ControlDirError(
            f"the ssh connection folder {folder} is too long a path for a socket "
            f"({len(folder.encode())} bytes; at most "
            f"{_SOCKET_MAX - _SSH_TEMP_SUFFIX - _HASH_CHARS - 1})",
            hint="set cpuaccel_ssh_persist: false in the inventory, or use a shorter home",
        )
    return path


def folder_fits(path: str = CONTROL_DIR) -> bool:
    """Whether a socket in the folder fits a unix socket's path (a home of about 50
    characters at most); connectors/choose.keeps_connection uses paramiko otherwise."""
    longest = _SOCKET_MAX - _SSH_TEMP_SUFFIX - _HASH_CHARS - 1
    return len(os.path.expanduser(path).encode()) <= longest


def mux_options(path: str, persist: int = PERSIST_SECONDS) -> list[str]:
    """ssh's options to use the master at ``path``, or become it (ControlMaster=auto,
    as Ansible's): a master backgrounds itself at once, its stdio on /dev/null, and
    exits ``persist`` seconds after its last session. Two commands racing to be the
    first: the loser's ssh finds the socket taken and connects on its own (no error).
    ssh expands %-tokens in ControlPath (a literal % is doubled) and splits an option
    at blanks (a path holding one is quoted)."""
    value = path.replace("%", "%%")
    value = f'"{value}"' if any(c.isspace() for c in value) else value
    return [
        "-o",
        "ControlMaster=auto",
        "-o",
        "ControlPath=" + value,
        "-o",
        f"ControlPersist={persist}",
    ]


# ---------------------------------------------------------------- check's head masters

HEAD_PERSIST = 60  # as the controller's: a repeat check within a minute logs in through them


def head_folder(config: str, known_hosts: str, run_id: str) -> str:
    """The folder on the head of ``check``'s launcher-reach masters (node/jobctl.py's
    ``reach --keep``), kept across checks. Named, as the controller's sockets, by a hash
    of what they were opened with: the ssh_config's every node block (address, port,
    user, key file, host-key policy, keepalives, timeouts) and the host keys the
    controller verified (the run's known_hosts); the run id, the only part that differs
    from one check to the next, left out. A node re-keyed, re-addressed or given another
    key file gets a new folder, so its first check opens and verifies a new connection;
    a master only ever speaks to the key it verified. Within its folder, ssh's %C names
    a socket by head, node address, port and user."""
    identity = [config.replace(run_id, ""), known_hosts]
    digest = sha256(json.dumps(identity).encode()).hexdigest()[:_HASH_CHARS]
    # c + 24: never a run id (those start with a digit); the sweep of ended masters'
    # folders (node/mux.sweep_stale) removes it once its masters have ended.
    return f"{MUX_PREFIX}c{digest}"


def head_config(folder: str) -> str:
    """The block put FIRST in check's copy of the ssh_config (ssh takes a keyword's
    first value, so it stands before the run's own ControlPath): reuse a live master
    in ``folder``, else become one, kept HEAD_PERSIST seconds after its last session."""
    return (
        f"Host *\n    ControlMaster auto\n    ControlPath {folder}/%C\n"
        f"    ControlPersist {HEAD_PERSIST}\n"
    )
