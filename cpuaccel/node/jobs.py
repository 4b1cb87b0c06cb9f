"""Node-side operations of ``cpuaccel run``: the node program ``jobs`` (with ``common``).

Run as ``python -c BOOT LENGTH MODE ARG [ARG...]`` (cpuaccel.connectors.programs):

  write RUN_DIR      payload: JSON {name: [mode, text]}; each file created with its
                     mode from the start (secret.env is never readable by others), then
                     renamed into place
  procs RUN_ID       the processes of this job on this node
  signal RUN_ID PIDFILE SIG
                     signal the launcher's process group, after checking that its leader
                     really belongs to this job (a stale pid file must not hit another)
  end RUN_ID GRACE   SIGTERM this job's processes, SIGKILL what is left after GRACE s

A process belongs to the job when its environment holds CPUACCEL_RUN_ID=<id> exactly,
and it is ours (same uid): never a pattern over command lines, which would also match
other people's jobs.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

from cpuaccel.node.common import write_atomic

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def _environ_has(pid: int, marker: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return marker in f.read().split(b"\0")
    except OSError:
        return False


def job_pids(run_id: str) -> list[int]:
    marker = b"CPUACCEL_RUN_ID=" + run_id.encode()
    uid, me = os.getuid(), os.getpid()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        pid = int(name)
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
            with open(f"/proc/{pid}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    continue  # a zombie is already dead; its parent will reap it
        except (OSError, IndexError):
            continue
        if _environ_has(pid, marker):
            found.append(pid)
    return sorted(found)


def _describe(pids: list[int]) -> list[tuple[int, str]]:
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            cmd = "?"
        out.append((pid, cmd[:200]))
    return out


def write(run_dir: str, files: dict[str, tuple[int, str]]) -> dict[str, Any]:
    os.makedirs(run_dir, exist_ok=True)
    for name, (mode, text) in files.items():
        if "/" in name or name.startswith("."):
            raise ValueError(f"refusing file name {name!r}")
        # Created with its mode (whatever the umask), then renamed into place.
        write_atomic(os.path.join(run_dir, name), text.encode(), mode)
    return {"written": sorted(files)}


def signal_launcher(run_id: str, pidfile: str, signum: int) -> dict[str, Any]:
    try:
        with open(pidfile) as f:
            pid = int(f.read().strip())
    except (OSError, ValueError):
        return {"signalled": None}
    if not _environ_has(pid, b"CPUACCEL_RUN_ID=" + run_id.encode()):
        return {"signalled": None}
    try:
        os.killpg(pid, signum)
    except ProcessLookupError:
        return {"signalled": None}
    return {"signalled": pid}


def _kill(pids: list[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:  # ended on its own meanwhile
            continue


def end(run_id: str, grace: float) -> dict[str, Any]:
    pids = job_pids(run_id)
    terminated = _describe(pids)
    _kill(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while pids and time.monotonic() < deadline:
        time.sleep(0.05)
        pids = job_pids(run_id)
    killed = _describe(pids)
    _kill(pids, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while pids and time.monotonic() < deadline:
        time.sleep(0.05)
        pids = job_pids(run_id)
    return {"terminated": terminated, "killed": killed, "left": _describe(pids)}


def main() -> None:
    mode, args = sys.argv[2], sys.argv[3:]  # after BOOT's LENGTH (cpuaccel.connectors.programs)
    if mode == "write":
        result = write(args[0], json.loads(sys.stdin.buffer.read()))
    elif mode == "procs":
        result = {"pids": _describe(job_pids(args[0]))}
    elif mode == "signal":
        result = signal_launcher(args[0], args[1], int(args[2]))
    elif mode == "end":
        result = end(args[0], float(args[1]))
    else:
        raise SystemExit(f"unknown mode {mode}")
    sys.stdout.write(json.dumps(result) + "\n")
