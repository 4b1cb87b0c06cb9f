"""Reaching a node of a Slurm allocation without SSH: each command is one ``srun`` step.

``srun --jobid J --nodelist HOST --nodes 1 --ntasks 1 --overlap sh -c LINE`` runs the
same rendered line the other connectors run (commandline.shell_line), with srun's own
stdin and stdout as the command's: so the node programs (facts, jobs, tree), the sync's
tar stream and the sweep work as over SSH. ``--overlap`` lets the step share the CPUs
that the job's ranks hold (Slurm would otherwise queue it behind them); ``--quiet``
keeps srun's own notes out of the program's output. A host is reached so when its
``ansible_connection`` is ``slurm`` (slurm/allocation.py makes such hosts).

srun is started on this machine, bounded as a local command is (connectors/local.py):
a command past its timeout has its srun killed, which ends the step.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence

from cpuaccel import ui
from cpuaccel.connectors import commandline
from cpuaccel.connectors.local import LocalConnector
from cpuaccel.connectors.rsync import RsyncResult, rsync_argv, run_rsync
from cpuaccel.errors import UsageError

STEP_NAME = "cpuaccel"  # what squeue --steps shows for these steps


def srun_prefix(job_id: str, host: str | None = None) -> list[str]:
    """``srun`` with the options of one task in job ``job_id`` (on ``host``)."""
    argv = ["srun", f"--jobid={job_id}", "--nodes=1", "--ntasks=1", "--overlap", "--quiet"]
    argv += [f"--job-name={STEP_NAME}"]
    return argv + ([f"--nodelist={host}"] if host is not None else [])


class SrunConnector(LocalConnector):
    """Commands on an allocated node, through srun from this machine."""

    @property
    def job_id(self) -> str:
        job = self.host.slurm_job
        if job is None:  # an inventory that says slurm without the job
            raise UsageError(
                f"{self.host.name}: ansible_connection slurm without cpuaccel_slurm_job",
                hint="run cpuaccel inside the allocation (salloc/sbatch), without -i",
            )
        return job

    def wrap(self, line: str) -> list[str]:
        return [*srun_prefix(self.job_id, self.host.name), "/bin/sh", "-c", line]

    def rsync(
        self,
        flags: Sequence[str],
        source: str,
        dest: str,
        *,
        stdin: bytes | None = None,
        on_line: Callable[[str], None] | None = None,
    ) -> RsyncResult:
        # rsync starts its "remote shell" as RSH HOST rsync --server ...: srun with
        # --nodelist last takes HOST as that option's value, and runs the rest there.
        shell = shlex.join([*srun_prefix(self.job_id), "--nodelist"])
        argv = rsync_argv(flags, source, f"{self.host.name}:{dest}")
        argv[-3:-3] = ["-e", shell]  # before "-- SOURCE DEST"
        ui.detail(2, self.host.name, f"$ {commandline.shown_line(argv)} (on the controller)")
        return run_rsync(argv, stdin=stdin, on_line=on_line)

    def ssh_argv(self) -> list[str]:
        raise UsageError(
            f"{self.host.name} is a Slurm node reached through srun: no ssh to it",
            hint="launch with Slurm (the default inside an allocation), not an ssh launcher",
        )
