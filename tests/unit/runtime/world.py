"""The variables a launcher gives a rank: the runtime's tests in this process clear them, to
be a world of one, or set them, to be one rank of a local job."""

from __future__ import annotations

LAUNCH_VARS = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK",
    "SLURM_PROCID", "CPUACCEL_BACKEND", "CPUACCEL_GRAD_SYNC", "CPUACCEL_RUN_DIR",
    "CPUACCEL_GRAD_REDUCE", "CPUACCEL_DETERMINISTIC",
)  # fmt: skip
