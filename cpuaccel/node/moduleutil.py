"""What the playbook agent's modules share: the failure type, running a command, and
small coercions of their arguments.

Part of cpuaccel's node package (see ``cpuaccel.node``), carried by the agent only:
stdlib only, Python 3.8+, imports made where they are needed, because the node pays for
each.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time: the node pays for every import
    from collections.abc import Callable
    from typing import Any, TypeAlias

    Reply: TypeAlias = "dict[str, Any]"
    Handler: TypeAlias = "Callable[[dict[str, Any], bool, bool], Reply]"
    Version: TypeAlias = "tuple[Any, ...]"  # (epoch, release, pre, post, dev, local)

DIFF_LIMIT = 64 * 1024  # larger files are reported changed without their text
TAIL = 4000  # characters of pip's output kept in a reply
MARK = "__CPUACCEL_OK__"  # printed once a setvars script is sourced, before its env


class Fail(Exception):
    """A module's failure: its message and any fields for the reply."""

    def __init__(self, msg: str, **fields: Any) -> None:
        super().__init__(msg)
        self.msg = msg
        self.fields = fields


def expand(value: Any) -> str:
    return os.path.expanduser(str(value))


def octal(mode: int) -> str:
    return f"{mode:04o}"


def want_mode(args: dict[str, Any]) -> int | None:
    mode = args.get("mode")
    return None if mode is None else mode if isinstance(mode, int) else int(str(mode), 8)


def as_list(value: Any) -> list[str]:
    return (
        [] if value is None else [str(value)] if isinstance(value, str) else [str(v) for v in value]
    )


def last_line(*texts: str) -> str:
    for text in texts:
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        if lines:
            return lines[-1]
    return ""


def run(
    argv: list[str],
    *,
    cwd: str | None = None,
    env: dict[str, str] | None = None,
    stdin: bytes | None = None,
    timeout: float | None = None,
) -> tuple[int, str, str, bool]:
    """(rc, stdout, stderr, timed out) of argv; output decoded leniently.

    The child never inherits stdin: the agent's stdin carries the requests. It leads a
    session of its own so that a timeout kills what it started too.
    """
    import signal
    import subprocess

    pipe = subprocess.PIPE
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL if stdin is None else pipe,
        stdout=pipe,
        stderr=pipe,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(stdin, timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        timed_out = True
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            proc.kill()  # the group is gone already; make sure of the child itself
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:  # a grandchild left the group, holding the pipes
            out, err = b"", b""
            proc.wait()
    return (
        proc.returncode,
        out.decode("utf-8", "replace"),
        err.decode("utf-8", "replace"),
        timed_out,
    )


def sha1_file(path: str, keep: int = 0) -> tuple[str, bytes | None]:
    """The file's sha1, and its bytes when there are at most ``keep`` of them."""
    import hashlib

    digest, chunks, size = hashlib.sha1(), [], 0
    with open(path, "rb") as f:
        while True:
            chunk = f.read(1 << 20)
            if not chunk:
                break
            digest.update(chunk)
            size += len(chunk)
            if size <= keep:
                chunks.append(chunk)
    return digest.hexdigest(), b"".join(chunks) if size <= keep else None
