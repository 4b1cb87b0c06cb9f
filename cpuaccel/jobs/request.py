"""One run as its caller asks for it: ``LaunchRequest``.

``cpuaccel run``'s flags, ``cpuaccel.launch``'s keywords and a notebook's call each make
one request (``api/launching.request``), checked once as it is made, and hand it down
whole: the CLI to the API, the API to ``jobs.launch.launch``. Nothing on the way
rebuilds it; the run id is made here when none was given.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cpuaccel.config.settings import LaunchSettings
from cpuaccel.connectors.connect_options import ConnectOptions
from cpuaccel.errors import UsageError
from cpuaccel.facts.gather import Facts
from cpuaccel.facts.problems import Problem
from cpuaccel.jobs.connections import JobFiles, Nodes
from cpuaccel.jobs.plan import RunPlan, Script, new_run_id

# A rank's line: (stream "out" or "err", rank or None for the launcher, host, text).
LineSink = Callable[[str, int | None, str, str], None]
# One traceback several ranks raised: (the ranks, their hosts, its lines).
GroupSink = Callable[[Sequence[int], Sequence[str], Sequence[str]], None]
# A caller's own checks of the nodes' facts (by inventory name), before any job starts.
Require = Callable[[dict[str, Facts]], list[Problem]]
# Called once a foreground job has ended, with its last plan and the nodes' connections.
Collect = Callable[[RunPlan, Nodes], None]


@dataclass(frozen=True)
class LaunchRequest:
    """A job to start: its settled settings, its script and project, how the nodes are
    reached, and what its caller wants of the run.

    ``run_id``: one given from outside (jobs/given_id.py), else empty: a new one is made
    here. ``allow_sync``: a stale project is synced (else refused, --no-sync);
    ``timeout``: the whole job's bound. ``ranks_to_stderr`` (run --json): the ranks'
    stdout goes to stderr too, labelled, leaving stdout to the one JSON object.
    ``detach`` (run --detach): the supervisor runs on the head (node/detached.py).
    ``inventory``: the inventory file (absolute), kept in run.json for later verbs.
    ``extra_files``: more files for the run folder on every node, with the job's own
    (a notebook's function). ``show``: where the ranks' lines go instead of the
    terminal (tracebacks still folded); ``show_group``: where a traceback several ranks
    raised goes (with ``show`` and without it: the terminal). ``collect``: called once a
    foreground job has ended, with its last plan and the nodes' connections still open.
    ``require``: the caller's own checks of the nodes' facts, problems of the preflight
    like the others (no job starts while one is an error)."""

    settings: LaunchSettings
    script: Script
    project: Path
    connect: ConnectOptions
    forks: int
    run_id: str = ""
    allow_sync: bool = True
    timeout: float | None = None
    ranks_to_stderr: bool = False
    detach: bool = False
    inventory: str | None = None
    extra_files: JobFiles = field(default_factory=dict)
    show: LineSink | None = None
    show_group: GroupSink | None = None
    collect: Collect | None = None
    require: Require | None = None

    def __post_init__(self) -> None:
        if self.detach:
            refuse_detached_in_slurm(self.settings)
        if not self.run_id:  # the one place a run's id is made
            object.__setattr__(self, "run_id", new_run_id())

    @property
    def local_project(self) -> str | None:
        """The project folder, when every chosen host is this machine: used where it is."""
        local = all(h.is_local for h in self.settings.chosen)
        return str(self.project) if local else None


def refuse_detached_in_slurm(settings: LaunchSettings) -> None:
    """A detached run's supervisor on the head reaches the other nodes by ssh, which the
    nodes of a Slurm allocation may refuse: there, `cpuaccel submit` outlives the shell."""
    if settings.chosen[0].slurm_job is not None:
        raise UsageError(
            f"--detach inside Slurm job {settings.chosen[0].slurm_job}: a detached "
            "supervisor reaches the other nodes by ssh, which Slurm nodes may refuse",
            hint="use cpuaccel submit for a job that outlives this shell, or leave out --detach",
        )
