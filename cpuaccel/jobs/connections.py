"""How one job of ``cpuaccel run`` reaches its nodes (``Nodes``): one connection a node
for every phase (preflight, sync, copy, launch, sweep) and, on it, the preflight's node
program kept open for the copy and the sweep (``fanout.Kept``); the run's files written
on every node, and its secrets taken back off them when no job starts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from cpuaccel.connectors.connect_options import ConnectOptions
from cpuaccel.errors import UsageError
from cpuaccel.executor import ConnectionPool
from cpuaccel.history import fanout
from cpuaccel.inventory.host import Host
from cpuaccel.jobs.plan import RunPlan

JobFiles = dict[str, tuple[int, str]]  # name -> (mode, text), as render_job_files gives


@dataclass(frozen=True)
class Nodes:
    """The job's connections and kept programs; as a context manager, the kept programs
    end (EOF: a node writes nothing more) when the job does, before the connections."""

    connect: ConnectOptions
    forks: int
    pool: ConnectionPool
    kept: fanout.Kept = field(default_factory=fanout.Kept)

    def fan(self) -> dict[str, Any]:
        return {"forks": self.forks, "pool": self.pool, "kept": self.kept}

    def __enter__(self) -> Nodes:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.kept.close()


def copy_files(plan: RunPlan, files: JobFiles, nodes: Nodes) -> None:
    """The run's files written on every node (by its kept prelaunch program where open),
    or none started: a node that failed is said with the fix."""
    payload = json.dumps(files).encode()  # the same files everywhere: one srun step in Slurm
    words, what = ["write", plan.run_dir], "writing the run's files"
    results = fanout.call_all(
        plan.hosts, "jobctl", words, payload, what=what, timeout=600.0, **nodes.fan()
    )
    failed = [r for r in results if not r.ok]
    if failed:
        if "secret.env" in files:  # no job starts: take the secrets back off the others
            forget_secrets(plan, [r.host for r in results if r.ok], nodes)
        raise UsageError(
            "; ".join(f"{r.host.name}: {r.error}" for r in failed),
            hint="check free disk and permissions at cpuaccel_workdir",
        )


def forget_secrets(plan: RunPlan, hosts: list[Host], nodes: Nodes) -> None:
    words = ["end", plan.run_id, "0", plan.run_dir]
    what = "removing the run's secrets"
    fanout.call_all(hosts, "jobctl", words, what=what, timeout=600.0, **nodes.fan())
