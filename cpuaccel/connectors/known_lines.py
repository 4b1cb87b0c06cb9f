"""A host's trusted key looked up in known_hosts files, with the standard library only.

The OpenSSH connector (connectors/openssh_session.py) leaves checking the key to ssh,
which refuses any key these files do not hold for the host; the run's own known_hosts
(the launcher's check from the head) then needs one of those keys, and paramiko (the
other reader) is exactly what that path does not import. Hashed names (``|1|salt|hash``,
HashKnownHosts), patterns (``*``, ``?``, ``!negated``), ``@revoked`` and
``@cert-authority`` lines are read as OpenSSH reads them.
"""

from __future__ import annotations

import base64
import errno
import os
import re
import stat
from collections.abc import Sequence

from cpuaccel.sourcefile import kind_of

# ssh's own preference among host key types (the first one a node has is verified).
_PREFERRED = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521")
_MAX_BYTES = 16 << 20  # a known_hosts file larger than this is not read (ssh would)


def _hashed_match(field: str, name: str) -> bool:
    parts = field.split("|")  # "", "1", salt, hash
    if len(parts) != 4 or parts[1] != "1":
        return False
    try:
        salt, digest = base64.b64decode(parts[2]), base64.b64decode(parts[3])
    except ValueError:
        return False
    # Here, not at the top: hmac loads OpenSSL's libcrypto (a cost in every check's
    # start-up), and only a hashed known_hosts line (HashKnownHosts) needs it.
    import hashlib
    import hmac

    mine = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return hmac.compare_digest(mine, digest)


def _pattern_match(pattern: str, name: str) -> bool:
    """ssh's match_pattern: ``*`` and ``?`` are the only wildcards (``[`` is literal:
    ``[address]:port`` is a name), case-insensitive."""
    regex = re.escape(pattern.lower()).replace(r"\*", ".*").replace(r"\?", ".")
    return re.fullmatch(regex, name.lower()) is not None


def names_match(field: str, name: str) -> bool:
    """Whether a known_hosts line's names (``field``) cover ``name``: a hashed entry,
    or a comma list of patterns where a matching ``!pattern`` excludes the line."""
    if field.startswith("|"):
        return _hashed_match(field, name)
    matched = False
    for pattern in field.split(","):
        if pattern.startswith("!"):
            if _pattern_match(pattern[1:], name):
                return False
        elif _pattern_match(pattern, name):
            matched = True
    return matched


def open_regular(path: str) -> int:
    """A descriptor of the known_hosts file at ``path``; OSError unless it is a regular
    file. Opened without blocking and judged first by its path, then by the descriptor
    read: a FIFO named as known_hosts would otherwise hang paramiko's open, and ours, for
    good, and a device might never end."""
    _require_regular(os.stat(path).st_mode)  # a device is not even opened
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        _require_regular(os.fstat(fd).st_mode)
    except OSError:
        os.close(fd)
        raise
    return fd


def _require_regular(mode: int) -> None:
    if not stat.S_ISREG(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else kind_of(mode)
        said = "" if kind == "not a regular file" else f"{kind}, "
        raise OSError(errno.EINVAL, f"it is {said}not a regular file")


def _read(path: str) -> list[str]:
    try:
        with os.fdopen(open_regular(path), "rb") as stream:
            return stream.read(_MAX_BYTES).decode(errors="replace").splitlines()
    except OSError:
        return []  # absent, unreadable or no file: ssh skips it too


def trusted_keys(name: str, files: Sequence[str]) -> list[str]:
    """Every "TYPE BASE64" the files trust for ``name`` (ssh's lookup name: the address,
    or ``[address]:port`` off port 22), revoked keys left out."""
    found: list[str] = []
    revoked: set[str] = set()
    for path in files:
        for line in _read(path):
            words = line.split()
            if not words or words[0].startswith("#"):
                continue
            marker = words.pop(0) if words[0].startswith("@") else None
            if len(words) < 3 or not names_match(words[0], name):
                continue
            key = f"{words[1]} {words[2]}"
            if marker == "@revoked":
                revoked.add(key)
            elif marker is None:
                found.append(key)
    return [key for key in dict.fromkeys(found) if key not in revoked]


def preferred_key(name: str, files: Sequence[str]) -> str | None:
    """The key ssh would verify for ``name`` among the trusted ones (its order of types),
    or None when the files trust none."""
    keys = trusted_keys(name, files)
    rank = {kind: i for i, kind in enumerate(_PREFERRED)}
    keys.sort(key=lambda key: rank.get(key.split()[0], len(rank)))
    return keys[0] if keys else None
