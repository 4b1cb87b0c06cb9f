"""A node program with the same request on every node of a job: over each node's
connection (in parallel, bounded by --forks), or, for the nodes of one Slurm allocation,
in ONE srun step over them all (connectors/srun.call_everywhere), which spares Slurm a
step a node and the job a round of srun start-ups. The run's files and the sweep go so:
to the preflight's programs, where they were kept open (``Kept``), on their channels.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from cpuaccel.connectors import programs, srun
from cpuaccel.connectors.base import Connector
from cpuaccel.errors import CpuaccelError, HostError, Unreachable
from cpuaccel.executor import ConnectionPool, HostResult, Status, run_on_hosts
from cpuaccel.inventory.host import Host

Answer = dict[str, Any]
# Every wait after the kill ends within this: the launcher's last output, its exit
# status, and each node's sweep (its own 2 s grace plus a node program's start, with room).
# A node that does not answer in time is reported, not waited for.
TEARDOWN = 20.0


def in_one_step(hosts: Sequence[Host]) -> bool:
    """True when every host is a node of the same Slurm allocation."""
    jobs = {h.slurm_job for h in hosts}
    return bool(hosts) and None not in jobs and len(jobs) == 1


def failed(host: Host, exc: CpuaccelError, seconds: float) -> HostResult[Any]:
    """The result of a host whose answer is an error, as the executor makes them."""
    status = Status.UNREACHABLE if isinstance(exc, Unreachable) else Status.FAILED
    reason = exc.reason if isinstance(exc, HostError) else exc.message
    return HostResult(host, status, None, reason, exc.hint, seconds)


def call_all(  # noqa: PLR0913
    hosts: Sequence[Host],
    program: str,
    words: Sequence[str],
    payload: bytes = b"",
    *,
    what: str,
    timeout: float,
    forks: int,
    pool: ConnectionPool,
    kept: Kept | None = None,
) -> list[HostResult[Answer]]:
    """``program`` with ``words`` (and ``payload`` on stdin) on every host; one result
    a host, in the order given. A ``jobctl`` request goes to a host's program in ``kept``
    while it lives; one that is gone gives way to a fresh call."""
    if not in_one_step(hosts):

        def one(conn: Connector) -> Answer:
            if kept is not None and program == "jobctl":
                open_ = kept.get(conn.host.name)
                return programs.call_kept(open_, conn, words, payload, what=what, timeout=timeout)
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


class Kept:
    """The preflight's programs kept open on the nodes (connectors/programs.Kept), by
    host name, for the job's later requests (its files, its sweep): closed (EOF, which
    ends them having written nothing) when no job is to start and when the run ends."""

    def __init__(self) -> None:
        self._open: dict[str, programs.Kept] = {}
        self._lock = threading.Lock()

    def add(self, name: str, program: programs.Kept) -> None:
        with self._lock:
            old, self._open[name] = self._open.get(name), program
        if old is not None:
            old.close()

    def get(self, name: str) -> programs.Kept | None:
        with self._lock:
            program = self._open.get(name)
        return program if program is not None and program.alive else None

    def close(self) -> None:
        with self._lock:
            gone, self._open = list(self._open.values()), {}
        for program in gone:
            program.close()


def sweep_hosts(
    hosts: list[Host],
    run_id: str,
    run_dir: str,
    pool: ConnectionPool,
    forks: int,
    lost: list[str],
    *,
    timeout: float,
    kept: Kept | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """End the job's processes on every host not ``lost`` (a host found unreachable is
    added to it): (node -> what was ended, node -> what stays or why it was not checked),
    each node's answer awaited ``timeout`` s at most. Also `cpuaccel stop`'s sweep
    (history/teardown.py), which has no ``kept`` programs."""

    # With the run folder: the node removes secret.env once the job is over.
    words = ["end", run_id, "2", run_dir]
    reachable = [h for h in hosts if h.name not in lost]
    results: list[HostResult[dict[str, Any]]] = call_all(
        reachable, "jobctl", words, what="ending the job's processes", timeout=timeout,
        forks=forks, pool=pool, kept=kept,
    )  # fmt: skip
    swept: dict[str, Any] = {}
    left: dict[str, Any] = {name: "not checked: the connection to it was lost" for name in lost}
    for r in results:
        if r.value is None:
            if r.status is Status.UNREACHABLE and r.host.name not in lost:
                lost.append(r.host.name)
            left[r.host.name] = f"could not check: {r.error}"
            continue
        ended = r.value["terminated"] + r.value["killed"]
        if ended:
            swept[r.host.name] = ended
        if r.value["left"]:
            left[r.host.name] = r.value["left"]
    return swept, left
