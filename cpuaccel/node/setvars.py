"""The setvars module: find an Intel oneAPI environment script and check that it sources."""

from __future__ import annotations

import os
import sys

from cpuaccel.node.common import which, write_atomic
from cpuaccel.node.moduleutil import (
    MARK,
    Fail,
    expand,
    last_line,
    run,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from cpuaccel.node.moduleutil import Reply


def _sourced_env(shell: str, step: str, path: str) -> tuple[int, dict[str, str] | None, str]:
    """The environment after ``step`` in a fresh shell. The file is $f with no positional
    arguments: a sourced setvars.sh would read ours as its own options."""
    rc, out, err, timed_out = run(
        [shell, "-c", f"f=$1; shift; {step}; echo {MARK}; env", "_", path], timeout=120
    )
    _, mark, tail = out.partition(MARK + "\n")
    if rc or timed_out or not mark:
        return rc, None, "timed out" if timed_out else last_line(err)
    env: dict[str, str] = {}
    name = None
    for line in tail.splitlines():
        key, eq, value = line.partition("=")
        if eq and key.isidentifier():
            name = key
            env[name] = value
        elif name is not None:  # a value with newlines
            env[name] += "\n" + line
    return rc, env, err


def mod_setvars(args: dict[str, Any], check: bool, diff: bool) -> Reply:
    prefix = os.path.dirname(os.path.dirname(expand(args.get("python") or sys.executable)))
    candidates = [expand(p) for p in args.get("paths") or []]
    if args.get("search", True):
        candidates += [
            "/opt/intel/oneapi/setvars.sh",
            expand("~/intel/oneapi/setvars.sh"),
            os.path.join(prefix, "env", "setvars.sh"),  # oneccl_bind_pt and impi-rt wheels
            os.path.join(prefix, "env", "vars.sh"),
        ]
        if os.environ.get("ONEAPI_ROOT"):
            candidates.append(os.path.join(os.environ["ONEAPI_ROOT"], "setvars.sh"))
    tried = list(dict.fromkeys(candidates))
    path = next((p for p in tried if os.path.isfile(p)), None)
    reply: Reply = {"found": path is not None, "path": path, "sets": [], "changed": False}
    if path is None:
        msg = (
            f"no oneAPI environment script found (tried {', '.join(tried) or 'nothing'}): "
            "install oneAPI, or set cpuaccel_setvars to the file"
        )
        reply.update(failed=bool(args.get("required")), msg=msg, tried=tried)
        return reply
    shell = "/bin/bash" if os.path.exists("/bin/bash") else which("bash") or "/bin/sh"
    _, plain, _ = _sourced_env(shell, ":", path)
    rc, env, why = _sourced_env(shell, '. "$f" >/dev/null', path)
    if env is None or plain is None:
        raise Fail(
            f"{path} cannot be sourced ({shell} exit {rc}{': ' + why if why else ''})", **reply
        )
    reply["sets"] = sorted(k for k, v in env.items() if plain.get(k) != v)
    if args.get("record"):
        record = expand(args["record"])
        try:
            with open(record, encoding="utf-8") as f:
                current: str | None = f.read()
        except OSError:
            current = None
        if current != path + "\n":
            reply["changed"] = True
            if not check:
                os.makedirs(os.path.dirname(record) or ".", exist_ok=True)
                write_atomic(record, (path + "\n").encode(), durable=True)
    return reply
