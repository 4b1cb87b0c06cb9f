"""The files this command's own output goes into, which a sync must never send.

``cpuaccel run train.py > train.log`` from the project folder writes train.log while the
sync before the launch reads the folder: the log changes under the sync, every time. Its
stdout and stderr are found by inode (fds 1 and 2). ``| tee train.log`` leaves a pipe on
fd 1: the files written by the process reading that pipe (tee, and a tee after it) are
found through /proc on Linux; elsewhere the sync's retry and its message are the answer.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

FileId = tuple[int, int]  # (st_dev, st_ino)
_PIPE_HOPS = 3  # cpuaccel ... | tee a.log | tee b.log: follow the pipes this far
_PROC = "/proc"


def own_output_files(proc: str = _PROC) -> set[FileId]:
    """The regular files fds 1 and 2 write into, directly or through a pipe's reader."""
    found: set[FileId] = set()
    pipes: set[int] = set()
    for fd in (1, 2):
        try:
            st = os.fstat(fd)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            found.add((st.st_dev, st.st_ino))
        elif stat.S_ISFIFO(st.st_mode):
            pipes.add(st.st_ino)
    for _ in range(_PIPE_HOPS):
        if not pipes:
            break
        files, pipes = _written_by_readers_of(pipes, proc)
        found |= files
    return found


def _written_by_readers_of(pipes: set[int], proc: str) -> tuple[set[FileId], set[int]]:
    """What the processes reading these pipes (on their stdin) write: files, and pipes."""
    wanted = {f"pipe:[{ino}]" for ino in pipes}
    files: set[FileId] = set()
    onward: set[int] = set()
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit() and p != str(os.getpid())]
    except OSError:
        return files, onward  # no /proc (not Linux)
    for pid in pids:
        try:
            if os.readlink(f"{proc}/{pid}/fd/0") not in wanted:
                continue
            fds = os.listdir(f"{proc}/{pid}/fd")
        except OSError:
            continue  # gone, or another user's
        for fd in fds:
            path = f"{proc}/{pid}/fd/{fd}"
            try:
                st = os.stat(path)
                writing = _opened_for_writing(f"{proc}/{pid}/fdinfo/{fd}")
            except OSError:
                continue
            if not writing:
                continue
            if stat.S_ISREG(st.st_mode):
                files.add((st.st_dev, st.st_ino))
            elif stat.S_ISFIFO(st.st_mode) and fd == "1":
                onward.add(st.st_ino)
    return files, onward


def _opened_for_writing(fdinfo: str) -> bool:
    for line in Path(fdinfo).read_text().splitlines():
        if line.startswith("flags:"):
            return int(line.split()[1], 8) & os.O_ACCMODE != os.O_RDONLY
    return False
