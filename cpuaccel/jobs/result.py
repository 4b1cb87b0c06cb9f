"""``run --json``: what one run ended with, as one JSON object.

Built on every path a run can end by (a finished job, a failed preflight, an error
before any node was reached), so that a script reading stdout always gets one object.
Names only, never a value of the environment: it may be logged anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cpuaccel.jobs.plan import RunPlan
from cpuaccel.node import endings
from cpuaccel.node.supervisor import Outcome

# ended_by: the job's own endings (Outcome.reason), and two before any job: a node
# failed its checks (preflight) or bad input, a failure before any rank started (error).
# Each with its exit code and meaning: node/endings.py.
INTERRUPTED, TERMINATED = endings.INTERRUPTED.word, endings.TERMINATED.word
PREFLIGHT, ERROR = endings.PREFLIGHT.word, endings.ERROR.word


@dataclass
class JobReport:
    exit_code: int
    ended_by: str
    seconds: float  # wall time of the whole command: preflight, sync, the job
    run_id: str | None = None
    folder: str | None = None  # the run's folder on the controller (runs/<id>)
    hosts: list[str] = field(default_factory=list)
    ppn: int | None = None
    world: int | None = None
    ranks: dict[int, int | None] = field(default_factory=dict)  # rank -> its exit code
    signals: dict[int, str] = field(default_factory=dict)  # rank -> the signal that ended it
    error: str | None = None
    fix: str | None = None  # the error's hint, as the `fix:` line says it
    # run --detach: state, head, head_run_dir and supervisor (node/detached.py)
    detached: dict[str, Any] | None = None
    # run --max-restarts: attempts.jsonl's lines (node/supervisor.py); [] before any job
    attempts: list[dict[str, Any]] = field(default_factory=list)
    # A failed preflight's problems, a line each: "host: message (fix: ...)"
    problems: list[str] = field(default_factory=list)

    @classmethod
    def of_plan(cls, plan: RunPlan, code: int, ended_by: str, seconds: float) -> JobReport:
        hosts = [h.name for h in plan.hosts]
        return cls(code, ended_by, seconds, plan.run_id, None, hosts, plan.ppn, plan.world)

    def add_outcome(self, outcome: Outcome, folder: str) -> None:
        """A job that ran: each rank's code as it reported it (worker.py's exit marker).
        A rank without one (its node lost, or killed with its worker) is None, except
        when the whole job completed: mpirun exits 0 only when every rank did."""
        self.folder = folder
        clean = outcome.reason == endings.COMPLETED.word and outcome.launcher_exit == 0
        self.ranks = {
            rank: outcome.codes.get(rank, 0 if clean else None) for rank in range(self.world or 0)
        }
        self.signals = dict(sorted(outcome.signals.items()))

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "folder": self.folder,
            "hosts": self.hosts,
            "ppn": self.ppn,
            "world": self.world,
            "exit_code": self.exit_code,
            "ended_by": self.ended_by,
            "seconds": round(self.seconds, 3),
            "ranks": {str(rank): code for rank, code in self.ranks.items()},
            "signals": {str(rank): name for rank, name in self.signals.items()},
            "error": self.error,
            "fix": self.fix,
            **({"attempts": self.attempts} if self.attempts else {}),
            **({"problems": self.problems} if self.problems else {}),
            **({"detached": True, **self.detached} if self.detached else {}),
        }
