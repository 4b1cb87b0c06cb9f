"""A run's own srun step: found by its name, cancelled at the end of the run.

The Slurm launcher (jobs/launchers.py) names its step ``cpuaccel-<run id>``. When the
job ends, for whatever reason, that step is scancelled if it is still there (srun killed
by the teardown leaves its step behind), before the sweep by run id: Slurm ends the
step's processes on every node itself, the sweep then checks that none is left.
"""

from __future__ import annotations

from cpuaccel.slurm import commands

TIMEOUT = 10.0  # seconds for each of squeue and scancel: the teardown is bounded


def named(job_id: str, name: str) -> list[str]:
    """The ids (``JOB.STEP``) of job ``job_id``'s steps named ``name``."""
    argv = ["squeue", "--steps", f"--jobs={job_id}", "--noheader", "--format=%i %j"]
    found = []
    for line in commands.run(argv, timeout=TIMEOUT).splitlines():
        step, _, step_name = line.strip().partition(" ")
        if step_name.strip() == name and step.startswith(f"{job_id}."):
            found.append(step)
    return found


def cancel(job_id: str, name: str) -> list[str]:
    """scancel job ``job_id``'s steps named ``name``; the steps it cancelled."""
    steps = named(job_id, name)
    if steps:
        commands.run(["scancel", "--quiet", *steps], timeout=TIMEOUT)
    return steps
