"""Preflight: everything that would make a job hang, checked on every node before launch.

One connection per node, in parallel: the fact probe (versions, launchers, how the node
resolves the others' names, the master port on the head) and a look at the node's copy
of the project (its manifest hash against the controller's); and, on the head node once
every node is connected, the launcher's own ssh (``ssh.sh -N NODE``) to every other
node, so that no job starts that MPI cannot start. Each failure is one line naming the
node (or the pair) and the fix; no job starts unless all pass.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cpuaccel import ui
from cpuaccel.connectors.base import Connector
from cpuaccel.connectors.commandline import quote
from cpuaccel.errors import CpuaccelError
from cpuaccel.executor import (
    Answer,
    HostResult,
    Request,
    Status,
    failed,
    in_one_step,
    in_step,
    run_on_hosts,
)
from cpuaccel.facts import problems as checks
from cpuaccel.facts.gather import (
    PROBE_TIMEOUT,
    Facts,
    gather,
    gather_look_and_keep,
    names_to_resolve,
    settle,
)
from cpuaccel.facts.problems import ERROR, NOTE, Problem
from cpuaccel.inventory.host import Host
from cpuaccel.jobs.launcher_reach import LauncherReach
from cpuaccel.network.choice import JobNetwork

if TYPE_CHECKING:
    from cpuaccel.jobs.connections import Nodes
    from cpuaccel.projectsync.manifest import SourceManifest
# The sync receiver (pathspec) and the run's templates (jinja2) are imported where a
# run's preflight uses them: `check`, which shares this module, needs neither on one
# node, and its whole cost there is start-up.


# A node's kept prelaunch program hears from the controller at least every HEARTBEAT s
# (a request: the files, the sweep at the job's end; else an empty line) while the run
# is watched from here. After KEEP_IDLE s of silence, with no EOF, the controller's
# session is gone unseen (a link cut): the program ends the run's processes on its node
# and leaves. KEEP_IDLE is twice the longest the controller takes to end a run that lost
# a node (its keepalives, the launcher's grace, the teardown), so that where the
# controller lives it is the one that decides.
HEARTBEAT = 5.0
KEEP_IDLE = 90


@dataclass
class NodeState:
    facts: Facts
    project: dict[str, Any] | None  # the sync program's look at the project folder
    swept: list[str] = field(default_factory=list)  # ended runs' processes ended there


@dataclass
class Preflight:
    results: list[HostResult[NodeState]]
    problems: list[Problem] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)  # nodes whose project copy differs
    network: JobNetwork | None = None  # the job's network, chosen from the facts

    @property
    def facts(self) -> dict[str, Facts]:
        return {r.host.name: r.value.facts for r in self.results if r.value is not None}

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == ERROR]

    @property
    def notes(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == NOTE]

    @property
    def swept(self) -> list[tuple[str, str]]:
        """(node, what was ended there of an ended run) (jobs/teardown.end_leftovers)."""
        return [(r.host.name, line) for r in self.results if r.value for line in r.value.swept]


def _differs(source: SourceManifest, project: dict[str, Any]) -> list[str]:
    if project.get("entries") is None and project.get("hash") == source.hash:
        return []  # the node holds exactly the source's tree
    entries = project.get("entries") or {}
    # Compared as tuples: the node's report may carry its entries as lists (JSON).
    return [
        rel
        for rel, entry in source.entries.items()
        if tuple(entries.get(rel) or ()) != tuple(entry)
    ]


@dataclass(frozen=True)
class Checks:
    """What a run's preflight checks besides each node's facts: ``master_port`` free on
    the head; the launcher of ``launcher_flavour`` there (None: whichever is found);
    the node's copy of the project, unless ``check_project`` is False (a run on this
    machine uses it where it is); ``network``: the job's network from the facts
    (jobs/plan.job_network), whose problems are the preflight's: the names of the nodes
    need not resolve, as the job uses the addresses chosen there. ``runs``: the
    controller's run records; a node still running processes of a run recorded there as
    ended has them ended (``Preflight.swept`` says so)."""

    master_port: int
    launcher_flavour: str | None
    check_project: bool = True
    network: Callable[[dict[str, Facts]], JobNetwork | None] | None = None
    runs: Path | None = None


def run_preflight(
    hosts: Sequence[Host],
    project_dest: str,
    source: SourceManifest,
    nodes: Nodes,
    asked: Checks,
    *,
    reach: LauncherReach | None = None,
    on_host: Callable[[str], None] | None = None,
) -> Preflight:
    """Probe every node at once, over ``nodes``' connections; each node's program stays
    open in ``nodes.kept`` for the job's later requests (its files, its sweep), which
    the caller closes when no job is to start. ``reach`` (which needs the pool) is told
    of each connection as it opens and each host as it ends; ``on_host`` (the progress
    bar) is given each host's name as it ends."""
    master_port, runs = asked.master_port, asked.runs
    check_project = asked.check_project
    head = hosts[0]

    def probe(conn: Connector) -> NodeState:
        state = _probe(conn)
        if runs is not None and state.facts.get("runs"):
            from cpuaccel.jobs.teardown import end_leftovers

            state.swept = end_leftovers(conn, state.facts.get("runs"), runs)
        return state

    def _probe(conn: Connector) -> NodeState:
        if reach is not None:
            reach.connected(conn)
        port = master_port if conn.host.name == head.name else None
        names = names_to_resolve(conn.host, hosts)
        if not check_project:
            return NodeState(gather(conn, names, port), None)
        # One call, not two: every node's interpreter start counts at scale.
        from cpuaccel.projectsync import receiver

        look = receiver.words("look", project_dest, conn.host.workdir, source.hash)[1:]
        facts, project, program = gather_look_and_keep(
            conn, names, port, look, KEEP_IDLE, HEARTBEAT
        )
        nodes.kept.add(conn.host.name, program)
        return NodeState(facts, receiver.checked(conn.host.name, project))

    def on_result(result: HostResult[Any]) -> None:
        if reach is not None:
            reach.finished(result)
        if on_host is not None:
            on_host(result.host.name)

    if in_one_step(hosts):  # an allocation: one srun step each
        results = _in_one_step(hosts, project_dest, source, master_port, check_project)
        for result in results:
            on_result(result)
    else:
        results = run_on_hosts(
            hosts,
            probe,
            forks=nodes.forks,
            options=nodes.connect,
            pool=nodes.pool,
            on_result=on_result,
        )
    found = Preflight(results)
    facts = found.facts
    found.problems += without_them(checks.unreachable(results))
    found.problems += [p for p in checks.drift(facts) if p.severity == ERROR]
    network = asked.network
    if network is not None and len(facts) == len(hosts):
        found.network = network(facts)
        found.problems += found.network.problems if found.network is not None else []
    _check_nodes(found, source)
    flavour = asked.launcher_flavour
    found.problems += head_problems(facts, head.name, master_port, flavour)
    return found


def without_them(unreachable: list[Problem]) -> list[Problem]:
    """The unreachable nodes' problems, each one's fix with the way to run without them
    all: ``--limit '!node2'`` (quoted for a shell), the run said once."""
    if not unreachable:
        return unreachable
    pattern = quote(":".join(f"!{p.host}" for p in unreachable))
    leave = f"or run without {'it' if len(unreachable) == 1 else 'them'}: --limit {pattern}"
    return [
        dataclasses.replace(p, hint=f"{p.hint}; {leave}" if p.hint else leave) for p in unreachable
    ]


def _in_one_step(
    hosts: Sequence[Host],
    project_dest: str,
    source: SourceManifest,
    master_port: int,
    check_project: bool,
) -> list[HostResult[NodeState]]:
    """The same probe and look as over connections, for an allocation's nodes: the
    fact probe in ONE srun step over every node, the look at the project in another,
    both at once (executor.in_step), rather than two steps a node."""
    from cpuaccel.projectsync import receiver

    head = hosts[0]

    def facts_words(h: Host) -> list[str]:
        port = str(master_port) if h.name == head.name else ""
        return [h.workdir, h.setvars or "", port, *names_to_resolve(h, hosts)]

    looked: dict[str, HostResult[Answer]] = {}

    def look_words(h: Host) -> list[str]:
        return receiver.words("look", project_dest, h.workdir, source.hash)

    def look() -> None:
        what = f"syncing to {project_dest}"
        found = in_step(hosts, Request("tree", look_words, what, PROBE_TIMEOUT))
        looked.update((r.host.name, r) for r in found)

    other = threading.Thread(target=ui.carried(look), daemon=True)
    if check_project:
        other.start()
    sent = time.time()
    probed = in_step(hosts, Request("facts", facts_words, "the fact probe", PROBE_TIMEOUT))
    received = time.time()
    if check_project:
        other.join(PROBE_TIMEOUT)
    results: list[HostResult[NodeState]] = []
    seconds = received - sent
    for probe in probed:
        h = probe.host
        seen = looked.get(h.name, _UNANSWERED) if check_project else None
        bad = next((r for r in (probe, seen) if r is not None and not r.ok), None)
        if bad is not None:  # the probe's error first, then the look's
            results.append(HostResult(h, bad.status, None, bad.error, bad.hint, seconds))
            continue
        try:  # each result ok: each holds its node's answer
            project = receiver.checked(h.name, seen.value or {}) if seen is not None else None
            state = NodeState(settle(probe.value or {}, sent, received), project)
            results.append(HostResult(h, Status.OK, state, seconds=seconds))
        except CpuaccelError as exc:
            results.append(failed(h, exc, seconds))
    return results


# A node whose look did not end with the probe (in PROBE_TIMEOUT more).
_UNANSWERED: HostResult[Answer] = HostResult(Host("-"), Status.FAILED, error="no answer in time")


def _check_nodes(found: Preflight, source: SourceManifest) -> None:
    """Every node ready (``readiness``), its project copy current."""
    for r in found.results:
        if r.value is None:
            continue
        found.problems += readiness(r.host, r.value.facts)
        if r.value.project is not None and _differs(source, r.value.project):
            found.stale.append(r.host.name)


def readiness(host: Host, facts: Facts) -> list[Problem]:
    """What every rank needs on a node: cpuaccel installed for its Python, and its
    cpuaccel_setvars present. ``check`` reports the same, so that it passes no node
    that this preflight would refuse."""
    problems = []
    if facts["packages"].get("cpuaccel") is None:
        problems.append(
            Problem(
                ERROR,
                host.name,
                f"cpuaccel is not installed for {facts['python']['executable']}",
                hint="every rank runs python -m cpuaccel.worker: run cpuaccel provision",
            )
        )
    if host.setvars and not facts["setvars"]["exists"]:
        problems.append(
            Problem(
                ERROR,
                host.name,
                f"cpuaccel_setvars {host.setvars} does not exist here",
                hint="fix cpuaccel_setvars, or install oneAPI there",
            )
        )
    return problems


def head_problems(
    facts: dict[str, Facts], head: str, master_port: int, launcher_flavour: str | None
) -> list[Problem]:
    """The head node: the master port free, and the launcher the job will use present
    (``check`` reports the same, from the settings a run would use)."""
    head_facts = facts.get(head)
    if head_facts is None:
        return []
    problems = []
    if head_facts.get("port_free") is False:
        problems.append(
            Problem(
                ERROR,
                head,
                f"master port {master_port} is in use on the head node",
                hint="pass another --master-port, or end what listens there",
            )
        )
    flavours = [lau["flavour"] for lau in head_facts["mpi"]["launchers"]]
    if launcher_flavour is not None and launcher_flavour not in flavours:
        problems.append(
            Problem(
                ERROR,
                head,
                f"no {launcher_flavour} launcher here (found: {', '.join(flavours) or 'none'})",
                hint="install it, pick another --launcher, or set cpuaccel_mpirun",
            )
        )
    return problems
