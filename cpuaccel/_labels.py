"""Label every line a rank writes, C-level writes included, from a forked helper.

Hydra's own ``-prepend-rank`` labels each chunk it reads, not each line, and mangles
output written in pieces. Here fds 1 and 2 are pointed at pipes read by a forked child,
which writes whole labelled lines to the original outputs. Being a separate process,
it still drains what a crashing rank wrote: it ends on EOF, when the rank is gone.

cpuaccel's own lines (the progress markers of ``run --hang-timeout``) go through a third
pipe of their own (``control``), to the original stderr: a user's unfinished line (a
progress bar's ``\r`` updates) is never joined to one of them, nor one of them to it.
"""

from __future__ import annotations

import contextlib
import os
import select
import sys

_child: int | None = None
_saved: tuple[int, int] | None = None
_control: int | None = None  # the write end of cpuaccel's own lines' pipe


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
    global _child, _saved, _control
    sys.stdout.flush()
    sys.stderr.flush()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    ctl_r, ctl_w = os.pipe()  # not inherited by a program the script execs
    saved = (os.dup(1), os.dup(2))
    pid = os.fork()
    if pid == 0:  # the labeller
        try:
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
    _child, _saved = pid, saved


def control(text: str) -> None:
    """One whole line of cpuaccel's own, labelled like the rank's (one write: shorter than
    PIPE_BUF, so never split); on stderr as it is when no labeller runs."""
    data = (text + "\n").encode()
    with contextlib.suppress(OSError):  # the labeller is gone: the rank is ending
        os.write(2 if _control is None else _control, data)


def finish() -> None:
    """Give the outputs back and wait for the labeller to drain."""
    global _child, _saved, _control
    if _child is None or _saved is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(_saved[0], 1)
    os.dup2(_saved[1], 2)
    if _control is not None:
        os.close(_control)
    os.waitpid(_child, 0)
    _child = _saved = _control = None
