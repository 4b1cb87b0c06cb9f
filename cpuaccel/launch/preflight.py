"""Preflight: everything that would make a job hang, checked on every node before launch.

One connection per node, in parallel: the fact probe (versions, launchers, how the node
resolves the others' names, the master port on the head) and a look at the node's copy
of the project (its manifest hash against the controller's). Then, on the head node,
the launcher's own ssh (``ssh.sh NODE true``) to every other node, so that no job
starts that MPI cannot start. Each failure is one line naming the node (or the pair)
and the fix; no job starts unless all pass.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cpuaccel.connectors import openssh, programs
from cpuaccel.connectors.base import ConnectOptions, Connector
from cpuaccel.errors import CpuaccelError
from cpuaccel.executor import ConnectionPool, HostResult, run_on_hosts
from cpuaccel.facts import problems as checks
from cpuaccel.facts.gather import Facts, gather, names_to_resolve
from cpuaccel.facts.problems import ERROR, Problem
from cpuaccel.inventory.host import Host
from cpuaccel.launch.plan import RunPlan
from cpuaccel.sync.engine import call_remote
from cpuaccel.sync.manifest import SourceManifest


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


# ---------------------------------------------------------------- the launcher's ssh

REACH_TIMEOUT = 15.0  # seconds for every ssh.sh NODE true from the head, all at once


def check_launcher_reach(
    head: Connector, plan: RunPlan, files: dict[str, tuple[int, str]], targets: Sequence[Host]
) -> list[Problem]:
    """From the head node, ``ssh.sh NODE true`` to every node of ``targets`` at once,
    with the run's own ssh.sh and ssh_config: the way MPI's launcher will start its
    proxies. A pair that fails is one problem naming head -> node and the fix."""
    if not targets:
        return []
    names = [h.name for h in targets]
    words = ["reach", plan.run_dir, f"{REACH_TIMEOUT:g}", *names]
    payload = json.dumps(files).encode()
    what = "trying the launcher's ssh from the head node"
    try:
        answer = programs.call(head, "jobs", words, payload, what=what, timeout=REACH_TIMEOUT + 30)
    except CpuaccelError as exc:
        return [Problem(ERROR, head.host.name, f"{what}: {exc}")]
    problems = []
    for host in targets:
        code, said = answer["reach"].get(host.name) or [None, ""]
        if code != 0:
            problems.append(_unreached(plan.head, host, code, said))
    return problems


def _unreached(head: Host, node: Host, code: int | None, said: str) -> Problem:
    port = openssh.port_of(node)
    user = f"{node.user}@" if node.user else ""
    where = f"{user}{node.address}:{port}"
    if code is None:
        outcome = f"no answer within {REACH_TIMEOUT:g} s"
    else:
        outcome = f"exit code {code}" + (f": {said}" if said else "")
    message = f"the MPI launcher on {head.name} cannot ssh to {node.name} ({where}): {outcome}"
    low = said.lower()
    if "host key" in low or "identification has changed" in low:
        hint = (
            f"from {head.name}, {node.address}:{port} answers with another host key than the "
            f"controller verified: make ansible_host of {node.name} an address that means "
            "the same machine from every node"
        )
    elif "permission denied" in low or "too many authentication" in low:
        key = node.key_file or "the head's default keys"
        hint = (
            f"{node.name} must let {node.user or 'the same user'} log in from {head.name} with "
            f"{key} (a key path is read on {head.name}, ~ is the home there): copy the key "
            f"there or authorize the head's, and check AllowUsers/Match in {node.name}'s sshd"
        )
    elif "resolve" in low:
        hint = f"{node.address} does not resolve on {head.name}: use an ansible_host all resolve"
    else:
        hint = (
            f"{head.name} cannot open {node.address}:{port}: let {node.name}'s sshd accept "
            "connections from the other nodes (firewall, ListenAddress), or set "
            "ansible_host/ansible_port to what the nodes' network reaches"
        )
    return Problem(ERROR, f"{head.name} -> {node.name}", message, hint=hint)
