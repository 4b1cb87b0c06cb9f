"""``run --hang-timeout``, the controller's side: a foreground job declared hung.

jobs/supervise.py feeds every labelled line to a ``ProgressTracker``
(cpuaccel/node/progress.py, shared with the detached supervisor) and asks it, between
its other checks, whether no rank has progressed for the timeout. When so, ``declare``
prints one line a rank (the likeliest stuck first), has each node dump its ranks' stacks
(``py-spy dump``, where installed: the ``jobs`` program's ``stacks``), writes them to
``runs/<id>/hang-<rank>.txt``, and the job then ends as a failure: reason "hang", exit
code 124 (state "failed", ended_by "hang" in status.json).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from cpuaccel.connectors import programs
from cpuaccel.connectors.base import Connector
from cpuaccel.executor import ConnectionPool, run_on_hosts
from cpuaccel.jobs.plan import RunPlan
from cpuaccel.node import progress
from cpuaccel.ui import escape

# A node's answer: py-spy's own bound, and the program's start and reply, with room.
STACKS_TIMEOUT = progress.DUMP_TIMEOUT + 10


def tracker(plan: RunPlan, started: float) -> progress.ProgressTracker | None:
    """The job's progress tracker, None without --hang-timeout."""
    if plan.hang_timeout is None:
        return None
    return progress.ProgressTracker(
        plan.run_id,
        plan.hang_timeout,
        plan.world or 0,
        started,
        progress.planned_hosts([h.name for h in plan.hosts], plan.ppn, plan.world or 0),
    )


def declare(
    found: progress.ProgressTracker,
    plan: RunPlan,
    home: Path,
    pool: ConnectionPool,
    forks: int,
    lost: list[str],
    err: Console,
) -> list[dict[str, Any]]:
    """Say the job hung (a line a rank) and keep each rank's stacks; the ranks' state, for
    status.json's "hang"."""
    now = time.monotonic()
    err.print(
        f"[red]hang:[/] no rank made progress for {found.idle(now):.1f} s "
        f"(--hang-timeout {found.timeout:g}): ending the job on every node"
    )
    for line in found.report(now):
        err.print(f"  {escape(line)}")
    written = progress.write_stacks(str(home), _stacks(found, plan, pool, forks, lost))
    if written:
        err.print(f"  stacks (py-spy): {escape(', '.join(str(home / n) for n in written))}")
    return [p.to_json(now) for p in found.stuck_first()]


def _stacks(
    found: progress.ProgressTracker,
    plan: RunPlan,
    pool: ConnectionPool,
    forks: int,
    lost: list[str],
) -> dict[str, str]:
    """Every reachable node's dumps of its ranks (rank -> text); none where py-spy is not."""
    pids = found.pids()
    if not pids:
        return {}
    payload = json.dumps(pids).encode()

    def dump(conn: Connector) -> dict[str, Any]:
        words = ["stacks", plan.run_id, f"{progress.DUMP_TIMEOUT:g}"]
        return programs.call(
            conn, "jobctl", words, payload, what="dumping the ranks' stacks", timeout=STACKS_TIMEOUT
        )

    hosts = [h for h in plan.hosts if h.name not in lost]
    dumps: dict[str, str] = {}
    for result in run_on_hosts(hosts, dump, forks=forks, pool=pool):
        if result.value is not None:  # a node that cannot answer: the sweep says so
            dumps.update(result.value.get("stacks", {}))
    return dumps
