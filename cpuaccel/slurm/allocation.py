"""The Slurm allocation this command runs in (``salloc``, ``sbatch``), as an inventory.

Inside an allocation Slurm sets ``SLURM_JOB_ID`` and ``SLURM_JOB_NODELIST`` (its
hostlist syntax, expanded by :mod:`cpuaccel.slurm.hostlist`). Its nodes become the
hosts, reached through ``srun --overlap`` (``ansible_connection: slurm``,
connectors/srun.py) rather than SSH, which Slurm clusters often refuse to unallocated
users. In a batch script the node the script runs on (``SLURMD_NODENAME``) is this
machine: it is reached locally.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cpuaccel.errors import UsageError
from cpuaccel.inventory.builder import InventoryBuilder, Origin
from cpuaccel.inventory.inventory import Inventory
from cpuaccel.slurm import hostlist

JOB_ID = "SLURM_JOB_ID"
NODELIST = "SLURM_JOB_NODELIST"
OLD_NODELIST = "SLURM_NODELIST"  # older Slurm (and some wrappers) set only this one
HERE = "SLURMD_NODENAME"  # set in a batch script and in a step's tasks
JOB_VAR = "cpuaccel_slurm_job"  # the host variable that names the job (inventory/variables)
CONNECTION = "slurm"  # the ansible_connection of an allocated node (connectors/srun.py)
GROUP = "slurm"


@dataclass(frozen=True)
class Allocation:
    job_id: str
    nodes: tuple[str, ...]
    here: str | None  # the allocated node this process runs on, if any

    @property
    def label(self) -> str:
        return f"Slurm job {self.job_id}"


def detect(environ: Mapping[str, str]) -> Allocation | None:
    """The allocation ``environ`` says this process runs in; None outside one.

    A job id that is no number, or a missing or bad node list, is a UsageError naming
    the variable: Slurm never sets them so, so someone else did."""
    job_id = environ.get(JOB_ID)
    if not job_id:
        return None
    if not job_id.isdigit():
        raise UsageError(
            f"${JOB_ID} is {job_id[:40]!r}, which is not a Slurm job id",
            hint=f"unset {JOB_ID}, or pass -i to choose the hosts yourself",
        )
    name = NODELIST if environ.get(NODELIST) else OLD_NODELIST
    text = environ.get(name, "")
    if not text:
        raise UsageError(
            f"${JOB_ID} is {job_id}, but ${NODELIST} is not set",
            hint="run cpuaccel inside salloc or sbatch (Slurm sets both), or pass -i",
        )
    nodes = hostlist.expand(text, origin=f"${name}")
    here = environ.get(HERE)
    return Allocation(job_id, tuple(nodes), here if here in nodes else None)


def inventory(allocation: Allocation, extra_vars: Mapping[str, Any] | None = None) -> Inventory:
    """The allocation's nodes as hosts (group ``slurm``), in Slurm's order.

    Each runs this Python (``cpuaccel_python``): an allocation's nodes share the
    controller's file system, as a Slurm cluster's do; ``-e`` overrides it."""
    builder = InventoryBuilder(allocation.label)
    group = builder.group(GROUP, None)
    origin = Origin(allocation.label, None)
    for name in allocation.nodes:
        connection = "local" if name == allocation.here else CONNECTION
        values = {
            "ansible_connection": connection,
            JOB_VAR: int(allocation.job_id),
            "cpuaccel_python": sys.executable,
        }
        builder.add_host(group, name, values, dict.fromkeys(values, origin))
    return Inventory.built(builder, extra_vars)


def too_few(allocation_label: str, wanted: int, nodes: list[str]) -> UsageError:
    """``--nodes N`` above what the allocation holds: both numbers named."""
    return UsageError(
        f"--nodes {wanted}, but {allocation_label} has {len(nodes)} node(s) ({', '.join(nodes)})",
        hint=f"lower --nodes, or allocate more nodes (e.g. salloc -N {wanted})",
    )
