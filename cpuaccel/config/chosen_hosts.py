"""Which hosts a run uses: the head node (``--master_addr``, the project file's ``head``)
first, then the first ``--nodes`` of the selected hosts.

Part of ``config.effective.resolve``; apart so that choosing hosts, with its errors
naming where a number or a name was written, reads on its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cpuaccel.config.project import ProjectConfig
from cpuaccel.config.settings import BY_NAME, FLAG, PROJECT, Setting
from cpuaccel.errors import InventoryError, UsageError
from cpuaccel.inventory.host import Host


def order_hosts(hosts: Sequence[Host], head: Setting[str | None]) -> list[Host]:
    """The head node first: mpirun runs there and rank 0 with it."""
    if head.value is None:
        return list(hosts)
    wanted = str(head.value)
    found = next((h for h in hosts if wanted in (h.name, h.address)), None)
    if found is None and head.source == FLAG:
        raise UsageError(
            f"{head.where} {wanted}: not among the selected hosts "
            f"({', '.join(h.name for h in hosts)})",
            hint="name a host of the inventory (its name or ansible_host), or widen --limit",
        )
    if found is None:
        raise InventoryError(
            f"head {wanted!r} is not among the selected hosts ({', '.join(h.name for h in hosts)})",
            source=(head.where or "").rsplit(":", 1)[0] or None,
            line=_line(head.where),
            hint="name a host of the inventory (its name or ansible_host), or widen --limit",
        )
    return [found, *(h for h in hosts if h is not found)]


def _line(where: str | None) -> int | None:
    tail = (where or "").rsplit(":", 1)[-1]
    return int(tail) if tail.isdigit() else None


def head_setting(flags: Mapping[str, Any], project: ProjectConfig | None) -> Setting[str | None]:
    """--master_addr (any of its spellings), else the project file's head, else none:
    the first selected host."""
    entry = BY_NAME["head"]
    if flags.get("head") is not None:
        where = (flags.get("flag_names") or {}).get("head")
        spelling = entry.flag.spelling if entry.flag else "--master_addr"
        return Setting("head", str(flags["head"]), FLAG, str(where or spelling))
    if project is not None and project.get("head"):
        return Setting("head", project.get("head"), PROJECT, project.where("head"))
    return entry.default_setting()


def choose(
    ordered: list[Host], nodes: Setting[int | None], project: ProjectConfig | None
) -> list[Host]:
    """The first ``nodes`` of the hosts, head first; more than there are is an error
    naming where the number was written."""
    if nodes.value is None:
        return ordered
    if nodes.value > len(ordered):
        if ordered[0].slurm_job is not None and nodes.source == FLAG:  # an allocation's nodes
            from cpuaccel.slurm import allocation  # only an allocation's nodes need it

            job = f"Slurm job {ordered[0].slurm_job}"
            raise allocation.too_few(job, nodes.value, [h.name for h in ordered])
        names = ", ".join(h.name for h in ordered)
        message = f"{nodes.value} nodes, but {len(ordered)} host(s) are selected ({names})"
        if project is not None and nodes.source == PROJECT:
            raise project.error(
                "nodes", message, "add hosts to the inventory (or hostfile), or lower it"
            )
        raise UsageError(
            f"{nodes.where or '--nodes'} {nodes.value}, but {len(ordered)} host(s) are "
            f"selected ({names})",
            hint="lower --nodes, or add hosts to the inventory / widen --limit",
        )
    return ordered[: nodes.value]
