"""A run's files on a node, from the controller: the ``jobctl`` program's ``list`` and
``read`` (cpuaccel.node.runfiles), each call bounded by a timeout."""

from __future__ import annotations

import base64
from dataclasses import dataclass

from cpuaccel.connectors import programs
from cpuaccel.connectors.base import Connector

CALL_TIMEOUT = 15.0  # seconds one list or read may take before the caller moves on
CHUNK = 4 * 1024 * 1024  # bytes asked for at once


@dataclass(frozen=True)
class RemoteFile:
    name: str
    size: int
    mtime: float


def list_files(
    conn: Connector,
    run_dir: str,
    timeout: float = CALL_TIMEOUT,
    kept: programs.Kept | None = None,
) -> list[RemoteFile] | None:
    """The files of the run folder on the node; None when it has no such folder.
    ``kept``: the node's kept prelaunch program, asked first (a run's own passes)."""
    what = "listing the run's files"
    found = programs.call_kept(kept, conn, ["list", run_dir], what=what, timeout=timeout)
    files = found.get("files")
    if files is None:
        return None
    return [RemoteFile(str(n), int(s), float(m)) for n, s, m in files]


def read(
    conn: Connector,
    run_dir: str,
    name: str,
    offset: int = 0,
    limit: int = CHUNK,
    timeout: float = CALL_TIMEOUT,
    kept: programs.Kept | None = None,
) -> tuple[bytes | None, int, int | None]:
    """(bytes from ``offset``, the offset after them, the file's size); (None, offset,
    None) when the file is not there. A file now shorter than ``offset`` (rewritten) is
    read from its start: the new offset then is no more than the bytes returned."""
    words = ["read", run_dir, name, str(offset), str(limit)]
    found = programs.call_kept(kept, conn, words, what=f"reading {name}", timeout=timeout)
    if found.get("data") is None:
        return None, offset, None
    return base64.b64decode(found["data"]), int(found["offset"]), int(found["size"])


def read_new(
    conn: Connector,
    run_dir: str,
    name: str,
    offset: int,
    timeout: float = CALL_TIMEOUT,
    kept: programs.Kept | None = None,
) -> tuple[bytes, int]:
    """What was appended to ``name`` since ``offset`` (one call: at most CHUNK bytes)."""
    data, new, _ = read(conn, run_dir, name, offset, CHUNK, timeout, kept)
    if data is None:
        return b"", offset
    return data, new
