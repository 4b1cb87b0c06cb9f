"""Which inventory a verb reads, and where that choice came from.

-i (a file, a comma list of hosts as Ansible's ``-i node1,node2,``, or a Slurm
partition's nodes, ``-i slurm:PARTITION``), else the Slurm allocation this runs in
(``$SLURM_JOB_ID``: inside ``salloc`` or ``sbatch`` the allocated nodes are the ones to
use, whatever the project file names for SSH use), else the project file's inventory
(or Accelerate's hostfile), else
$CPUACCEL_INVENTORY, else ./inventory.yaml, else this machine alone. The choice is a
``Setting`` so that ``config show`` can say why that file was read.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cpuaccel.config.project import ProjectConfig
from cpuaccel.config.settings import (
    DEFAULT,
    ENVIRONMENT,
    FLAG,
    INVENTORY_VARIABLES,
    PROJECT,
    Setting,
)
from cpuaccel.inventory import groupvars
from cpuaccel.inventory.inventory import DEFAULT_FILE, ENV_VAR, Inventory, is_host_list
from cpuaccel.inventory.slurm_source import is_slurm_source, slurm_builder

if TYPE_CHECKING:
    from cpuaccel.slurm.allocation import Allocation


@dataclass(frozen=True)
class InventoryChoice:
    path: str | None  # None: this machine alone (or the Slurm allocation)
    setting: Setting[str]
    slurm: Allocation | None = None  # the allocation's nodes, not a file

    def load(self, extra_vars: Mapping[str, Any] | None = None) -> Inventory:
        """The chosen inventory, read (with -e on top), the settings' variables checked."""
        return self._read(extra_vars).check_declared(INVENTORY_VARIABLES)

    def _read(self, extra_vars: Mapping[str, Any] | None) -> Inventory:
        if self.slurm is not None:
            from cpuaccel.slurm import allocation

            return allocation.inventory(self.slurm, extra_vars)
        if self.path is None:
            return Inventory.implicit(extra_vars)
        if is_host_list(self.path):  # -i node1,node2, (Ansible's host list)
            return Inventory.from_host_list(self.path, self.label, extra_vars)
        if is_slurm_source(self.path):  # -i slurm:PARTITION
            return slurm_inventory(self.path, extra_vars)
        return Inventory.load(self.path, extra_vars)

    @property
    def label(self) -> str:
        """How errors name the choice: "-i node1,node2," or "$CPUACCEL_INVENTORY ..."."""
        return f"{self.setting.where} {self.path}"


SLURM_JOB_ID = "SLURM_JOB_ID"  # slurm/allocation.JOB_ID (tests/unit/cli/test_lazy_imports.py)


def _allocation_here() -> Allocation | None:
    """The Slurm allocation this runs in; its reader (and Slurm's hostlist syntax) loads
    only inside one, off the start-up of every command run outside."""
    if not os.environ.get(SLURM_JOB_ID):
        return None  # as allocation.detect says outside one
    from cpuaccel.slurm import allocation

    return allocation.detect(os.environ)


def choose_inventory(flag: str | None, project: ProjectConfig | None) -> InventoryChoice:
    """-i, else the Slurm allocation, else the project file's inventory (or
    Accelerate's hostfile), else $CPUACCEL_INVENTORY, else ./inventory.yaml, else this
    machine alone."""
    if flag:
        return InventoryChoice(flag, Setting("inventory", flag, FLAG, "-i"))
    found = _allocation_here()
    if found is not None:
        where = f"${SLURM_JOB_ID}"
        return InventoryChoice(None, Setting("inventory", found.label, ENVIRONMENT, where), found)
    if project is not None:
        if project.get("inventory"):
            if project.inventory_error is not None:
                raise project.inventory_error
            path = str(project.get("inventory"))
            if is_host_list(path) or is_slurm_source(
                path
            ):  # inventory: node1,node2, (as ansible.cfg's inventory =)
                return InventoryChoice(
                    path, Setting("inventory", path, PROJECT, project.where("inventory"))
                )
            if not os.path.isfile(path):
                # Blame the line that names it: the user fixes the project file. Not a
                # regular file (/dev/zero, a FIFO) would be read forever.
                raise project.error(
                    "inventory",
                    f"{path} not found" if not os.path.exists(path) else f"{path} is not a file",
                    "write the path of the inventory (or MPI hostfile), relative to the "
                    "project file, or pass -i FILE",
                )
            where = project.where("inventory")
            return InventoryChoice(path, Setting("inventory", path, PROJECT, where))
        if project.local_only:
            where = f"{project.path} (distributed_type 'NO')"
            return InventoryChoice(None, Setting("inventory", "localhost", PROJECT, where))
    from_env = os.environ.get(ENV_VAR)
    if from_env:
        return InventoryChoice(from_env, Setting("inventory", from_env, ENVIRONMENT, f"${ENV_VAR}"))
    if os.path.lexists(DEFAULT_FILE):  # not a file: Inventory.load says so
        return InventoryChoice(DEFAULT_FILE, Setting("inventory", DEFAULT_FILE, DEFAULT, "./"))
    return InventoryChoice(None, Setting("inventory", "localhost", DEFAULT, "no inventory file"))


def slurm_inventory(spec: str, extra_vars: Mapping[str, Any] | None = None) -> Inventory:
    """``slurm:PARTITION``: the partition's nodes from scontrol, with the group_vars/ and
    host_vars/ of the current folder (a Slurm partition has no folder of its own; that is
    where its SSH user and key can be written), and -e on top."""
    from cpuaccel.slurm.partition import read_partition  # only when Slurm is asked for

    found = read_partition(spec)
    builder = slurm_builder(found.partition, found.nodes, f"slurm:{found.partition}")
    warnings = groupvars.attach(builder, ".", 0)
    inventory = Inventory.built(builder, extra_vars)
    inventory.warnings += warnings
    return inventory
