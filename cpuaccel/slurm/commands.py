"""Running Slurm's client commands: the one place that starts them, always bounded.

``slurmctld`` can be slow or down; a client command then retries for minutes
(``MessageTimeout`` times its retries). Every call here has a deadline, and its failure
is one :class:`SlurmError` line naming the command and what Slurm said.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence

from cpuaccel.errors import EXIT_NODE_FAILED, CpuaccelError

DEFAULT_TIMEOUT = 30.0  # seconds: a healthy slurmctld answers in well under one
COMMANDS = ("srun", "sbatch", "salloc", "squeue", "sacct", "scancel", "sinfo", "scontrol")


class SlurmError(CpuaccelError):
    """A Slurm command is missing, failed or did not answer in time."""

    exit_code = EXIT_NODE_FAILED


def available(command: str = "sbatch") -> bool:
    """True when Slurm's ``command`` is on this machine's PATH."""
    import shutil  # here: with bz2 and lzma, a cost to check's start-up without Slurm

    return shutil.which(command) is not None


def run(
    argv: Sequence[str],
    *,
    timeout: float = DEFAULT_TIMEOUT,
    env: Mapping[str, str] | None = None,
    stdin: str | None = None,
) -> str:
    """Run a Slurm client command (``argv[0]`` one of :data:`COMMANDS`); its stdout.

    Raises SlurmError when the command is missing, exits non-zero (with its stderr's
    last line) or takes longer than ``timeout`` seconds.
    """
    if argv[0] not in COMMANDS:
        raise ValueError(f"not a Slurm client command: {argv[0]!r}")
    if not available(argv[0]):
        raise SlurmError(
            f"Slurm's {argv[0]} is not installed on this machine",
            hint="run this on a Slurm login node, or install Slurm's client commands",
        )
    full_env = {**os.environ, **(env or {})}
    try:
        done = subprocess.run(
            list(argv),
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=full_env,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise SlurmError(
            f"{argv[0]} did not answer within {timeout:g} s",
            hint="check that slurmctld is up (scontrol ping)",
        ) from None
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        raise SlurmError(f"{' '.join(argv[:2])} failed: {said}", hint=_hint(said))
    return done.stdout


# What Slurm's client says when it finds no slurm.conf (neither the file, SLURM_CONF,
# nor a configless slurmctld's DNS record): the machine is not set up as a client.
_NO_CONFIG = ("could not establish a configuration source", "slurm.conf")


def _hint(said: str) -> str | None:
    """The fix for what a failed client command said, where cpuaccel knows one."""
    if any(words in said.lower() for words in _NO_CONFIG):
        where = os.environ.get("SLURM_CONF")
        now = f" (SLURM_CONF is {where})" if where else " (SLURM_CONF is not set)"
        return (
            f"Slurm's client finds no configuration here{now}: set SLURM_CONF to the "
            "cluster's slurm.conf, or run cpuaccel where Slurm's client is configured "
            "(a login node)"
        )
    return None
