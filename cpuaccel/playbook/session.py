"""One resident agent per host for a whole playbook run.

Ansible starts a Python process on the node for every task. Here the agent program
(``cpuaccel.node.program("agent")``, stdlib only) is started once per host over the
host's open connection, and each task is one JSON line each way on that channel: a task
that changes nothing costs a message, not an interpreter start, which is what makes a
no-op re-run fast.
"""

from __future__ import annotations

import itertools
import json
from collections import deque
from collections.abc import Iterator
from typing import Any

from cpuaccel import node
from cpuaccel.connectors import programs
from cpuaccel.connectors.base import Connector, Process
from cpuaccel.errors import HostError


class AgentSession:
    """Requests to the agent on one host; not thread-safe (one task at a time per host)."""

    def __init__(self, conn: Connector, python: str) -> None:
        self.conn = conn
        self.python = python
        self._ids = itertools.count(1)
        self._stderr: deque[str] = deque(maxlen=20)
        self._process: Process = conn.start(programs.argv(python, "agent"))
        self._lines: Iterator[tuple[str, str]] = self._process.lines()
        self._send(node.program("agent"))
        hello = self._reply(None)
        self.info = hello

    @property
    def host(self) -> str:
        return self.conn.host.name

    def _send(self, data: bytes) -> None:
        try:
            self._process.send(data)
        except (OSError, ValueError) as exc:
            raise self._died(f"cannot write to it: {exc}") from None

    def _died(self, why: str) -> HostError:
        tail = [line for line in self._stderr if line.strip()]
        last = tail[-1] if tail else "no message"
        if any("not found" in line or "No such file" in line for line in tail[-3:]):
            hint = "set ansible_python_interpreter to a Python 3.8+ on the node"
            return programs.interpreter_error(self.host, self.python, last, hint)
        return HostError(self.host, f"the cpuaccel agent ended ({why}): {last}")

    def _reply(self, want: int | None) -> dict[str, Any]:
        for stream, line in self._lines:
            if stream == "err":
                self._stderr.append(line)
                continue
            try:
                value = json.loads(line)
            except ValueError:
                # A login script printing text would land here: keep it for the message.
                self._stderr.append(line)
                continue
            if not isinstance(value, dict):
                continue
            if want is None and value.get("ready"):
                return value
            if value.get("id") == want:
                return value
        raise self._died("its output closed")

    def request(
        self, module: str, args: dict[str, Any], *, check: bool, diff: bool
    ) -> dict[str, Any]:
        ident = next(self._ids)
        message = {"id": ident, "module": module, "args": args, "check": check, "diff": diff}
        self._send(json.dumps(message).encode() + b"\n")
        return self._reply(ident)

    def close(self) -> None:
        self._process.close()
