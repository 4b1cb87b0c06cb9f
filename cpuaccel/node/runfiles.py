"""Reading a run's files on a node: the ``list`` and ``read`` operations of ``jobctl``.

Part of cpuaccel's node package (see ``cpuaccel.node``): stdlib only, Python 3.8+.

  list RUN_DIR                  {"files": [[name, size, mtime], ...]} (None: no such run)
  read RUN_DIR NAME OFFSET LIMIT
                                {"data": base64, "offset": new offset, "size": file size}

Only regular files directly in RUN_DIR (WORKDIR/runs/RUN_ID) or in its ``attempt-N/``
folders are listed or read. The run folder and each file are reached by descriptors
with O_NOFOLLOW: a link put in a run folder leads nowhere else. secret.env (the job's
secrets, there while it runs) and hidden files (atomic writes in progress) are never
listed nor read.
"""

from __future__ import annotations

import base64
import os
import re
import stat

from cpuaccel.node.nofollow import FOLDER, folder_at

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

SECRET = "secret.env"
MAX_READ = 8 * 1024 * 1024  # bytes one answer carries (base64 in JSON: ~11 MB)
# \Z, not $: "$" also matches before a newline that ends the name.
_NAME = re.compile(r"^(attempt-[0-9]+/)?[A-Za-z0-9_][A-Za-z0-9_.+-]*\Z")
_ATTEMPT = re.compile(r"^attempt-[0-9]+\Z")
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_FOLLOW = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def run_folder(run_dir: str) -> int | None:
    """A descriptor of RUN_DIR, or None when it is missing. The workdir may be a link
    (the user's layout); ``runs`` and the run's folder are cpuaccel's: never followed."""
    runs_path, run_id = os.path.split(run_dir.rstrip("/"))
    workdir, runs = os.path.split(runs_path)
    try:
        top = os.open(workdir or ".", _FOLLOW)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        below = folder_at(top, runs, create=False)
        if below is None:
            return None
        try:
            return folder_at(below, run_id, create=False)
        finally:
            os.close(below)
    finally:
        os.close(top)


def _entries(folder: int, prefix: str) -> list[list[Any]]:
    found = []
    for name in sorted(os.listdir(folder)):
        if name.startswith(".") or name == SECRET:
            continue
        try:
            info = os.stat(name, dir_fd=folder, follow_symlinks=False)
        except FileNotFoundError:
            continue  # removed meanwhile
        if stat.S_ISREG(info.st_mode):
            found.append([prefix + name, info.st_size, info.st_mtime])
        elif not prefix and stat.S_ISDIR(info.st_mode) and _ATTEMPT.match(name):
            sub = os.open(name, FOLDER, dir_fd=folder)
            try:
                found.extend(_entries(sub, name + "/"))
            finally:
                os.close(sub)
    return found


def list_files(run_dir: str) -> dict[str, Any]:
    folder = run_folder(run_dir)
    if folder is None:
        return {"files": None}
    try:
        return {"files": _entries(folder, "")}
    finally:
        os.close(folder)


def is_run_file(name: str) -> bool:
    """Whether ``name`` is one ``read`` reads: a plain name (letters, digits, ``_.+-``,
    not hidden, no ``..``), directly in the run folder or in its ``attempt-N/``, and not
    secret.env. The controller checks the names a node lists with it too, before it
    makes a path of one."""
    return bool(_NAME.match(name)) and ".." not in name and name.rsplit("/", 1)[-1] != SECRET


def check_name(name: str) -> None:
    if not is_run_file(name):
        raise ValueError(f"refusing to read {name!r}: not a file of a run folder")


def read_file(run_dir: str, name: str, offset: int, limit: int) -> dict[str, Any]:
    check_name(name)
    folder = run_folder(run_dir)
    if folder is None:
        return {"data": None, "offset": offset, "size": None}
    try:
        sub, _, base = name.rpartition("/")
        at = os.open(sub, FOLDER, dir_fd=folder) if sub else folder
        try:
            fd = os.open(
                base, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=at
            )
        except FileNotFoundError:
            return {"data": None, "offset": offset, "size": None}
        finally:
            if sub:
                os.close(at)
    finally:
        os.close(folder)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):  # a FIFO or device would hang or never end
            raise ValueError(f"refusing to read {name!r}: not a regular file")
        # A file cut shorter (rewritten) is read again from its start.
        start = offset if 0 <= offset <= info.st_size else 0
        os.lseek(fd, start, os.SEEK_SET)
        data = os.read(fd, max(0, min(limit, MAX_READ)))
    finally:
        os.close(fd)
    return {
        "data": base64.b64encode(data).decode("ascii"),
        "offset": start + len(data),
        "size": info.st_size,
    }


def operation(mode: str, args: list[str]) -> dict[str, Any]:
    """The ``jobctl`` program's ``list`` and ``read`` (its main() dispatches here)."""
    if mode == "list":
        return list_files(args[0])
    try:
        return read_file(args[0], args[1], int(args[2]), int(args[3]))
    except ValueError as exc:  # one line, the controller's error: no traceback
        raise SystemExit(str(exc)) from None
    except OSError as exc:  # a link in the way (ELOOP), a folder by that name ...
        raise SystemExit(f"cannot read {args[1]!r}: {exc.strerror}") from None
