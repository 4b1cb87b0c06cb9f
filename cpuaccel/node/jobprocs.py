"""The processes of cpuaccel jobs on this node (see ``cpuaccel.node``): stdlib only.

A process belongs to a job when its environment holds ``CPUACCEL_RUN_ID=<id>`` exactly
and it is ours (same uid): never a pattern over command lines, which would also match
other people's jobs. It is this node's when it shares this program's network namespace:
where several nodes share one kernel (containers, the namespace test bed), a node's
sweep must not end another node's ranks, which that node's own contact accounts for.

``job_pids`` finds one job's (``jobctl``'s sweep); ``live_runs`` every job's on this
node, which the fact probe reports so that the controller can end the ranks of a run
that has ended (a node lost mid-run keeps them when it comes back).
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MARKER = b"CPUACCEL_RUN_ID="
# Ids as the controller makes them (cpuaccel.jobs.given_id.FORM): anything else in an
# environment is not reported.
_ID_CHARS = frozenset(b"0123456789abcdef-")


def environ_has(pid: int, marker: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return marker in f.read().split(b"\0")
    except OSError:
        return False


def _ours(pid: int, uid: int) -> bool:
    """A live process of this uid (a zombie is dead already: its parent reaps it)."""
    try:
        if os.stat(f"/proc/{pid}").st_uid != uid:
            return False
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def _others() -> list[int]:
    me = os.getpid()
    return [int(name) for name in os.listdir("/proc") if name.isdigit() and int(name) != me]


def job_pids(run_id: str) -> list[int]:
    """The job's processes on this node: ours, in this program's network namespace."""
    marker, uid, here = MARKER + run_id.encode(), os.getuid(), _netns("self")
    return sorted(
        pid
        for pid in _others()
        if _ours(pid, uid) and _netns(str(pid)) == here and environ_has(pid, marker)
    )


def describe(pids: list[int]) -> list[tuple[int, str]]:
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            cmd = "?"
        out.append((pid, cmd[:200]))
    return out


def _netns(pid: str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def live_runs() -> dict[str, list[Any]]:
    """run id -> [[pid, command line]] of the jobs' processes of this node: ours, in
    this program's network namespace (the node's own, where several "nodes" share one
    kernel), with a well-formed CPUACCEL_RUN_ID."""
    uid, here = os.getuid(), _netns("self")
    found: dict[str, list[int]] = {}
    for pid in _others():
        if not _ours(pid, uid) or _netns(str(pid)) != here:
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                entries = f.read().split(b"\0")
        except OSError:
            continue
        for entry in entries:
            if entry.startswith(MARKER):
                value = entry[len(MARKER) :]
                if 0 < len(value) <= 64 and set(value) <= _ID_CHARS:
                    found.setdefault(value.decode(), []).append(pid)
                break
    return {run: [list(p) for p in describe(pids)] for run, pids in found.items()}
