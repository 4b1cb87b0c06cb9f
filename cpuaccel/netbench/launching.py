"""``cpuaccel bench net``'s job: ``cpuaccel.netbench.job`` on one rank a node, run
through ``cpuaccel run``'s own path (``jobs.launch.launch``: the preflight, the sync of
the current folder, the launch, the supervision), and the head's ``net.json`` read back
once the job has ended, while the nodes' connections are still open.

The result is kept in the controller's ``runs/<id>/net.json`` too, beside the run's
other records (the head's copy stays in its run folder).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cpuaccel.config.settings import DEFAULT, FLAG, LaunchSettings, Setting
from cpuaccel.connectors import runfiles
from cpuaccel.connectors.connect_options import ConnectOptions
from cpuaccel.errors import CpuaccelError
from cpuaccel.jobs import launch as job
from cpuaccel.jobs.connections import Nodes
from cpuaccel.jobs.plan import MODULE, RunPlan, Script
from cpuaccel.jobs.request import LaunchRequest
from cpuaccel.jobs.result import JobReport
from cpuaccel.jsonsource import loads
from cpuaccel.netbench.results import NetbenchError, NetReport, parse

JOB_MODULE = "cpuaccel.netbench.job"
RESULT = "net.json"  # the job's own name for it (cpuaccel.netbench.job.RESULT)
MAX_RESULT = 4 * 1024 * 1024  # bytes: a result of 16 nodes is a few kB
READ_TIMEOUT = 30.0
WHERE = "cpuaccel bench net"


@dataclass(frozen=True)
class Options:
    max_size: int
    pair_size: int
    iters: int
    backends: tuple[str, ...]
    timeout: float  # the whole job; gloo's own waits get the same bound

    def args(self) -> tuple[str, ...]:
        return (
            "--max-size", str(self.max_size), "--pair-size", str(self.pair_size),
            "--iters", str(self.iters), "--timeout", f"{self.timeout:g}",
            "--backends", ",".join(self.backends),
        )  # fmt: skip


@dataclass
class Outcome:
    job: JobReport
    data: Any = None  # net.json as read, None when the job left none
    error: str | None = None  # why it could not be read


def bench_settings(settings: LaunchSettings) -> LaunchSettings:
    """The run's settings for the bench: one rank a node, no restart, every chosen node."""
    return dataclasses.replace(
        settings,
        ppn=Setting("ppn", 1, FLAG, WHERE),
        max_restarts=Setting("max_restarts", 0, DEFAULT),
        min_nodes=Setting("min_nodes", None, DEFAULT),
        hang_timeout=Setting("hang_timeout", None, DEFAULT),
    )


def read_result(plan: RunPlan, nodes: Nodes) -> Any:
    """net.json of the head's run folder, as JSON; None when there is none."""
    conn = nodes.pool.get(plan.head)
    data, _, size = runfiles.read(conn, plan.run_dir, RESULT, 0, MAX_RESULT, READ_TIMEOUT)
    if data is None:
        return None
    if size is not None and size > MAX_RESULT:
        raise NetbenchError(f"{plan.head.name}: {RESULT} is {size} bytes, over {MAX_RESULT}")
    return loads(data.decode("utf-8", errors="replace"))


def run_bench(
    settings: LaunchSettings,
    project: Path,
    options: Options,
    *,
    connect: ConnectOptions,
    forks: int,
) -> Outcome:
    """The bench's job from start to end, and what its head left."""
    what = Script(JOB_MODULE, options.args(), project.name, MODULE)
    found: dict[str, Any] = {}

    def collect(plan: RunPlan, nodes: Nodes) -> None:
        try:
            found["data"] = read_result(plan, nodes)
        except (CpuaccelError, ValueError) as exc:
            found["error"] = str(exc)

    request = LaunchRequest(
        bench_settings(settings),
        what,
        project,
        connect,
        forks,
        timeout=options.timeout,
        ranks_to_stderr=True,  # stdout is the tables'
        collect=collect,
    )
    report = job.launch(request)
    outcome = Outcome(report, found.get("data"), found.get("error"))
    if outcome.data is not None and report.folder and os.path.isdir(report.folder):
        keep(Path(report.folder) / RESULT, outcome.data)
    return outcome


def keep(path: Path, data: Any) -> None:
    """The result in the controller's run folder (left as it is when already there: a
    run on this machine, whose folder is the head's)."""
    import json

    if not path.exists():
        path.write_text(json.dumps(data, indent=1) + "\n")


def report_of(outcome: Outcome) -> NetReport:
    """The checked report of a job that ended well; NetbenchError otherwise."""
    ended = outcome.job
    if ended.ended_by != "completed" or ended.exit_code != 0:
        raise NetbenchError(
            f"the bench's job ended {ended.ended_by} (exit code {ended.exit_code})"
            + (f": {ended.error}" if ended.error else ""),
            hint=f"its output is in {ended.folder or 'runs/'}; cpuaccel check lists what "
            "a node lacks",
        )
    if outcome.data is None:
        raise NetbenchError(
            f"the bench's job ended, but left no {RESULT} on its head"
            + (f": {outcome.error}" if outcome.error else ""),
            hint=f"its output is in {ended.folder or 'runs/'}",
        )
    return parse(outcome.data)
