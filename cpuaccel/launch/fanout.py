"""A node program with the same request on every node of a job: over each node's
connection (in parallel, bounded by --forks), or, for the nodes of one Slurm allocation,
in ONE srun step over them all (connectors/srun.call_everywhere), which spares Slurm a
step a node and the job a round of srun start-ups. The run's files and the sweep go so.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from cpuaccel.connectors import programs, srun
from cpuaccel.connectors.base import Connector, Unreachable
from cpuaccel.errors import CpuaccelError, HostError
from cpuaccel.executor import ConnectionPool, HostResult, Status, run_on_hosts
from cpuaccel.inventory.host import Host

Answer = dict[str, Any]


def in_one_step(hosts: Sequence[Host]) -> bool:
    """True when every host is a node of the same Slurm allocation."""
    jobs = {h.slurm_job for h in hosts}
    return bool(hosts) and None not in jobs and len(jobs) == 1


def failed(host: Host, exc: CpuaccelError, seconds: float) -> HostResult[Any]:
    """The result of a host whose answer is an error, as the executor makes them."""
    status = Status.UNREACHABLE if isinstance(exc, Unreachable) else Status.FAILED
    reason = exc.reason if isinstance(exc, HostError) else exc.message
    return HostResult(host, status, None, reason, exc.hint, seconds)


def call_all(
    hosts: Sequence[Host],
    program: str,
    words: Sequence[str],
    payload: bytes = b"",
    *,
    what: str,
    timeout: float,
    forks: int,
    pool: ConnectionPool,
) -> list[HostResult[Answer]]:
    """``program`` with ``words`` (and ``payload`` on stdin) on every host; one result
    a host, in the order given."""
    if not in_one_step(hosts):

        def one(conn: Connector) -> Answer:
            return programs.call(conn, program, words, payload, what=what, timeout=timeout)

        return run_on_hosts(list(hosts), one, forks=forks, pool=pool)
    started = time.monotonic()
    answers = srun.call_everywhere(
        hosts, program, lambda h: list(words), payload, what=what, timeout=timeout
    )
    seconds = time.monotonic() - started
    results: list[HostResult[Answer]] = []
    for host in hosts:
        answer = answers[host.name]
        if isinstance(answer, HostError):
            results.append(failed(host, answer, seconds))
        else:
            results.append(HostResult(host, Status.OK, answer, seconds=seconds))
    return results
