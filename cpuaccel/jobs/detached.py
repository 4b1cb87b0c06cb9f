"""``run --detach``: the job handed to a supervisor on the head node.

The controller does the preflight, sync and copy as for a foreground run (jobs/launch.py);
the run's files then also carry the supervisor (``supervisor.py``, the node program
``supervisor`` of cpuaccel/node/supervisor.py, and ``supervisor.json``, what it needs to
know), and instead of watching launch.sh itself the controller starts the supervisor on
the head, records where it runs, and returns. The supervisor keeps ``status.json`` in the
head's run folder; `cpuaccel stop` (runs/teardown.py) ends it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cpuaccel import node
from cpuaccel.connectors import programs
from cpuaccel.connectors.base import Connector
from cpuaccel.jobs.plan import RunPlan
from cpuaccel.jobs.rundir import EXECUTABLE, PLAIN, RunDir

JobFiles = dict[str, tuple[int, str]]


def supervisor_files(
    plan: RunPlan, timeout: float | None, max_restarts: int = 0, restart_delay: float = 0.0
) -> JobFiles:
    """The supervisor's program and settings, copied with the run's other files (to
    every node: the others run its ``end`` through ssh.sh when the job ends, and its
    ``ready`` and ``attempt`` between two attempts)."""
    config = {
        "run_id": plan.run_id,
        "head": plan.head.name,
        "world": plan.world or 0,
        "timeout": timeout,
        "nodes": {h.name: h.python for h in plan.hosts[1:]},  # swept through ssh.sh
        # run --hang-timeout (cpuaccel.node.progress): None, or the seconds without
        # progress that end the job; the hosts in rank order, for its report
        "hang_timeout": plan.hang_timeout,
        "hosts": [h.name for h in plan.hosts],
        "ppn": plan.ppn,
        # run --max-restarts: the supervisor runs the attempt loop (node/reattempt.py)
        "max_restarts": max_restarts,
        "restart_delay": restart_delay,
    }
    return {
        "supervisor.py": (EXECUTABLE, node.program("supervisor").decode()),
        "supervisor.json": (PLAIN, json.dumps(config, indent=2) + "\n"),
    }


def start(plan: RunPlan, head: Connector, run_dir: RunDir, inventory: str | None) -> dict[str, Any]:
    """Start the supervisor on the head; record the detached run in run.json. Returns
    the supervisor's {"host", "pid", "start_time"}."""
    run_dir.record_start(plan, detached=True, inventory=inventory)
    found = programs.call(
        head, "supervisor", ["start", plan.run_dir], what="starting the run's supervisor"
    )
    supervisor = {"host": plan.head.name, "pid": found["pid"], "start_time": found["start_time"]}
    run_dir.record(supervisor=supervisor)
    return supervisor


def inventory_path(setting_value: str | None) -> str | None:
    """The inventory file as an absolute path, for later verbs (None for a host list)."""
    if not setting_value or "," in setting_value or not Path(setting_value).is_file():
        return None
    return str(Path(setting_value).resolve())
