"""Run cpuaccel's node programs (cpuaccel.node) on a host: one protocol, one error
translation.

The node needs nothing but a Python: the program's source travels on stdin, followed by
its payload, as ``python -c BOOT LENGTH WORD...``; BOOT reads LENGTH bytes of stdin as
the program and runs it, leaving the rest of stdin to the program. The words after
LENGTH are the request (the operation and its arguments); the answer is one JSON object
on stdout. The playbook agent boots the same way and then stays, one JSON line each way
per request (cpuaccel.playbook.session).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, BinaryIO

from cpuaccel import node
from cpuaccel.connectors.base import CommandResult, Connector
from cpuaccel.errors import HostError

BOOT = "import sys;exec(compile(sys.stdin.buffer.read(int(sys.argv[1])),'cpuaccel','exec'))"
PYTHON_HINT = "set cpuaccel_python to the node's interpreter, or run cpuaccel provision"


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


def argv(python: str, program: str, words: Sequence[str] = ()) -> list[str]:
    """The command that boots ``program`` (its source to be sent first on stdin)."""
    return [python, "-c", BOOT, str(len(node.program(program))), *words]


def call(
    conn: Connector,
    program: str,
    words: Sequence[str],
    payload: bytes | BinaryIO = b"",
    *,
    what: str,
    timeout: float = 600.0,
    python: str | None = None,
) -> dict[str, Any]:
    """Run node program ``program`` (a name of cpuaccel.node.PROGRAMS) with the request
    ``words`` on the host; return its answer.

    ``what`` names the operation in error messages ("syncing to /x", "the fact probe");
    ``python`` is the interpreter to use, by default the host's ``cpuaccel_python``.
    """
    python = python or conn.host.python
    source = node.program(program)
    stdin: bytes | BinaryIO
    stdin = source + payload if isinstance(payload, bytes) else _Chain(source, payload)  # type: ignore[assignment]
    result = conn.run(argv(python, program, words), stdin=stdin, timeout=timeout)
    return answer(conn.host.name, python, result, what)


def answer(host: str, python: str, result: CommandResult, what: str) -> dict[str, Any]:
    """A node program's answer, or the HostError that says why there is none."""
    last = (result.stderr.strip().splitlines() or ["no message"])[-1]
    if result.exit_code in (126, 127):  # the shell's "not executable" / "not found"
        raise interpreter_error(host, python, last)
    if not result.ok:
        old = "SyntaxError" in result.stderr  # the node's Python is older than 3.8
        raise HostError(
            host,
            f"{what} failed on the node (exit code {result.exit_code}): {last}",
            hint=f"check that {python} is Python 3.8 or newer" if old else None,
        )
    try:
        value = json.loads(result.stdout)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise HostError(
            host,
            f"{what}: the node program's answer was not understood "
            f"(first bytes: {result.stdout[:80]!r})",
            hint="a login script on the node may print text; make it quiet for "
            "non-interactive shells",
        )
    return value


def interpreter_error(host: str, python: str, detail: str, hint: str = PYTHON_HINT) -> HostError:
    return HostError(
        host, f"the interpreter {python!r} cannot be run on the node: {detail}", hint=hint
    )
