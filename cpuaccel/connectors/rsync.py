"""Running rsync on the controller, for the connectors' ``rsync()``.

The connector decides where the files go (a local path, or ``host:path`` over its own
ssh argv); ``rsync_argv`` builds the one argv shape, and ``run_rsync`` runs it and
collects what every caller needs: the exit code, the ``--out-format`` lines and the last
line of stderr, which says why rsync failed.
"""

from __future__ import annotations

import contextlib
import functools
import re
import shlex
import subprocess
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO

from cpuaccel.connectors import commandline


@dataclass(frozen=True)
class RsyncResult:
    exit_code: int
    lines: list[str]  # stdout's lines, unless they went to on_line
    error: str  # the last line of stderr, or "no message"
    stderr: str = ""  # all of it: what ssh said before rsync's own last words

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


@functools.cache
def secluded_flag() -> tuple[str, ...]:
    """The flag that sends file names through rsync's protocol instead of the node's
    shell command line, so that no shell ever splits or expands a destination: named
    ``--secluded-args`` since rsync 3.2.6, ``--protect-args`` from 3.0.0 (both ``-s``).
    Asked of the installed rsync once."""
    try:
        out = subprocess.run(
            ["rsync", "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ()  # no rsync here: the caller's rsync fails and says so
    found = re.search(r"version\s+v?(\d+)\.(\d+)\.(\d+)", out)
    version = tuple(int(part) for part in found.groups()) if found else (0, 0, 0)
    if version >= (3, 2, 6):
        return ("--secluded-args",)
    return ("--protect-args",) if version >= (3, 0, 0) else ()


def rsync_argv(
    flags: Sequence[str], source: str | list[str], dest: str, ssh: Sequence[str] | None = None
) -> list[str]:
    """``rsync FLAGS [-e SSH] -- SOURCE... DEST``: with the secluded-args flag, and ``--``
    before the paths and at the end of the ssh command (rsync appends the host there),
    so that neither a path nor a host is ever read as an option."""
    argv = ["rsync", *secluded_flag(), *flags]
    if ssh is not None:
        argv += ["-e", shlex.join([*ssh, "--"])]
    return [*argv, "--", *([source] if isinstance(source, str) else source), dest]


SHOWN_SOURCES = 3  # -vv's line names this many sources, then how many more


def shown_rsync(argv: Sequence[str]) -> str:
    """-vv's line for an argv of :func:`rsync_argv`: a sync may name thousands of
    sources, of which the line shows the first few and a count of the rest."""
    cut = list(argv).index("--") + 1
    sources = argv[cut:-1]
    if len(sources) <= SHOWN_SOURCES:
        return commandline.shown_line(argv)
    kept = [*argv[:cut], *sources[:SHOWN_SOURCES], argv[-1]]
    return f"{commandline.shown_line(kept)} ({len(sources) - SHOWN_SOURCES} more sources)"


def run_rsync(
    argv: Sequence[str],
    *,
    stdin: bytes | None = None,
    on_line: Callable[[str], None] | None = None,
) -> RsyncResult:
    """Run rsync's argv; stdout is read as it comes, so that on_line can show progress."""
    err: list[bytes] = []
    lines: list[str] = []
    with subprocess.Popen(
        list(argv),
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        # stdin and stderr on threads: a long file list or a chatty failure fills a pipe
        # while we wait on stdout, and neither side would move again.
        helpers = [threading.Thread(target=_drain, args=(proc.stderr, err), daemon=True)]
        if stdin is not None:
            helpers.append(threading.Thread(target=_feed, args=(proc.stdin, stdin), daemon=True))
        for helper in helpers:
            helper.start()
        for raw in proc.stdout:
            line = raw.decode(errors="replace").rstrip("\r\n")
            if on_line is not None:
                on_line(line)
            else:
                lines.append(line)
        for helper in helpers:
            helper.join()
        code = proc.wait()
    said = b"".join(err).decode(errors="replace")
    last = (said.strip().splitlines() or ["no message"])[-1]
    return RsyncResult(code, lines, last, said)


def _feed(pipe: IO[bytes] | None, data: bytes) -> None:
    assert pipe is not None
    with contextlib.suppress(OSError):  # rsync ended early: its exit code says why
        pipe.write(data)
    with contextlib.suppress(OSError):
        pipe.close()


def _drain(pipe: IO[bytes], into: list[bytes]) -> None:
    while chunk := pipe.read(65536):
        into.append(chunk)
