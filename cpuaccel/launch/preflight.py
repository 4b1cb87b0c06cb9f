"""Preflight: everything that would make a job hang, checked on every node before launch.

One connection per node, in parallel: the fact probe (versions, launchers, how the node
resolves the others' names, the master port on the head) and a look at the node's copy
of the project (its manifest hash against the controller's). Each failure is one line
naming the node and the fix; no job starts unless all pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cpuaccel.connectors.base import ConnectOptions, Connector
from cpuaccel.executor import ConnectionPool, HostResult, run_on_hosts
from cpuaccel.facts import problems as checks
from cpuaccel.facts.gather import Facts, gather, names_to_resolve
from cpuaccel.facts.problems import ERROR, Problem
from cpuaccel.inventory.host import Host
from cpuaccel.sync.manifest import SourceManifest
from cpuaccel.sync.receiver import call_remote


@dataclass
class NodeState:
    facts: Facts
    project: dict[str, Any] | None  # the sync program's look at the project folder


@dataclass
class Preflight:
    results: list[HostResult[NodeState]]
    problems: list[Problem] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)  # nodes whose project copy differs

    @property
    def facts(self) -> dict[str, Facts]:
        return {r.host.name: r.value.facts for r in self.results if r.value is not None}

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == ERROR]


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


def run_preflight(
    hosts: Sequence[Host],
    project_dest: str,
    source: SourceManifest,
    *,
    master_port: int,
    forks: int,
    connect: ConnectOptions,
    launcher_flavour: str | None,
    check_project: bool = True,
    pool: ConnectionPool | None = None,
) -> Preflight:
    head = hosts[0]

    def probe(conn: Connector) -> NodeState:
        port = master_port if conn.host.name == head.name else None
        facts = gather(conn, names_to_resolve(conn.host, hosts), port)
        project = (
            call_remote(conn, "look", project_dest, expect=source.hash) if check_project else None
        )
        return NodeState(facts, project)

    results = run_on_hosts(hosts, probe, forks=forks, options=connect, pool=pool)
    found = Preflight(results)
    facts = found.facts
    found.problems += checks.unreachable(results)
    found.problems += [p for p in checks.drift(facts) if p.severity == ERROR]
    found.problems += checks.resolution(facts)
    _check_nodes(found, source)
    _check_head(found, head.name, master_port, launcher_flavour)
    return found


def _check_nodes(found: Preflight, source: SourceManifest) -> None:
    """Every node: cpuaccel installed, its setvars.sh present, its project copy current."""
    for r in found.results:
        if r.value is None:
            continue
        name, f = r.host.name, r.value.facts
        if f["packages"].get("cpuaccel") is None:
            found.problems.append(
                Problem(
                    ERROR,
                    name,
                    f"cpuaccel is not installed for {f['python']['executable']}",
                    hint="every rank runs python -m cpuaccel.worker: run cpuaccel provision",
                )
            )
        if r.host.setvars and not f["setvars"]["exists"]:
            found.problems.append(
                Problem(
                    ERROR,
                    name,
                    f"cpuaccel_setvars {r.host.setvars} does not exist here",
                    hint="fix cpuaccel_setvars, or install oneAPI there",
                )
            )
        if r.value.project is not None and _differs(source, r.value.project):
            found.stale.append(name)


def _check_head(
    found: Preflight, head: str, master_port: int, launcher_flavour: str | None
) -> None:
    """The head node: the master port free, and the launcher the job will use present."""
    head_facts = found.facts.get(head)
    if head_facts is not None:
        if head_facts.get("port_free") is False:
            found.problems.append(
                Problem(
                    ERROR,
                    head,
                    f"master port {master_port} is in use on the head node",
                    hint="pass another --master-port, or end what listens there",
                )
            )
        flavours = [lau["flavour"] for lau in head_facts["mpi"]["launchers"]]
        if launcher_flavour is not None and launcher_flavour not in flavours:
            found.problems.append(
                Problem(
                    ERROR,
                    head,
                    f"no {launcher_flavour} launcher here (found: {', '.join(flavours) or 'none'})",
                    hint="install it, pick another --launcher, or set cpuaccel_mpirun",
                )
            )
