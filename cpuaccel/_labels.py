"""Label every line a rank writes, C-level writes included, from a forked helper.

Hydra's own ``-prepend-rank`` labels each chunk it reads, not each line, and mangles
output written in pieces. Here fds 1 and 2 are pointed at pipes read by a forked child,
which writes whole labelled lines to the original outputs. Being a separate process,
it still drains what a crashing rank wrote: it ends on EOF, when the rank is gone.

The labeller belongs to the rank's own process, which outlives the script's: when the
script's process has exited, its output is drained for a few seconds at most. A process
the script left holding the pipes (a background helper, or a library's copy of stderr
in a child) would keep the labeller, and so the rank, from ever ending: each one is
found by the pipes it holds, ended, and named in one line.

cpuaccel's own lines (the progress markers of ``run --hang-timeout``) go through a third
pipe of their own (``control``), to the original stderr: a user's unfinished line (a
progress bar's ``\r`` updates) is never joined to one of them, nor one of them to it.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import time

# How long the labeller may take to drain once the script has exited, and how long a
# process still holding the pipes then has to end on SIGTERM before it gets SIGKILL.
DRAIN_SECONDS = 3.0
TERM_GRACE_SECONDS = 1.0

_child: int | None = None
_saved: tuple[int, int] | None = None
_control: int | None = None  # the write end of cpuaccel's own lines' pipe
_label = b""
_pipes: frozenset[int] = frozenset()  # the inodes of the labeller's pipes


def _pump(label: bytes, sources: dict[int, int]) -> None:
    """Copy lines from each pipe fd to its output fd, labelled; return at EOF on all."""
    pending = {fd: b"" for fd in sources}
    while pending:
        ready, _, _ = select.select(list(pending), [], [])
        for fd in ready:
            chunk = os.read(fd, 65536)
            out = sources[fd]
            if not chunk:
                if pending[fd]:
                    os.write(out, label + pending[fd] + b"\n")
                del pending[fd]
                continue
            buffered = pending[fd] + chunk
            *lines, pending[fd] = buffered.split(b"\n")
            if lines:
                os.write(out, b"".join(label + line + b"\n" for line in lines))


def install(label: str) -> None:
    global _child, _saved, _control, _label, _pipes
    sys.stdout.flush()
    sys.stderr.flush()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    ctl_r, ctl_w = os.pipe()  # not inherited by a program the script execs
    _pipes = frozenset(os.fstat(fd).st_ino for fd in (out_r, err_r, ctl_r))
    saved = (os.dup(1), os.dup(2))
    pid = os.fork()
    if pid == 0:  # the labeller
        try:
            # The signals that end a job (MPI's SIGTERM to the rank's process group,
            # Ctrl-C, a lost terminal) are for the rank: the labeller ends at EOF, once
            # the rank has said how it ended (finish() bounds that wait), so that the
            # rank's last lines, its exit marker among them, are never lost.
            for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                signal.signal(signum, signal.SIG_IGN)
            os.close(out_w)
            os.close(err_w)
            os.close(ctl_w)
            _pump(label.encode(), {out_r: saved[0], err_r: saved[1], ctl_r: saved[1]})
        finally:
            os._exit(0)
    os.close(out_r)
    os.close(err_r)
    os.close(ctl_r)
    _control = ctl_w
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    os.close(out_w)
    os.close(err_w)
    # Line-buffered, so that lines reach the labeller (and the user) as they are printed.
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    sys.stderr.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    _child, _saved, _label = pid, saved, label.encode()


def forget() -> None:
    """In a child of the labelled process (the script's): the labeller and the copies
    of the original outputs are the parent's; only the pipes stay, as fds 1, 2 and
    :func:`control`'s."""
    global _child, _saved
    if _saved is not None:
        for fd in _saved:
            with contextlib.suppress(OSError):
                os.close(fd)
    _child = _saved = None


def control(text: str) -> None:
    """One whole line of cpuaccel's own, labelled like the rank's (one write: shorter than
    PIPE_BUF, so never split); on stderr as it is when no labeller runs."""
    data = (text + "\n").encode()
    with contextlib.suppress(OSError):  # the labeller is gone: the rank is ending
        os.write(2 if _control is None else _control, data)


def finish() -> None:
    """Give the outputs back and wait for the labeller to drain: once the script's
    process has exited, for DRAIN_SECONDS at most. Whatever still holds the pipes then
    is ended, and named in one line each after the rank's last output."""
    global _child, _saved, _control
    if _child is None or _saved is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(_saved[0], 1)
    os.dup2(_saved[1], 2)
    if _control is not None:
        os.close(_control)
    ended: list[tuple[int, str]] = []
    if not _reaped(_child, DRAIN_SECONDS):
        ended = _end_holders(_pipes, {os.getpid(), _child})
        if not _reaped(_child, DRAIN_SECONDS):  # its own output is stuck: the rank ends
            with contextlib.suppress(ProcessLookupError):
                os.kill(_child, signal.SIGKILL)
            os.waitpid(_child, 0)
    for pid, command in ended:
        line = f"[cpuaccel] a process of the script (pid {pid}, {command}) still held its "
        with contextlib.suppress(OSError):
            os.write(_saved[1], _label + (line + "output at exit: ended it\n").encode())
    _child = _saved = _control = None


def _reaped(pid: int, seconds: float) -> bool:
    """Whether child ``pid`` ended (and was reaped) within ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def holders(pipes: frozenset[int], exclude: set[int]) -> dict[int, str]:
    """pid -> command line of each process (but ``exclude``) with an fd on one of the
    pipes of these inodes. Only processes that inherited them can: the match is exact."""
    links = {f"pipe:[{inode}]" for inode in pipes}
    found: dict[int, str] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in exclude:
            continue
        try:
            fds = os.listdir(f"/proc/{name}/fd")
            if any(os.readlink(f"/proc/{name}/fd/{fd}") in links for fd in fds):
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    words = f.read().rstrip(b"\0").split(b"\0")
                found[int(name)] = b" ".join(words).decode(errors="replace")[:200]
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


def _end_holders(pipes: frozenset[int], exclude: set[int]) -> list[tuple[int, str]]:
    """End each process still holding the pipes, by its pid: SIGTERM, then SIGKILL to
    any still there after TERM_GRACE_SECONDS. Returns those found, as (pid, command)."""
    found: dict[int, str] = {}
    for sig in (signal.SIGTERM, signal.SIGKILL):
        now = holders(pipes, exclude)
        found.update(now)
        for pid in now:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + TERM_GRACE_SECONDS
        while holders(pipes, exclude) and time.monotonic() < deadline:
            time.sleep(0.05)
    return sorted(found.items())
