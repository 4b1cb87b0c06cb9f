"""How one job of ``cpuaccel run`` reaches its nodes (``Nodes``): one connection a node
for every phase (preflight, sync, copy, launch, sweep) and, on it, the preflight's node
program kept open for the copy and the sweep (``executor.KeptPrograms``); the run's files written
on every node, and its secrets taken back off them when no job starts.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from cpuaccel import ui
from cpuaccel.connectors import broadcast, broadcast_policy
from cpuaccel.connectors.connect_options import ConnectOptions
from cpuaccel.errors import UsageError
from cpuaccel.executor import Answer, ConnectionPool, HostResult, KeptPrograms, Request, call_all
from cpuaccel.inventory.host import Host
from cpuaccel.jobs.plan import RunPlan
from cpuaccel.jobs.rundir import SECRET_FILES

JobFiles = dict[str, tuple[int, str]]  # name -> (mode, text), as render_job_files gives


@dataclass(frozen=True)
class Nodes:
    """The job's connections and kept programs; as a context manager, the kept programs
    end (EOF: a node writes nothing more) when the job does, before the connections."""

    connect: ConnectOptions
    forks: int
    pool: ConnectionPool
    kept: KeptPrograms = field(default_factory=KeptPrograms)

    def fan(self) -> dict[str, Any]:
        return {"forks": self.forks, "pool": self.pool, "kept": self.kept}

    def __enter__(self) -> Nodes:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.kept.close()


@dataclass(frozen=True)
class Copied:
    """Where the run's large files came from, by node: ``cast``, the nodes that took them
    by broadcast; ``held``, those that held them intact from an earlier attempt."""

    cast: list[str] = field(default_factory=list)
    held: list[str] = field(default_factory=list)

    def record(self) -> dict[str, list[str]]:
        """The fields for run.json: what there is to say."""
        fields = {"broadcast": self.cast, "large_files_held": self.held}
        return {key: names for key, names in fields.items() if names}


def copy_files(
    plan: RunPlan, files: JobFiles, nodes: Nodes, note: Callable[[str], None] = lambda line: None
) -> Copied:
    """The run's files written on every node (by its kept prelaunch program where open),
    or none started: a node that failed is said with the fix.

    Large files (a notebook's pickled call with the data it captured) that several
    nodes take go by one broadcast (cpuaccel.connectors.broadcast), once the rest made
    the run folder, rather than once per node in each node's request: ``note`` takes
    the line for a node it cut out, which then gets them the usual way. A node that
    holds a large file already, as an earlier attempt of the run left it (same mode and
    sha256, checked there), is not sent it again."""
    large = _large(files, plan.hosts)
    held = {name: (files[name][0], _sha256(files[name][1])) for name in large}
    small = {n: f for n, f in files.items() if n not in large}
    results = _write(plan, plan.hosts, small, nodes, held)
    holding = [r.host for r in results if r.ok]  # the hosts that took secret.env, if any
    failed = [r for r in results if not r.ok]
    copied = Copied()
    if large and not failed:
        needs = {r.host.name: large - set((r.value or {}).get("held", [])) for r in results}
        wanting = [h for h in plan.hosts if needs[h.name]]
        held_all = sorted(name for name, rels in needs.items() if not rels)
        wanted = frozenset().union(*(needs[h.name] for h in wanting))
        cast = []
        if _large({n: files[n] for n in wanted}, wanting):  # still worth a broadcast
            cast = _broadcast(plan, wanting, files, needs, nodes, note)
        copied = Copied(cast, held_all)
        rest = [h for h in wanting if h.name not in cast]
        failed = _write_each(plan, rest, files, needs, nodes)
    if failed:
        if "secret.env" in files:  # no job starts: take the secrets back off every holder
            forget_secrets(plan, holding, nodes)
        raise UsageError(
            "; ".join(f"{r.host.name}: {r.error}" for r in failed),
            hint="check free disk and permissions at cpuaccel_workdir",
        )
    return copied


def broadcast_note(line: str) -> None:
    """A broadcast's line (a node cut out) on stderr, as sync shows it."""
    ui.stderr().print(f"broadcast: {ui.escape(line)}")


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _write(
    plan: RunPlan,
    hosts: list[Host],
    files: JobFiles,
    nodes: Nodes,
    held: dict[str, tuple[int, str]] | None = None,
) -> list[HostResult[Answer]]:
    """``files`` written into the run folder on ``hosts`` (made there, 0700): each
    host's result, with the names of ``held`` ({name: (mode, sha256)}) it holds already."""
    # the same request everywhere: one srun step in Slurm
    payload = json.dumps({"files": files, "held": held or {}}).encode()
    words, what = ["write", plan.run_dir], "writing the run's files"
    return call_all(hosts, Request("jobctl", words, what, 600.0, payload), **nodes.fan())


def _write_each(
    plan: RunPlan,
    hosts: list[Host],
    files: JobFiles,
    needs: dict[str, frozenset[str]],
    nodes: Nodes,
) -> list[HostResult[Answer]]:
    """Each host's ``needs`` of ``files`` written directly (one request for the hosts
    that need the same); the results that failed."""
    groups: dict[frozenset[str], list[Host]] = {}
    for host in hosts:
        groups.setdefault(needs[host.name], []).append(host)
    failed: list[HostResult[Answer]] = []
    for names, group in groups.items():
        results = _write(plan, group, {n: files[n] for n in sorted(names)}, nodes)
        failed += [r for r in results if not r.ok]
    return failed


def _large(files: JobFiles, hosts: list[Host]) -> frozenset[str]:
    """The files worth one broadcast (broadcast_policy.choose) to the ``hosts`` that
    relays reach, each of which needs them all; no secret goes."""
    sizes = {name: len(text) for name, (_, text) in files.items() if name not in SECRET_FILES}
    needs = {h.name: sizes.keys() for h in hosts if broadcast_policy.relays(h)}
    return frozenset().union(*broadcast_policy.choose(needs, sizes).values())


def _broadcast(
    plan: RunPlan,
    hosts: list[Host],
    files: JobFiles,
    needs: dict[str, frozenset[str]],
    nodes: Nodes,
    note: Callable[[str], None],
) -> list[str]:
    """Into the run folder of each of ``hosts`` that relays reach, the ``files`` it
    ``needs``; the hosts that kept them all (each checked by sha256 there)."""
    hosts = [h for h in hosts if broadcast_policy.relays(h)]
    names = sorted(set().union(*(needs[h.name] for h in hosts)))
    with tempfile.TemporaryDirectory(prefix="cpuaccel-cast-") as folder:
        payload = []
        for name in names:
            mode, text = files[name]
            path = os.path.join(folder, name)
            with open(path, "wb") as f:
                f.write(text.encode())
            os.chmod(path, mode)
            payload.append(broadcast.payload_file(path, name))
        roots = dict.fromkeys([h.name for h in hosts], plan.run_dir)
        keep = {h.name: needs[h.name] for h in hosts}
        listen = broadcast.Listeners(note=note)
        done = broadcast.Broadcast(
            nodes.pool, hosts, roots, payload, keep=keep, listen=listen
        ).run()
    broadcast_policy.fall_back(done, note, "its run files go directly")
    return sorted(name for name, d in done.items() if d.ok and set(d.kept) == needs[name])


def forget_secrets(plan: RunPlan, hosts: list[Host], nodes: Nodes) -> None:
    words = ["end", plan.run_id, "0", plan.run_dir]
    what = "removing the run's secrets"
    call_all(hosts, Request("jobctl", words, what, 600.0), **nodes.fan())
