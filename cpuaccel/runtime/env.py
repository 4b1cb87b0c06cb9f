"""Where this process sits in the job, read from the environment (no torch needed).

Under ``cpuaccel run`` the worker has set RANK, WORLD_SIZE, ... already. A script
started some other way (plain ``mpirun python train.py``, Slurm, torchrun) gets the same
derivation the worker uses; with no launcher at all it is a world of one.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from cpuaccel.errors import SettingError
from cpuaccel.rank_settings import RESTART_ENV  # the attempt's number: 0 first
from cpuaccel.worker import derive_env

RESUME_ENV = "CPUACCEL_RESUME"  # the checkpoint the attempt resumes from (absolute path)

# Set by the MPI process managers that start each rank (Intel MPI/MPICH, Open MPI, PMIx).
MPI_RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    launched_by_mpi: bool
    run_dir: str | None
    restart: int = 0
    resume_path: str | None = None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> DistEnv:
        env = os.environ if environ is None else environ
        derived = derive_env(env)
        return cls(
            rank=int(derived["RANK"]),
            world_size=int(derived["WORLD_SIZE"]),
            local_rank=int(derived["LOCAL_RANK"]),
            local_world_size=int(derived["LOCAL_WORLD_SIZE"]),
            master_addr=derived["MASTER_ADDR"],
            master_port=int(derived["MASTER_PORT"]),
            launched_by_mpi=any(name in env for name in MPI_RANK_VARS),
            run_dir=env.get("CPUACCEL_RUN_DIR") or None,
            restart=restart_of(env),
            resume_path=env.get(RESUME_ENV) or None,
        )


def restart_of(env: Mapping[str, str]) -> int:
    """$CPUACCEL_RESTART as a number (0 when unset); anything else is a mistake to name."""
    text = env.get(RESTART_ENV, "").strip()
    if not text:
        return 0
    if not re.fullmatch(r"[0-9]+", text):
        raise SettingError(
            f"{RESTART_ENV}={text!r}: not a whole number >= 0 (the attempt's number, "
            "0 for the first; cpuaccel run sets it on a restart: unset it)"
        )
    return int(text)
