"""A run's files on a node, from the controller: the ``jobctl`` program's ``list`` and
``read`` (cpuaccel.node.runfiles), each call bounded by a timeout.

What a node answers is checked before a path or a call is made of it: a listed name
must be one the node's ``read`` would read (``node.runfiles.is_run_file``: a plain name,
directly in the run folder or its ``attempt-N/``), else it is left out; a size, an
mtime or an offset must be a finite number in range, and a read's offsets must follow
from the request and the bytes it carries, else the answer is a HostError naming the
node (an answer cpuaccel's program never gives: one line, exit 69, no traceback).
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cpuaccel.connectors import programs
from cpuaccel.connectors.base import Connector
from cpuaccel.errors import HostError, NotALog
from cpuaccel.jsonsource import Refused, loads
from cpuaccel.node.runfiles import is_run_file

CALL_TIMEOUT = 15.0  # seconds one list or read may take before the caller moves on
CHUNK = 4 * 1024 * 1024  # bytes asked for at once
MAX_SIZE = 1 << 62  # bytes: a larger size is no file's
MAX_MTIME = float(1 << 33)  # seconds since 1970 (the year 2242): a later mtime is no file's
_HINT = "the node's answer is not cpuaccel's node program's: check the node"


@dataclass(frozen=True)
class RemoteFile:
    name: str
    size: int
    mtime: float


def _count(value: Any, limit: int = MAX_SIZE) -> int | None:
    """``value`` when it is a whole number (not a bool) in 0..limit, else None."""
    if type(value) is int and 0 <= value <= limit:
        return value
    return None


def _entry(host: str, entry: Any) -> RemoteFile | None:
    """One ``[name, size, mtime]`` of a listing; None for a name ``read`` would refuse
    (the node lists every file of the folder); HostError when the entry is malformed."""
    if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], str)):
        raise HostError(
            host, f"listing the run's files: a malformed entry {entry!r:.80}", hint=_HINT
        )
    name, size, mtime = entry
    if not is_run_file(name):
        return None
    ok_time = type(mtime) in (int, float) and math.isfinite(mtime) and 0 <= mtime < MAX_MTIME
    if _count(size) is None or not ok_time:
        raise HostError(
            host,
            f"listing the run's files: {name} has size {size!r} and mtime {mtime!r}, "
            "not a byte count and a time",
            hint=_HINT,
        )
    return RemoteFile(name, size, float(mtime))


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
    host = conn.host.name
    if not isinstance(files, list):
        raise HostError(host, f"{what}: the answer holds no list of files", hint=_HINT)
    return [f for f in (_entry(host, entry) for entry in files) if f is not None]


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
    return _checked_read(conn.host.name, name, found, offset, limit)


def _checked_read(
    host: str, name: str, found: dict[str, Any], offset: int, limit: int
) -> tuple[bytes, int, int]:
    """A read's answer as (bytes, new offset, size), when it is one the node's ``read``
    gives: base64 of at most ``limit`` bytes, read from ``offset`` (or from 0 when the
    file is now shorter than it)."""
    size, new = _count(found.get("size")), _count(found.get("offset"))
    try:
        data = base64.b64decode(str(found["data"]), validate=True)
    except (binascii.Error, ValueError):
        data = None
    start = offset if size is not None and offset <= size else 0
    # Not "new <= size": a file being appended to may grow between the node's stat and
    # its read.
    if data is None or size is None or new is None or len(data) > limit or new != start + len(data):
        shown = {k: found.get(k) for k in ("offset", "size")}
        raise HostError(
            host,
            f"reading {name}: the answer does not fit the request ({shown!r:.120})",
            hint=_HINT,
        )
    return data, new, size


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


class HeadFiles:
    """The run folder on the head of a detached run, read with the ``read`` operation
    (history/rank_logs.Files)."""

    def __init__(self, head: str, where: str, conn: Callable[[], Connector]) -> None:
        self.head = head  # the head's name, for messages
        self.where = where
        self.conn = conn

    def read(self, name: str, offset: int) -> tuple[bytes, int]:
        """As LocalFiles.read, the head's ``read`` doing the same checks: what it
        refuses (an error, where a missing file is no error) and does not list (only
        regular files are) is NotALog; any other error is the head's."""
        try:
            return read_new(self.conn(), self.where, name, offset)
        except HostError:
            listed = list_files(self.conn(), self.where)
            if listed is None or name in {f.name for f in listed}:
                raise
            raise NotALog(
                f"{self.where}/{name} on {self.head}: not a regular file, not a log: not read"
            ) from None

    def state(self) -> str:
        data, _, _ = read(self.conn(), self.where, "status.json")
        try:
            status = loads(data) if data else None
        except Refused as exc:  # too large or nested too deep: not the supervisor's
            raise HostError(
                self.head,
                f"{self.where}/status.json: not read: {exc}",
                hint="check the run folder on the head: cpuaccel never writes it so",
            ) from None
        except ValueError:
            status = None  # being written: running still, as far as anyone knows
        return str(status.get("state", "running")) if isinstance(status, dict) else "running"
