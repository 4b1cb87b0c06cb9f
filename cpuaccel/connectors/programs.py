"""Run one of cpuaccel's stdlib-only node programs on a host, with data on stdin.

The node needs nothing but a Python: the program's source travels on stdin, followed by
its payload, as ``python -c BOOT LENGTH ARGS...``; BOOT reads LENGTH bytes of stdin as
the program and runs it, leaving the rest of stdin to the program. The program prints
one JSON object (its report).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, BinaryIO

from cpuaccel.connectors.base import Connector
from cpuaccel.errors import HostError

BOOT = "import sys;exec(compile(sys.stdin.buffer.read(int(sys.argv[1])),'cpuaccel','exec'))"


@functools.cache
def _source(path: str) -> bytes:
    return Path(path).read_bytes()


class _Chain:
    """A readable stream: some bytes, then a file."""

    def __init__(self, head: bytes, tail: BinaryIO) -> None:
        self._head = head
        self._tail = tail

    def read(self, size: int = -1) -> bytes:
        if size < 0:
            head, self._head = self._head, b""
            return head + self._tail.read()
        if self._head:
            chunk, self._head = self._head[:size], self._head[size:]
            return chunk
        return self._tail.read(size)


def call(
    conn: Connector,
    program: ModuleType,
    args: Sequence[str],
    payload: bytes | BinaryIO = b"",
    *,
    what: str,
    timeout: float = 600.0,
) -> dict[str, Any]:
    """Run ``program`` (a module of cpuaccel) on the host; return its report.

    ``what`` names the operation in error messages ("syncing to /x", "writing the run").
    """
    assert program.__file__ is not None
    source = _source(program.__file__)
    stdin: bytes | BinaryIO
    stdin = source + payload if isinstance(payload, bytes) else _Chain(source, payload)  # type: ignore[assignment]
    argv = [conn.host.python, "-c", BOOT, str(len(source)), *args]
    result = conn.run(argv, stdin=stdin, timeout=timeout)
    if result.exit_code in (126, 127):
        raise HostError(
            conn.host.name,
            f"cpuaccel_python {conn.host.python!r} cannot be run on the node",
            hint="set cpuaccel_python to the node's interpreter, or run cpuaccel provision",
        )
    if not result.ok:
        last = (result.stderr.strip().splitlines() or ["no message"])[-1]
        raise HostError(conn.host.name, f"{what} failed on the node: {last}")
    try:
        value = json.loads(result.stdout)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise HostError(
            conn.host.name,
            f"{what}: the node program's answer was not understood "
            f"(first bytes: {result.stdout[:80]!r})",
            hint="a login script on the node may print text; make it quiet for "
            "non-interactive shells",
        )
    return value
