"""How a sync describes a file, link or folder, and a whole tree as one hash: the node's
``tree`` and the controller's source manifest (cpuaccel.projectsync.manifest, through
``cpuaccel.node.tree``) alike. Part of cpuaccel's node package: stdlib only."""

from __future__ import annotations

import hashlib
import os
import stat

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time: the node pays for every import
    from collections.abc import Callable
    from typing import Any, BinaryIO, TypeAlias

    Entry: TypeAlias = tuple[Any, ...]  # ("f", mode, size, sha256) | ("l", target) | ("d", mode)
else:
    Entry = tuple


def file_digest(path: str) -> str:
    # O_NONBLOCK: a FIFO swapped in since the caller's stat opens at once and is refused
    # below, where a plain open would wait for a writer for good.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise FileNotFoundError(path)  # no longer the file the walk saw: taken as gone
        return _sha256_of(f)


def _sha256_of(f: BinaryIO) -> str:
    digest = hashlib.sha256()
    while chunk := f.read(1 << 20):
        digest.update(chunk)
    return digest.hexdigest()


def entry_of(
    path: str,
    st: os.stat_result,
    cache: dict[str, Any] | None = None,
    digest_of: Callable[[], str] | None = None,
) -> Entry:
    """Describe one path; ``cache`` maps path -> (size, mtime, ctime, ino, digest);
    ``digest_of`` reads the file when the cache has no digest for it (else its path)."""
    if stat.S_ISLNK(st.st_mode):
        return ("l", os.readlink(path))
    # Permission bits only: a sync neither sends nor keeps setuid, setgid or sticky bits.
    if stat.S_ISDIR(st.st_mode):
        return ("d", stat.S_IMODE(st.st_mode) & 0o777)
    if not stat.S_ISREG(st.st_mode):
        # A FIFO, socket or device on a node (no source entry is one): never read, as
        # reading a FIFO waits for a writer; the entry differs from any file's.
        return ("-", stat.S_IFMT(st.st_mode))
    key = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    cached = cache.get(path) if cache is not None else None
    if isinstance(cached, (list, tuple)) and len(cached) == 5 and tuple(cached[:4]) == key:
        digest = str(cached[4])
    else:
        digest = digest_of() if digest_of is not None else file_digest(path)
        if cache is not None:
            cache[path] = (*key, digest)
    return ("f", stat.S_IMODE(st.st_mode) & 0o777, st.st_size, digest)


def manifest_hash(entries: dict[str, Entry]) -> str:
    """One hash for a whole tree: stable across Python versions and machines."""
    digest = hashlib.sha256()
    for path in sorted(entries):
        digest.update(path.encode("utf-8", "surrogateescape"))
        digest.update(b"\0" + "\0".join(str(x) for x in entries[path]).encode() + b"\n")
    return digest.hexdigest()


def entry_at(
    folder: int, name: str, path: str, st: os.stat_result, cache: dict[str, Any] | None
) -> Entry:
    """``entry_of`` for a name in a folder held open: a link read and a file hashed
    through the folder's descriptor, never through a link on the way. Anything else than
    a file, link or folder (a FIFO, a device) is never read: no source entry is one."""
    if stat.S_ISLNK(st.st_mode):
        return ("l", os.readlink(name, dir_fd=folder))
    return entry_of(path, st, cache, lambda: _digest_at(folder, name, st))  # reads files only


def _digest_at(folder: int, name: str, st: os.stat_result) -> str:
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder)
    with os.fdopen(fd, "rb") as f:
        now = os.fstat(f.fileno())
        if (now.st_ino, now.st_dev) != (st.st_ino, st.st_dev):
            raise FileNotFoundError(name)  # replaced since the walk's stat: taken as gone
        return _sha256_of(f)
