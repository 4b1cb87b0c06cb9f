"""Reaching a node of a Slurm allocation without SSH: each command is one ``srun`` step.

``srun --jobid J --nodelist HOST --nodes 1 --ntasks 1 --overlap sh -c LINE`` runs the
same rendered line the other connectors run (commandline.shell_line), with srun's own
stdin and stdout as the command's: so the node programs (facts, jobs, tree), the sync's
tar stream and the sweep work as over SSH. Not rsync: its protocol hangs in srun's
stdin forwarding (Slurm 22.05), so the sync sends its tar stream. ``--overlap`` lets the
step share the CPUs that the job's ranks hold (Slurm would otherwise queue it behind
them); ``--quiet`` keeps srun's own notes out of the program's output. A host is reached
so when its ``ansible_connection`` is ``slurm`` (slurm/allocation.py makes such hosts).

srun is started on this machine, bounded as a local command is (connectors/local.py):
a command past its timeout has its srun killed, which ends the step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from cpuaccel.connectors.local import LocalConnector
from cpuaccel.connectors.rsync import RsyncResult
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

    # rsync over srun's stdin forwarding hangs (rsync's protocol waits on data that
    # srun holds back; seen with Slurm 22.05): the sync sends its tar stream instead.
    rsync_ok = False

    def rsync(
        self,
        flags: Sequence[str],
        source: str,
        dest: str,
        *,
        stdin: bytes | None = None,
        on_line: Callable[[str], None] | None = None,
    ) -> RsyncResult:
        return RsyncResult(1, [], f"{self.host.name} is reached through srun, where rsync hangs")

    def ssh_argv(self) -> list[str]:
        raise UsageError(
            f"{self.host.name} is a Slurm node reached through srun: no ssh to it",
            hint="launch with Slurm (the default inside an allocation), not an ssh launcher",
        )
