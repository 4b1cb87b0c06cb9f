"""How one job of ``cpuaccel run`` reaches its nodes (``Nodes``): one connection a node
for every phase (preflight, sync, copy, launch, sweep) and, on it, the preflight's node
program kept open for the copy and the sweep (``fanout.Kept``); the run's files written
on every node, and its secrets taken back off them when no job starts.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from cpuaccel import ui
from cpuaccel.connectors import broadcast
from cpuaccel.connectors.connect_options import ConnectOptions
from cpuaccel.errors import UsageError
from cpuaccel.executor import ConnectionPool, HostResult
from cpuaccel.history import fanout
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
    kept: fanout.Kept = field(default_factory=fanout.Kept)

    def fan(self) -> dict[str, Any]:
        return {"forks": self.forks, "pool": self.pool, "kept": self.kept}

    def __enter__(self) -> Nodes:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.kept.close()


def copy_files(
    plan: RunPlan, files: JobFiles, nodes: Nodes, note: Callable[[str], None] = lambda line: None
) -> list[str]:
    """The run's files written on every node (by its kept prelaunch program where open),
    or none started: a node that failed is said with the fix.

    Large files (a notebook's pickled call with the data it captured) that several
    nodes take go by one broadcast (cpuaccel.connectors.broadcast), once the rest made
    the run folder, rather than once per node in each node's request: ``note`` takes
    the line for a node it cut out, which then gets them the usual way. Returns the
    hosts that took them by broadcast."""
    large = _large(files, plan.hosts)
    results = _write(plan, plan.hosts, {n: f for n, f in files.items() if n not in large}, nodes)
    holding = [r.host for r in results if r.ok]  # the hosts that took secret.env, if any
    failed = [r for r in results if not r.ok]
    cast: list[str] = []
    if large and not failed:
        cast = _broadcast(plan, {n: files[n] for n in large}, nodes, note)
        rest = [h for h in plan.hosts if h.name not in cast]
        more = _write(plan, rest, {n: files[n] for n in large}, nodes) if rest else []
        failed = [r for r in more if not r.ok]
    if failed:
        if "secret.env" in files:  # no job starts: take the secrets back off every holder
            forget_secrets(plan, holding, nodes)
        raise UsageError(
            "; ".join(f"{r.host.name}: {r.error}" for r in failed),
            hint="check free disk and permissions at cpuaccel_workdir",
        )
    return cast


def broadcast_note(line: str) -> None:
    """A broadcast's line (a node cut out) on stderr, as sync shows it."""
    ui.stderr().print(f"broadcast: {ui.escape(line)}")


def _write(
    plan: RunPlan, hosts: list[Host], files: JobFiles, nodes: Nodes
) -> list[HostResult[fanout.Answer]]:
    """``files`` written into the run folder on ``hosts`` (made there, 0700): each
    host's result."""
    payload = json.dumps(files).encode()  # the same files everywhere: one srun step in Slurm
    words, what = ["write", plan.run_dir], "writing the run's files"
    return fanout.call_all(hosts, "jobctl", words, payload, what=what, timeout=600.0, **nodes.fan())


def _large(files: JobFiles, hosts: list[Host]) -> frozenset[str]:
    """The files worth one broadcast: each of broadcast.FILE_BYTES or more, no secret,
    adding up to broadcast.MIN_BYTES, for two hosts or more that relays reach."""
    if sum(1 for h in hosts if broadcast.relays(h)) < 2:
        return frozenset()
    large = {
        name
        for name, (_, text) in files.items()
        if name not in SECRET_FILES and len(text) >= broadcast.FILE_BYTES
    }
    total = sum(len(files[name][1]) for name in large)
    return frozenset(large) if total >= broadcast.MIN_BYTES else frozenset()


def _broadcast(
    plan: RunPlan, files: JobFiles, nodes: Nodes, note: Callable[[str], None]
) -> list[str]:
    """``files`` into the run folder of every host relays reach; the hosts that kept
    them all (each checked by sha256 there)."""
    hosts = [h for h in plan.hosts if broadcast.relays(h)]
    with tempfile.TemporaryDirectory(prefix="cpuaccel-cast-") as folder:
        payload = []
        for name, (mode, text) in files.items():
            path = os.path.join(folder, name)
            with open(path, "wb") as f:
                f.write(text.encode())
            os.chmod(path, mode)
            payload.append(broadcast.payload_file(path, name))
        sender = broadcast.Broadcast(
            nodes.pool.get, nodes.connect, hosts, dict.fromkeys([h.name for h in hosts],
            plan.run_dir), payload, note=note,
        )  # fmt: skip
        done = sender.run()
    cast = []
    for name, delivery in done.items():
        if delivery.ok and set(delivery.kept) == set(files):
            cast.append(name)
        elif delivery.error:
            note(f"{name}: the broadcast failed ({delivery.error}): its run files go directly")
    return sorted(cast)


def forget_secrets(plan: RunPlan, hosts: list[Host], nodes: Nodes) -> None:
    words = ["end", plan.run_id, "0", plan.run_dir]
    what = "removing the run's secrets"
    fanout.call_all(hosts, "jobctl", words, what=what, timeout=600.0, **nodes.fan())
