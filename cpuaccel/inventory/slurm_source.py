"""A Slurm partition as an inventory (``-i slurm:PARTITION``, ``check --slurm``).

``cpuaccel.slurm.partition`` reads the nodes from scontrol and checks their values;
this fills an :class:`InventoryBuilder` with them, so that group_vars, ``-e`` and
``--limit`` work as for any inventory: every node in ``all`` and in a group named after
the partition, ``ansible_host`` its NodeAddr, and Slurm's view of it as variables
(``slurm_state``, ``slurm_cpus``, ``slurm_reason``) that ``check`` shows.
SSH details (user, key) come from ``-e``, ``-u``/``--private-key`` or ``~/.ssh/config``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Protocol

from cpuaccel.inventory.builder import InventoryBuilder, Origin

PREFIX = "slurm:"
STATE_VAR = "slurm_state"
CPUS_VAR = "slurm_cpus"
REASON_VAR = "slurm_reason"


class NodeRecord(Protocol):
    """What a Slurm node brings (``cpuaccel.slurm.partition.SlurmNode``)."""

    @property
    def name(self) -> str: ...
    @property
    def address(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def cpus(self) -> int: ...
    @property
    def reason(self) -> str | None: ...


def is_slurm_source(text: str) -> bool:
    """``slurm:PARTITION`` (or ``slurm:``), unless a file of that name exists."""
    return text.startswith(PREFIX) and not os.path.exists(text)


def slurm_builder(partition: str, nodes: Sequence[NodeRecord], source: str) -> InventoryBuilder:
    """The nodes of ``partition`` as an inventory; ``source`` names it in errors."""
    builder = InventoryBuilder(source)
    group = builder.group(partition, None)
    origin = Origin(source, None)
    for node in nodes:
        values: dict[str, Any] = {STATE_VAR: node.state, CPUS_VAR: node.cpus}
        if node.address != node.name:
            values["ansible_host"] = node.address
        if node.reason:
            values[REASON_VAR] = node.reason
        builder.add_host(group, node.name, values, dict.fromkeys(values, origin))
    return builder
