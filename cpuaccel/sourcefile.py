"""The one way cpuaccel reads a file a user names: inventory, ``-e @file``, hostfile,
project file, Accelerate config, playbook, a run's metrics.

A path can name something that is not a file: ``/dev/zero`` never ends, a FIFO blocks
until someone writes to it, ``/dev/null`` reads as an empty file. Only a regular file
(after following links) is read; anything else is one error naming it, with the caller's
error class (exit 64). The check is made on the descriptor that is read, so that a path
swapped between the check and the read cannot slip through, and the file is opened
without blocking (a FIFO's open would otherwise wait for a writer). Reading stops past
``MAX_SOURCE_BYTES``: no input cpuaccel reads comes near it.
"""

from __future__ import annotations

import os
import stat

from cpuaccel.errors import SourceError

__all__ = ["MAX_SOURCE_BYTES", "decode_error_line", "kind_of", "read_source"]

MAX_SOURCE_BYTES = 16 * 1024 * 1024
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_KINDS = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def kind_of(mode: int) -> str:
    """What a file that is not a regular file or a folder is, for messages."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def decode_error_line(exc: BaseException) -> int | None:
    """The 1-based line of the first byte that is not UTF-8, for a file that failed to
    decode (None for any other error): so that its error names the line like any other."""
    if not isinstance(exc, UnicodeDecodeError):
        return None
    return bytes(exc.object[: exc.start]).count(b"\n") + 1


def read_source(
    path: str | os.PathLike[str],
    error: type[SourceError],
    what: str,
    hint: str,
    *,
    limit: int | None = MAX_SOURCE_BYTES,
) -> str:
    """The UTF-8 text of the regular file at ``path``; else ``error`` naming it.

    ``what`` names the file for the user ("inventory file", "playbook"); ``hint`` is
    the fix for a wrong path (missing, a folder, a device). ``limit`` bounds the bytes
    read (None: a file that grows with the run, such as its metrics).
    """
    source = os.fspath(path)
    try:
        # stat first: a device is refused without being opened (opening some has effects).
        _require_regular(os.stat(source), source, error, what, hint)
        fd = os.open(source, _OPEN_FLAGS)
    except FileNotFoundError:
        raise error(f"{what} not found", source=source, hint=hint) from None
    except OSError as exc:
        raise _unreadable(source, error, what, exc.strerror or str(exc)) from None
    except ValueError as exc:  # a NUL in the path (a project file can hold one)
        raise _unreadable(source, error, what, str(exc), hint) from None
    try:
        _require_regular(os.fstat(fd), source, error, what, hint)
        data = _read_bounded(fd, limit)
    except OSError as exc:
        raise _unreadable(source, error, what, exc.strerror or str(exc)) from None
    finally:
        os.close(fd)
    if data is None:
        size = f"larger than {(limit or 0) // (1024 * 1024)} MiB"
        raise _unreadable(source, error, what, f"it is {size}", f"check that it is the {what}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(
            f"cannot read the {what}: {exc}",
            source=source,
            line=decode_error_line(exc),
            hint="save it as UTF-8 text",
        ) from None


def _require_regular(
    st: os.stat_result, source: str, error: type[SourceError], what: str, hint: str
) -> None:
    if stat.S_ISREG(st.st_mode):
        return
    if stat.S_ISDIR(st.st_mode):
        raise error(f"{what} is a directory, not a file", source=source, hint=hint)
    kind = kind_of(st.st_mode)
    real = os.path.realpath(source)
    # Through a link, name what it leads to as well: that is what the user must change.
    where = f" ({real})" if real != os.path.abspath(source) else ""
    raise error(f"{what} is {kind}{where}, not a regular file", source=source, hint=hint)


def _read_bounded(fd: int, limit: int | None) -> bytes | None:
    """The file's bytes, or None when there are more than ``limit``."""
    chunks: list[bytes] = []
    size = 0
    while chunk := os.read(fd, 1024 * 1024):
        size += len(chunk)
        if limit is not None and size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _unreadable(
    source: str,
    error: type[SourceError],
    what: str,
    reason: str,
    hint: str = "check the file's permissions",
) -> SourceError:
    return error(f"cannot read the {what}: {reason}", source=source, hint=hint)
