"""One reader for the JSON cpuaccel reads from disk and from nodes: run records
(run.json, status.json, attempts and checkpoints lines), metrics.jsonl, the answers of
node programs and of the playbook agent, caches and stamps.

The parsing is ``cpuaccel.node.boundedjson``'s, the same the node programs use: a value
nested more than MAX_DEPTH levels deep, or a text larger than its bound, is refused with
a ``Refused`` (a ValueError) whose message is one line, never a RecursionError. Each
caller turns a refusal into its source's error: a record left out with that line
(``ps``, ``report``, the dashboard), a file:line error (``report``'s metrics), a HostError
(a node's answer). ``read_file`` reads a file of cpuaccel's own within MAX_RECORD_BYTES.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from cpuaccel.node.boundedjson import MAX_DEPTH, Refused, describe, lines, loads

__all__ = ["MAX_DEPTH", "MAX_RECORD_BYTES", "Refused", "describe", "lines", "loads", "read_file"]

MAX_RECORD_BYTES = 1024 * 1024  # a record larger than this is not one of cpuaccel's
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def read_file(path: str | os.PathLike[str], limit: int = MAX_RECORD_BYTES) -> Any:
    """The JSON value in the regular file at ``path``, reached without following a link
    and read without blocking (a FIFO there is refused, not waited on); None when there
    is no such file. ``Refused`` (one line: why) when it is something else than a
    regular file, larger than ``limit`` bytes, or not JSON within the bounds."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise Refused(f"cannot be read: {exc.strerror or exc}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise Refused("not a regular file")
        data = os.read(fd, limit + 1)
    except OSError as exc:
        raise Refused(f"cannot be read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise Refused(f"larger than {limit:,} bytes")
    try:
        return loads(data)
    except ValueError as exc:
        raise Refused(describe(exc)) from None


def read_object(path: Path, problems: list[str]) -> dict[str, Any] | None:
    """The JSON object in ``path``; None when the file is missing, and also when it
    cannot be read or holds something else, with the one line that says why appended to
    ``problems`` (``NAME: not read: WHY``)."""
    try:
        value = read_file(path)
    except Refused as exc:
        problems.append(f"{path.name}: not read: {exc}")
        return None
    if value is None:
        return None
    if not isinstance(value, dict):
        problems.append(f"{path.name}: not read: not a JSON object")
        return None
    return value
