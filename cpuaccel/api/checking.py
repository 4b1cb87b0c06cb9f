"""Checking nodes: are all reachable, alike and ready for a run?

``check_target`` gathers every selected host's facts in parallel and judges them as
``cpuaccel check`` reports them: unreachable nodes, version drift, names a node cannot
resolve, what a run's preflight would refuse, and the pairs the head node's MPI launcher
cannot ssh to. ``check`` is the same from Python, with the host keywords of
``target_of``. Neither prints a table: that is the CLI's (cli/check.py).

On Slurm's nodes (an inventory ``slurm:PARTITION``), Slurm already knows which nodes are
down or drained, and why: such a node is reported with Slurm's state and reason and never
contacted (connecting would only time out, or reach a node an admin is working on).
Where the site lets nobody SSH to a node outside a job (pam_slurm_adopt, or no sshd at
all), every node refuses: that is said as one problem, with the way that works there,
not as a list of unreachable hosts.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Unpack

from cpuaccel import ui
from cpuaccel.api.output import quiet_unless
from cpuaccel.api.target import HostKeywords, HostOptions, Target
from cpuaccel.config.settings import LaunchSettings
from cpuaccel.connectors.base import Connector
from cpuaccel.errors import EXIT_NODE_FAILED, EXIT_OK, EXIT_PROBLEMS, CpuaccelError, UsageError
from cpuaccel.executor import ConnectionPool, HostResult, Status, in_one_step, run_on_hosts
from cpuaccel.facts.gather import Facts, gather, names_to_resolve
from cpuaccel.facts.problems import (
    ERROR,
    NOTE,
    WARNING,
    Problem,
    find_problems,
    same_account,
)
from cpuaccel.inventory.host import Host
from cpuaccel.inventory.slurm_source import CPUS_VAR, REASON_VAR, STATE_VAR
from cpuaccel.jobs.launcher_reach import LauncherReach
from cpuaccel.jobs.plan import RunPlan, Script, build_plan, job_network, new_run_id
from cpuaccel.jobs.preflight import head_problems, readiness


@dataclass(frozen=True)
class CheckResult:
    """What a check found: every selected host's result (its facts as ``value``, or why
    there are none), in inventory order; the problems (errors and warnings) that decide
    the verdict; and notes, which are said but never counted."""

    results: tuple[HostResult[Facts], ...]
    problems: tuple[Problem, ...]
    notes: tuple[Problem, ...] = ()
    # The job's network: each node's address and interface, and the connections the
    # network doctor tried (None: one node, this machine alone, or not tried).
    network: dict[str, Any] | None = None

    @property
    def hosts(self) -> dict[str, HostResult[Facts]]:
        """Each host's result by its inventory name."""
        return {r.host.name: r for r in self.results}

    @property
    def exit_code(self) -> int:
        """``cpuaccel check``'s exit code: 0 consistent (warnings allowed), 1 problems of
        error severity, 69 a host was unreachable."""
        return exit_code(self.results, self.problems)

    @property
    def ok(self) -> bool:
        """Every host reachable and no problem of error severity (warnings allowed)."""
        return self.exit_code == EXIT_OK

    def to_json(self) -> dict[str, Any]:
        """What ``cpuaccel check --json`` prints."""
        return {
            **to_json(self.results, self.problems),
            "notes": [note.to_json() for note in self.notes],
            "network": self.network,
        }


def check_target(target: Target, *, every_pair: bool = False) -> CheckResult:
    """Check the hosts of ``target``: their facts, gathered in parallel (a progress bar
    on a terminal), and the problems a run would meet on them. An unreachable host is a
    result, not an exception. The network doctor tries what a job needs (each node to
    the head's master port, each to the next node), or with ``every_pair`` every ordered
    pair of nodes."""
    results, found, network = gather_all(target, every_pair=every_pair)
    problems = with_refusal(results, find_problems(results))
    # What run's preflight refuses on each node, then the pairs the launcher cannot
    # reach and the job's network.
    problems += [p for r in results if r.value is not None for p in readiness(r.host, r.value)]
    problems += [p for p in found if p.severity != NOTE]
    notes = same_account(results) + [p for p in found if p.severity == NOTE]
    notes += [
        Problem(NOTE, r.host.name, line)
        for r in results
        if r.value is not None
        for line in r.value.get("swept") or ()
    ]
    return CheckResult(tuple(results), tuple(problems), tuple(notes), network)


def check(
    inventory: str | os.PathLike[str] | None = None,
    *,
    slurm: str | None = None,
    progress: bool = False,
    **hosts: Unpack[HostOptions],
) -> CheckResult:
    """Gather facts from every node and report what differs, as ``cpuaccel check`` does.

    The host keywords are ``target_of``'s (``inventory``: a file, ``"node1,node2,"``, or
    ``"slurm:PARTITION"``; default ``$CPUACCEL_INVENTORY``, else ./inventory.yaml, else
    this machine alone). ``slurm``: a Slurm partition's nodes (``""`` the default
    partition), the same as ``inventory="slurm:PARTITION"``. Prints nothing unless
    ``progress``.

    Returns a ``CheckResult``; ``.ok`` is False when a host is unreachable or a problem
    is an error, which is never raised. Raises ``cpuaccel.errors.UsageError`` for a bad
    keyword, ``InventoryError`` or ``ProjectFileError`` for a wrong inventory or project
    file (all before any host is contacted).
    """
    with quiet_unless(progress):
        if slurm is not None:
            if not isinstance(slurm, str):
                raise UsageError(
                    f"slurm={slurm!r}: expected a partition's name",
                    hint="e.g. slurm='batch', or slurm='' for the default partition",
                )
            if inventory is not None:
                raise UsageError(
                    f"two inventories given: inventory={str(inventory)!r} and slurm={slurm!r}",
                    hint="give either inventory or slurm",
                )
            inventory = f"slurm:{slurm}"
        target = HostKeywords.of(inventory, hosts, "slurm", "progress").target()
        return check_target(target)


def gather_all(
    target: Target, *, every_pair: bool = False
) -> tuple[list[HostResult[Facts]], list[Problem], dict[str, Any] | None]:
    """Facts from every selected host in parallel, with a progress bar on a terminal
    (a node Slurm has down or drained is not contacted: its result says why); and, in
    the same pass, what run's preflight checks from the settings a run would use: the
    head node's launcher ssh to every other node (jobs/launcher_reach.LauncherReach, its
    problems named head -> node), the launcher on the head, and the job's network
    (the address each node would use, and the network doctor's connections over them:
    returned for --json)."""
    view = run_view(target)
    if isinstance(view, Problem):
        return _gather(target, None), [view], None
    with ConnectionPool(replace(target.connect, keep=True)) as pool:
        # One host, or only this machine: no other node to reach, and nothing is tried.
        reach = LauncherReach(view.draft, target.connect, pool)
        results = _gather(target, reach, pool, keep=view.draft.head.name)
        facts = {r.host.name: r.value for r in results if r.value is not None}
        network, problems, faults = _network(view, facts, target, pool, every_pair)
        if any(p.severity == ERROR for p in faults):  # the cause the reach would time out on
            reach.leave()
        else:
            problems += reach.problems()  # bounded: the reach's own timeout
        problems += faults
    launcher = view.settings.launcher.value
    head = view.draft.head.name
    # The master port is not probed: a job holding it now may be gone when the run starts.
    port = view.settings.master_port.value
    problems += head_problems(facts, head, port, None if launcher == "auto" else launcher)
    return results, problems, network


def _network(
    view: RunView,
    facts: dict[str, Facts],
    target: Target,
    pool: ConnectionPool,
    every_pair: bool,
) -> tuple[dict[str, Any] | None, list[Problem], list[Problem]]:
    """The job's network as a run would choose it, and, where it is whole, the network
    doctor's diagnosis over it: (both as JSON, the choice's problems, the doctor's)."""
    hosts = view.draft.hosts
    network = job_network(view.settings, hosts, facts) if len(facts) == len(hosts) else None
    if network is None:
        return None, [], []
    shown: dict[str, Any] = network.to_json()
    if not network.complete or in_one_step(hosts):
        return shown, network.problems, []
    from cpuaccel.network import doctor  # only for several nodes: off check's start-up

    found = doctor.diagnose_job(
        hosts,
        network,
        master_port=view.settings.master_port.value,
        pairs=doctor.ALL if every_pair else doctor.RING,
        connect=target.connect,
        forks=target.forks,
        pool=pool,
    )
    shown["doctor"] = found.to_json()
    return shown, network.problems, found.problems


def _gather(
    target: Target,
    reach: LauncherReach | None,
    pool: ConnectionPool | None = None,
    keep: str | None = None,
) -> list[HostResult[Facts]]:
    """Facts of every host; with ``keep`` (the head, which the launcher-reach pass uses
    afterwards), every other host's connection is closed as soon as its facts are in, so
    that open connections (a socket and a paramiko thread each) stay bounded by --forks,
    not one per node for the whole command."""
    hosts = target.hosts
    contact, held = held_back(hosts)
    for result in held.values():  # never connected: the reach leaves them out
        if reach is not None:
            reach.finished(result)

    def probe(conn: Connector) -> Facts:
        # Its key goes into the run's known_hosts once ssh verified it: at connect,
        # or with the first command where connect opens nothing (an OpenSSH master).
        if reach is not None and not conn.opens_lazily:
            reach.connected(conn)
        facts = gather(conn, names_to_resolve(conn.host, hosts))
        if facts.get("runs"):  # jobs' processes there: those of a run ended here end
            from pathlib import Path

            from cpuaccel.history.records import RUNS
            from cpuaccel.jobs.teardown import end_leftovers

            facts["swept"] = end_leftovers(conn, facts["runs"], Path.cwd() / RUNS)
        if reach is not None and conn.opens_lazily:
            reach.connected(conn)
        if pool is not None and keep is not None and conn.host.name != keep:
            pool.discard(conn.host)  # done with it: nothing later in check uses it
        return facts

    with ui.progress("gathering facts", len(contact)) as bar:

        def on_result(result: HostResult[Facts]) -> None:
            if reach is not None:
                reach.finished(result)
            bar.advance(result.host.name)

        gathered = run_on_hosts(
            contact,
            probe,
            forks=target.forks,
            options=target.connect,
            pool=pool,
            on_result=on_result,
            one_inline=True,  # one node: no thread pool to start, off check's start-up
        )
    by_name = {r.host.name: r for r in gathered} | held
    return [by_name[host.name] for host in hosts]


@dataclass(frozen=True)
class RunView:
    """What a run with no flags would use on these hosts: its settings, and its draft
    plan on every selected host (what the launcher's ssh files are made from)."""

    settings: LaunchSettings
    draft: RunPlan


def run_view(target: Target) -> RunView | Problem:
    """The run's view of the selected hosts, head first (the project file's head, else
    the first). When a run would refuse these settings (its own error says why), a
    warning that its checks were not tried: check's verdict stays about the nodes."""
    hosts = target.hosts
    try:
        # --nodes all of them: check tries every selected host, not the first N.
        flags = {"nodes": len(hosts)}
        settings = target.settings(flags, hosts)
        return RunView(settings, build_plan(settings, Script("check"), None, new_run_id()))
    except CpuaccelError as exc:
        message = f"a run would refuse these settings, so its checks were not tried: {exc.message}"
        return Problem(WARNING, None, message, hint=exc.hint)


def exit_code(results: Sequence[HostResult[Facts]], problems: Sequence[Problem]) -> int:
    if any(r.status is Status.UNREACHABLE for r in results):
        return EXIT_NODE_FAILED
    if any(p.severity == ERROR for p in problems):
        return EXIT_PROBLEMS
    return EXIT_OK


def to_json(results: Sequence[HostResult[Facts]], problems: Sequence[Problem]) -> dict[str, Any]:
    return {
        "hosts": {
            r.host.name: {
                "reachable": r.status is not Status.UNREACHABLE,
                "status": r.status.value,
                "facts": r.value,
                "error": r.error,
                **_slurm_part(r.host),
            }
            for r in results
        },
        "problems": [p.to_json() for p in problems],
    }


def _slurm_part(host: Host) -> dict[str, Any]:
    slurm = slurm_json(host)
    return {"slurm": slurm} if slurm is not None else {}


# ---------------------------------------------------------------- Slurm's nodes
NOT_ALLOWED = "SSH to Slurm nodes is not allowed here: use cpuaccel run inside salloc/sbatch"
# What a refusal looks like from paramiko and sshd: no sshd listening, the key or the
# account refused (pam_slurm_adopt's "Access denied ... you have no active jobs"). A
# pattern compiled by re on first use: only an unreachable node's error is read.
_REFUSED = (
    r"connection refused|authentication failed|access denied|permission denied|"
    r"pam_slurm|no active jobs"
)


def unavailable(state: str) -> bool:
    """Slurm's verdict on a node state (slurm.partition); imported on first use, as
    inventory_choice does, so that a check of a file inventory, whose hosts have no
    Slurm state, does not load the Slurm modules before its probe goes out."""
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
