"""What the chosen nodes offer ``cpuaccel tune``: their cores (the facts probe, as run's
preflight reads them) and the allocators every one of them has (the paths rank.sh would
preload, from ``jobs/plan.allocator_candidates``, looked for on each node)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from cpuaccel.config.settings import DEFAULT, LaunchSettings, Setting
from cpuaccel.connectors.base import Connector
from cpuaccel.errors import EXIT_NODE_FAILED, CpuaccelError
from cpuaccel.executor import ConnectionPool, run_on_hosts
from cpuaccel.facts.gather import Facts, gather
from cpuaccel.jobs.plan import (
    ALLOCATORS,
    Script,
    allocator_candidates,
    build_plan,
    nodes_per_machine,
)
from cpuaccel.tuning.grid import Trial

# Prints the arguments that exist (a path a line): one round trip for every candidate.
EXISTING = 'for p in "$@"; do if [ -e "$p" ]; then printf "%s\\n" "$p"; fi; done'


class NodesFailed(CpuaccelError):
    exit_code = EXIT_NODE_FAILED


@dataclass(frozen=True)
class Survey:
    cores: int  # physical cores a node, shared out among nodes that are one machine
    sockets: int
    allocators: list[str]  # those every chosen node has


def _candidates(settings: LaunchSettings, script: Script) -> dict[str, list[str]]:
    found = {}
    for name in ALLOCATORS:
        chosen = dataclasses.replace(settings, allocator=Setting("allocator", name, DEFAULT))
        found[name] = allocator_candidates(build_plan(chosen, script))
    return found


def survey(settings: LaunchSettings, script: Script, pool: ConnectionPool, forks: int) -> Survey:
    """Facts and allocators of every chosen node; a node that does not answer ends the
    tune before any trial (each trial would fail on it the same way)."""
    candidates = _candidates(settings, script)
    paths = sorted({p for group in candidates.values() for p in group})

    def probe(conn: Connector) -> tuple[Facts, set[str]]:
        facts = gather(conn)
        argv = ["sh", "-c", EXISTING, "sh", *paths]
        found = conn.run(argv, timeout=60.0)
        return facts, set(found.stdout.split("\n")) if found.ok else set()

    results = run_on_hosts(list(settings.chosen), probe, forks=forks, pool=pool)
    failed = [r for r in results if not r.ok or r.value is None]
    if failed:
        raise NodesFailed(
            "; ".join(f"{r.host.name}: {r.error}" for r in failed),
            hint="cpuaccel check lists what each node lacks",
        )
    facts = {r.host.name: r.value[0] for r in results if r.value}
    sharing = nodes_per_machine(settings.chosen, facts)
    cores = min(int(f["cpu"]["physical_cores"]) for f in facts.values()) // sharing
    head = facts[settings.chosen[0].name]
    present = [
        name
        for name, group in candidates.items()
        if all(set(group) & r.value[1] for r in results if r.value)
    ]
    return Survey(max(1, cores), int(head["cpu"]["sockets"]), present)


def trial_settings(settings: LaunchSettings, trial: Trial, where: str) -> LaunchSettings:
    """The run's settings with the trial's ranks, threads and allocator, as flags would
    set them; no restart (a failed trial is a row, not a retry)."""
    env = {**settings.env.value, "OMP_NUM_THREADS": str(trial.threads)}
    # The trial's threads are every host's, over a host's own cpuaccel_env too.
    own = {
        host: {k: v for k, v in values.items() if k not in env}
        for host, values in settings.host_env.value.items()
    }
    return dataclasses.replace(
        settings,
        ppn=Setting("ppn", trial.ppn, "flag", where),
        env=Setting("env", env, "flag", where),
        host_env=dataclasses.replace(settings.host_env, value={h: v for h, v in own.items() if v}),
        allocator=Setting("allocator", trial.allocator, "flag", where),
        max_restarts=Setting("max_restarts", 0, DEFAULT),
        min_nodes=Setting("min_nodes", None, DEFAULT),  # every trial on the same nodes
    )
