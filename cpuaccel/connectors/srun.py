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

import re
from collections.abc import Callable, Sequence
from typing import Any

from cpuaccel import node
from cpuaccel.connectors import commandline, programs
from cpuaccel.connectors.base import CommandResult
from cpuaccel.connectors.connect_options import ConnectOptions
from cpuaccel.connectors.local import LocalConnector
from cpuaccel.errors import HostError, Unreachable, UsageError
from cpuaccel.inventory.host import Host

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
    rsync_refusal = "is reached through srun, where rsync hangs"

    def ssh_argv(self) -> list[str]:
        raise UsageError(
            f"{self.host.name} is a Slurm node reached through srun: no ssh to it",
            hint="launch with Slurm (the default inside an allocation), not an ssh launcher",
        )


# ---------------------------------------------------------------- one step, every node

_LABELLED = r"^\s*(\d+): ?(.*)$"  # srun --label: "TASK: line"; re compiles it on first use
_NODE, _EXIT = "cpuaccel-node ", "cpuaccel-exit "


def call_everywhere(
    hosts: Sequence[Host],
    program: str,
    words_of: Callable[[Host], list[str]],
    payload: bytes = b"",
    *,
    what: str,
    timeout: float,
) -> dict[str, dict[str, Any] | HostError]:
    """Node program ``program`` on every host of one allocation in ONE srun step (one
    task a node), each with its own request ``words_of(host)``: host name -> its answer,
    or the HostError that says why there is none.

    srun sends its stdin (the program, then ``payload``) to every task; each task picks
    its own command by ``$SLURMD_NODENAME`` and reports its node and exit code around the
    program's output, which ``--label`` keeps apart task by task."""
    job = hosts[0].slurm_job
    assert job is not None and all(h.slurm_job == job for h in hosts)
    branches = [
        f"{commandline.quote(h.name)}) echo {_NODE}{commandline.quote(h.name)}; "
        f"{commandline.shell_line(programs.argv(h.python, program, words_of(h)))};;"
        for h in hosts
    ]
    script = f'case "$SLURMD_NODENAME" in {" ".join(branches)} *) exit 3;; esac; '
    script += f'printf "\\n{_EXIT}%s\\n" "$?"'
    nodes = len(hosts)
    argv = ["srun", f"--jobid={job}", f"--nodelist={','.join(h.name for h in hosts)}"]
    argv += [f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1", "--overlap"]
    argv += ["--quiet", "--label", f"--job-name={STEP_NAME}", "/bin/sh", "-c", script]
    local = LocalConnector(hosts[0], ConnectOptions())
    try:
        ran = local.run(argv, stdin=node.program(program) + payload, timeout=timeout)
    except HostError as exc:
        return {h.name: exc for h in hosts}
    return step_answers(hosts, ran, what)


def step_answers(
    hosts: Sequence[Host], ran: CommandResult, what: str
) -> dict[str, dict[str, Any] | HostError]:
    """Each task's output, back to its node and read as programs.answer reads one."""
    out: dict[str, list[str]] = {}
    err: dict[str, list[str]] = {}
    for stream, into in ((ran.stdout, out), (ran.stderr, err)):
        for line in stream.splitlines():
            match = re.match(_LABELLED, line)
            if match is not None:
                into.setdefault(match[1], []).append(match[2])
    found: dict[str, dict[str, Any] | HostError] = {}
    by_name = {h.name: h for h in hosts}
    for task, lines in out.items():
        if not lines or not lines[0].startswith(_NODE) or lines[0][len(_NODE) :] not in by_name:
            continue
        name = lines[0][len(_NODE) :]
        ends = [line for line in lines if line.startswith(_EXIT)]
        code = int(ends[-1][len(_EXIT) :]) if ends else 255
        # srun cuts a long line into labelled pieces: the answer is one JSON line, so
        # its pieces are joined as they come (JSON keeps newlines escaped in strings).
        text = "".join(line for line in lines[1:] if not line.startswith(_EXIT))
        result = CommandResult(name, "", code, text, "\n".join(err.get(task, [])), ran.seconds)
        try:
            found[name] = programs.answer(name, by_name[name].python, result, what)
        except HostError as exc:
            found[name] = exc
    said = (ran.stderr.strip().splitlines() or [f"srun exit code {ran.exit_code}"])[-1]
    for h in hosts:  # no task answered for it: srun could not start there
        found.setdefault(h.name, Unreachable(h.name, f"{what}: no answer through srun: {said}"))
    return found
