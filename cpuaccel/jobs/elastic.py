"""``run --nodes MIN:MAX``: a job that goes on without lost nodes.

MAX nodes are taken as for ``--nodes MAX`` (the first MAX selected hosts, head first).
A preflight (the first one, and each restart's) that finds nodes unreachable or failing
leaves them out, one line each naming the node and why, as long as at least MIN remain;
otherwise the preflight fails as it would without MIN. The hosts keep their order, so
when the head is lost the next host becomes the head (rank 0 and mpirun); ppn stays and
the world size follows the hosts (a new plan, rendered anew). A node left out is not
re-added during the run. ``remaining`` is the choice, pure; the rest applies it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TypeVar

from rich.console import Console

from cpuaccel import ui
from cpuaccel.config.settings import LaunchSettings, Setting
from cpuaccel.errors import CpuaccelError
from cpuaccel.facts.problems import Problem
from cpuaccel.inventory.host import Host
from cpuaccel.jobs.plan import RunPlan
from cpuaccel.ui import escape

T = TypeVar("T")
Check = Callable[[RunPlan], object]  # a preflight (and sync) of a plan's nodes


class PreflightFailed(CpuaccelError):
    """A node is not ready; the problems were printed one per line. ``problems``: those
    that name a node (empty when the failure is not one a node can be left out for)."""

    def __init__(self, message: str, problems: Sequence[Problem] = ()) -> None:
        super().__init__(message)
        self.problems = list(problems)


def remaining(
    hosts: Sequence[Host], problems: Sequence[Problem], min_nodes: int | None
) -> tuple[list[Host], dict[str, str]] | None:
    """The hosts left once those with problems are left out, and why each was (its
    first problem); None when that is not allowed: no MIN, a problem naming no chosen
    host (e.g. the controller's own), or fewer than MIN left."""
    names = {h.name for h in hosts}
    # "head -> node" (the launcher's ssh from the head failed): the node is left out.
    named = [(str(p.host).split(" -> ")[-1], p.message) for p in problems]
    if min_nodes is None or not problems or any(name not in names for name, _ in named):
        return None
    why: dict[str, str] = {}
    for name, message in named:
        why.setdefault(name, message)
    kept = [h for h in hosts if h.name not in why]
    if len(kept) < min_nodes:
        return None
    return kept, why


def plan_on(plan: RunPlan, hosts: Sequence[Host]) -> RunPlan:
    """The same job on fewer hosts: the world size follows, the head is the first."""
    env = dict(plan.env)
    if "MASTER_ADDR" in env:
        env["MASTER_ADDR"] = hosts[0].name
    return dataclasses.replace(plan, hosts=list(hosts), env=env)


def settings_on(settings: LaunchSettings, hosts: Sequence[Host]) -> LaunchSettings:
    """The settings with the hosts the first preflight kept."""
    if [h.name for h in hosts] == settings.hosts.value:
        return settings
    chosen = Setting("hosts", [h.name for h in hosts], settings.hosts.source, settings.hosts.where)
    return dataclasses.replace(settings, hosts=chosen, chosen=tuple(hosts))


def preflight_leaving_out(
    plan: RunPlan,
    min_nodes: int | None,
    check: Callable[[RunPlan], T],
    err: Console | None = None,
) -> tuple[T, RunPlan]:
    """``check`` the plan's nodes; while it fails for nodes that may be left out, leave
    them out (one line each) and check the rest again. Raises the last PreflightFailed."""
    while True:
        try:
            return check(plan), plan
        except PreflightFailed as exc:
            kept = remaining(plan.hosts, exc.problems, min_nodes)
            if kept is None:
                raise
            hosts, why = kept
            err = err or ui.stderr()
            for name, reason in why.items():
                err.print(
                    f"[yellow]leaving out {escape(name)}[/]: {escape(reason)} "
                    f"({len(hosts)} node(s) remain, --nodes allows {min_nodes})"
                )
            plan = plan_on(plan, hosts)
