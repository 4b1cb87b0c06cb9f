"""``cpuaccel check`` on Slurm's nodes (``--slurm``, ``-i slurm:PARTITION``).

Slurm already knows which nodes are down or drained, and why: such a node is reported
with Slurm's state and reason and never contacted (connecting would only time out, or
reach a node an admin is working on). Where the site lets nobody SSH to a node outside a
job (pam_slurm_adopt, or no sshd at all), every node refuses: that is said as what it
is, with the way that works there, not as a list of unreachable hosts.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from cpuaccel.executor import HostResult, Status
from cpuaccel.facts.gather import Facts
from cpuaccel.facts.problems import ERROR, Problem
from cpuaccel.inventory.host import Host
from cpuaccel.inventory.slurm_source import CPUS_VAR, REASON_VAR, STATE_VAR

NOT_ALLOWED = "SSH to Slurm nodes is not allowed here: use cpuaccel run inside salloc/sbatch"
# What a refusal looks like from paramiko and sshd: no sshd listening, the key or the
# account refused (pam_slurm_adopt's "Access denied ... you have no active jobs"). A
# pattern compiled by re on first use: only an unreachable node's error is read (issue 17).
_REFUSED = (
    r"connection refused|authentication failed|access denied|permission denied|"
    r"pam_slurm|no active jobs"
)


def unavailable(state: str) -> bool:
    """Slurm's verdict on a node state (slurm.partition); imported on first use, as
    inventory_choice does, so that a check of a file inventory, whose hosts have no
    Slurm state, does not load the Slurm modules before its probe goes out (issue 17)."""
    from cpuaccel.slurm.partition import unavailable as slurm_unavailable

    return slurm_unavailable(state)


def slurm_state(host: Host) -> str | None:
    value = host.vars.get(STATE_VAR)
    return str(value) if value else None


def held_back(hosts: Sequence[Host]) -> tuple[list[Host], dict[str, HostResult[Facts]]]:
    """The hosts to contact, and a result for each one Slurm says takes no work."""
    contact: list[Host] = []
    held: dict[str, HostResult[Facts]] = {}
    for host in hosts:
        state = slurm_state(host)
        if state is None or not unavailable(state):
            contact.append(host)
            continue
        from cpuaccel.slurm.partition import describe  # a Slurm node: loaded above

        reason = host.vars.get(REASON_VAR)
        held[host.name] = HostResult(
            host,
            Status.FAILED,
            error=f"Slurm has it {describe(state)} ({state})"
            + (f", reason: {reason}" if reason else ", no reason given")
            + "; not contacted",
            hint=f"once it is fixed, an admin resumes it (scontrol update nodename={host.name} "
            f"state=resume); leave it out meanwhile with --limit '!{host.name}'",
        )
    return contact, held


def was_held(result: HostResult[Any]) -> bool:
    """True for a node :func:`held_back` left alone (Slurm has it down or drained)."""
    state = slurm_state(result.host)
    return result.value is None and state is not None and unavailable(state)


def refusal(results: Sequence[HostResult[Any]]) -> list[str]:
    """The Slurm nodes that refused SSH, when every Slurm node contacted refused it."""
    contacted = [
        r
        for r in results
        if slurm_state(r.host) is not None and not unavailable(r.host.vars[STATE_VAR])
    ]
    refused = [
        r.host.name
        for r in contacted
        if r.status is Status.UNREACHABLE and re.search(_REFUSED, r.error or "", re.IGNORECASE)
    ]
    return refused if contacted and len(refused) == len(contacted) else []


def with_refusal(results: Sequence[HostResult[Any]], problems: list[Problem]) -> list[Problem]:
    """``problems`` with the refused nodes' unreachable errors made one clear line."""
    refused = refusal(results)
    if not refused:
        return problems
    first = next(r for r in results if r.host.name == refused[0])
    names = ", ".join(refused[:5]) + (f" and {len(refused) - 5} more" if len(refused) > 5 else "")
    line = Problem(
        ERROR,
        names,
        NOT_ALLOWED,
        f"every node refused SSH ({refused[0]}: {first.error}); where SSH to nodes is "
        "allowed, give the user and key with -u/--private-key or group_vars/",
    )
    kept = [p for p in problems if p.host not in refused]
    return [line, *kept]


def slurm_json(host: Host) -> dict[str, Any] | None:
    """A host's Slurm state for ``check --json`` (None: not a Slurm node)."""
    state = slurm_state(host)
    if state is None:
        return None
    return {
        "state": state,
        "available": not unavailable(state),
        "cpus": host.vars.get(CPUS_VAR),
        "reason": host.vars.get(REASON_VAR),
    }
