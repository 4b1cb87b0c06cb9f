"""The request loop: one JSON request a line on stdin, one reply a line on stdout."""

from __future__ import annotations

import json
import os
import sys

from cpuaccel.node.boundedjson import loads
from cpuaccel.node.facts import collect
from cpuaccel.node.files import (
    mod_command,
    mod_copy,
    mod_destination,
    mod_file,
    mod_stat,
    mod_tree,
)
from cpuaccel.node.moduleutil import Fail
from cpuaccel.node.pip import mod_pip
from cpuaccel.node.setvars import mod_setvars

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from cpuaccel.node.moduleutil import Handler, Reply


def mod_facts(args: dict[str, Any], check: bool, diff: bool) -> Reply:
    """Run cpuaccel's fact probe (a part of this program) in this process: gathering
    facts then costs the node no interpreter start of its own."""
    return {"changed": False, "facts": collect(dict(args.get("request") or {}))}


MODULES: dict[str, Handler] = {
    "command": mod_command,
    "file": mod_file,
    "copy": mod_copy,
    "stat": mod_stat,
    "tree": mod_tree,  # synchronize's quick check (not a playbook module)
    "destination": mod_destination,  # synchronize's delete: may it own dest? (idem)
    "pip": mod_pip,
    "setvars": mod_setvars,
    "facts": mod_facts,  # Gathering Facts (not a playbook module)
}


def handle(request: dict[str, Any]) -> Reply:
    """One request's reply; whatever goes wrong becomes a failed reply, never an exit."""
    reply: Reply = {"id": request.get("id"), "changed": False, "failed": False}
    handler = MODULES.get(str(request.get("module")))
    try:
        if handler is None:
            raise Fail(f"unknown module {request.get('module')}")
        result = handler(
            dict(request.get("args") or {}), bool(request.get("check")), bool(request.get("diff"))
        )
    except Fail as exc:
        result = {**exc.fields, "failed": True, "msg": exc.msg}
    except Exception as exc:
        result = {"failed": True, "msg": f"{type(exc).__name__}: {exc}"}
    reply.update(result)
    return reply


def main() -> None:
    # Replies get a private copy of stdout; fd 1 itself becomes stderr, so that nothing
    # else (a stray print, a child that inherits fd 1) can break the line protocol.
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def send(message: Reply) -> None:
        out.write(json.dumps(message, default=str) + "\n")
        out.flush()

    version = ".".join(str(p) for p in sys.version_info[:3])
    send({"ready": True, "python": sys.executable, "version": version})
    while True:
        line = sys.stdin.buffer.readline()  # the buffer BOOT read the source from
        if not line:
            return
        if not line.strip():
            continue
        try:
            request = loads(line)
            if not isinstance(request, dict):
                raise ValueError("a request is a JSON object")
        except ValueError as exc:
            send({"id": None, "changed": False, "failed": True, "msg": f"bad request: {exc}"})
            continue
        send(handle(request))
