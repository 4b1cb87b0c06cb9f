"""Running rsync on the controller, for the connectors' ``rsync()``.

The connector decides where the files go (a local path, or ``host:path`` over its own
ssh argv); this runs the argv and collects what every caller needs: the exit code, the
``--out-format`` lines and the last line of stderr, which says why rsync failed.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO


@dataclass(frozen=True)
class RsyncResult:
    exit_code: int
    lines: list[str]  # stdout's lines, unless they went to on_line
    error: str  # the last line of stderr, or "no message"

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


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
    last = (b"".join(err).decode(errors="replace").strip().splitlines() or ["no message"])[-1]
    return RsyncResult(code, lines, last)


def _feed(pipe: IO[bytes] | None, data: bytes) -> None:
    assert pipe is not None
    with contextlib.suppress(OSError):  # rsync ended early: its exit code says why
        pipe.write(data)
    with contextlib.suppress(OSError):
        pipe.close()


def _drain(pipe: IO[bytes], into: list[bytes]) -> None:
    while chunk := pipe.read(65536):
        into.append(chunk)
