"""One resident agent per host for a whole playbook run.

Ansible starts a Python process on the node for every task. Here the agent program
(``cpuaccel.node.program("agent")``, stdlib only) is started once per host over the
host's open connection, and each task is one JSON line each way on that channel: a task
that changes nothing costs a message, not an interpreter start, which is what makes a
no-op re-run fast.

With ``become`` the agent is started under sudo (cpuaccel.playbook.become): sudo's
conversation comes first on the channel, then the program, then the same protocol.
"""

from __future__ import annotations

import itertools
import json
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cpuaccel import node
from cpuaccel.connectors import programs
from cpuaccel.connectors.base import Connector, Process
from cpuaccel.errors import CpuaccelError, HostError
from cpuaccel.inventory.host import Host
from cpuaccel.jsonsource import Refused, loads
from cpuaccel.playbook import become as sudo

Result = dict[str, Any]
DEFAULT_MODULE_PYTHON = "python3"


class AgentSession:
    """Requests to the agent on one host; not thread-safe (one task at a time per host)."""

    def __init__(self, conn: Connector, python: str, become: sudo.Become | None = None) -> None:
        self.conn = conn
        self.python = python
        self._ids = itertools.count(1)
        self._stderr: deque[str] = deque(maxlen=20)
        self._secrets = become.secrets if become else ()
        argv = programs.argv(python, "agent")
        if become is not None:
            argv[2] = sudo.marked_boot(argv[2])
            argv = sudo.sudo_argv(become, argv)
        self._process: Process = conn.start(argv)
        self._lines: Iterator[tuple[str, str]] = self._process.lines()
        if become is not None:
            try:
                sudo.handshake(self._process, self._lines, self.host, become)
            except HostError:
                self._process.close()
                raise
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
        last = sudo.mask(tail[-1], self._secrets) if tail else "no message"
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
                value = loads(line)
            except Refused as exc:
                self._stderr.append(f"(a line of the agent's output refused: {exc})")
                continue
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


def module_python(host: Host) -> str:
    """The interpreter that runs the agent: Ansible's ``ansible_python_interpreter``.

    Not ``cpuaccel_python``: provisioning is what creates that environment.
    """
    return str(host.vars.get("ansible_python_interpreter") or DEFAULT_MODULE_PYTHON)


@dataclass
class HostContext:
    """What a module needs to act on one host."""

    host: Host
    connect: Callable[[], Connector]
    playbook_dir: Path
    check: bool
    diff: bool
    # The current task's become (set per task: one task at a time per host), and one
    # agent per become user (None: the SSH user's own), each started when first needed.
    become: sudo.Become | None = None
    sessions: dict[str | None, AgentSession] = field(default_factory=dict)
    messages: list[str] = field(default_factory=list)
    # What a broadcast across the current task's hosts put in place on this one
    # (playbook.preparing): the task's own run reports it; cleared after the task.
    broadcast: list[str] = field(default_factory=list)
    # A broadcast to this host failed: a file may have taken its name there whose report
    # was not believed, so the task's rsync compares contents (--checksum), not times.
    recheck: bool = False

    def agent(self) -> AgentSession:
        user = self.become.user if self.become else None
        session = self.sessions.get(user)
        if session is None:
            session = AgentSession(self.connect(), module_python(self.host), self.become)
            self.sessions[user] = session
        return session

    def as_ssh_user(self, module: str) -> None:
        """Refuse become for a module that acts through the connection itself."""
        if self.become is not None:
            raise CpuaccelError(
                f"{module} runs as the SSH user and cannot become {self.become.user}",
                hint=f"set 'become: false' on this {module} task",
            )

    def close(self) -> None:
        for session in self.sessions.values():
            session.close()
        self.sessions.clear()

    def request(self, module: str, args: dict[str, Any]) -> Result:
        return self.agent().request(module, args, check=self.check, diff=self.diff)
