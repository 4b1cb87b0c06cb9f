"""A detached run's folder without nodes: the supervisor program, its configuration and
a stand-in launch.sh, for the tests of how the supervisor ends a run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cpuaccel import node


def detached_run(tmp_path: Path, run_id: str, launch: str, **config: Any) -> str:
    """runs/RUN_ID below ``tmp_path`` with a 2-rank job on this machine ("here"), whose
    launch.sh runs the shell text ``launch``; ``config`` adds to or replaces what the
    supervisor is told (a bound: timeout, hang_timeout, rendezvous_timeout)."""
    run_dir = tmp_path / "runs" / run_id
    run_dir.mkdir(parents=True)
    told = {"run_id": run_id, "head": "here", "world": 2, "timeout": None, "nodes": {},
            "hosts": ["here"], "ppn": 2, **config}  # fmt: skip
    (run_dir / "supervisor.json").write_text(json.dumps(told))
    (run_dir / "supervisor.py").write_bytes(node.program("detached"))
    (run_dir / "launch.sh").write_text(
        f"export CPUACCEL_RUN_ID={run_id}\necho $$ > {run_dir}/launcher.pid\n{launch}"
    )
    return str(run_dir)
