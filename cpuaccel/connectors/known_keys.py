"""known_hosts files read once per command, not once per host.

paramiko's ``SSHClient.load_system_host_keys`` parses the whole file for every client,
and its parser checks each line against every earlier one: with one line per node, a
check of N nodes would parse N files of N lines, O(N^2) lines and O(N^3) comparisons,
a cost per host that grows with the square of the nodes. Here each file is parsed once
and the parsed keys are shared, read-only, by every connection of the process; a file
that changed (its size, mtime or inode) is parsed again.
"""

from __future__ import annotations

import os
import threading

import paramiko

from cpuaccel.connectors.known_lines import open_regular

_lock = threading.Lock()
_cache: dict[tuple[tuple[str, int, int, int], ...], paramiko.HostKeys] = {}


def _stamp(path: str) -> tuple[str, int, int, int]:
    st = os.stat(path)  # OSError as paramiko's own open would raise it
    return path, st.st_ino, st.st_size, st.st_mtime_ns


def shared_host_keys(paths: list[str]) -> paramiko.HostKeys:
    """The keys of ``paths`` (later files win, as repeated ``load`` calls do), parsed once
    while the files stay the same. Raises OSError for a file that cannot be read. Callers
    only look keys up: the object is shared between threads."""
    stamps = tuple(_stamp(path) for path in paths)
    with _lock:  # one parse even when 32 connections start at once
        keys = _cache.get(stamps)
        if keys is None:
            keys = paramiko.HostKeys()
            for path in paths:
                keys.load(path)
            if len(_cache) >= 8:  # sets of files that changed since: not kept forever
                _cache.clear()
            _cache[stamps] = keys
        return keys


def must_read(path: str) -> None:
    """Raise OSError if ``path`` cannot be opened for reading, or is no regular file
    (paramiko's own open of a FIFO would wait for a writer for good)."""
    os.close(open_regular(path))


def readable(path: str) -> bool:
    """True if ``path`` can be opened for reading (ssh skips a known_hosts file that cannot)."""
    try:
        must_read(path)
    except OSError:
        return False
    return True


def use_host_keys(client: paramiko.SSHClient, paths: list[str]) -> None:
    """``client`` checks servers against ``paths``' keys, as after
    ``load_system_host_keys`` on each path, without parsing them again."""
    # paramiko reads _system_host_keys only to look keys up (SSHClient.connect) and
    # never writes it back: sharing the parsed object is safe.
    vars(client)["_system_host_keys"] = shared_host_keys(paths)
