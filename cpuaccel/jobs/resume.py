"""The checkpoint a restarted foreground job resumes from, found from the controller.

The judgement (checkpoints.jsonl's lines checked, the newest checkpoint every node holds
whole) is cpuaccel/node/checkpoints.py's, which a detached run's supervisor uses on the
head too; here each node is read through its connection (the ``jobs`` program's
``list`` and ``read``, bounded) and what was ignored is printed.
"""

from __future__ import annotations

from cpuaccel import ui
from cpuaccel.connectors.base import Connector
from cpuaccel.executor import ConnectionPool, run_on_hosts
from cpuaccel.inventory.host import Host
from cpuaccel.node.checkpoints import (
    RECORDS,
    TAIL,
    Found,
    HostCheckpoints,
    Record,
    choose,
    host_of,
    parse_records,
)
from cpuaccel.runs import node_files as runfiles

__all__ = ["RECORDS", "TAIL", "Found", "HostCheckpoints", "Record", "choose", "parse_records"]


def read_host(conn: Connector, run_dir: str, timeout: float) -> HostCheckpoints:
    """One host's listing and the tail of its checkpoints.jsonl (two bounded calls)."""
    listing = runfiles.list_files(conn, run_dir, timeout=timeout)
    files = None if listing is None else [[f.name, f.size, f.mtime] for f in listing]
    size = next((f.size for f in listing or () if f.name == RECORDS), 0)
    tail = None
    if size:
        data, _, _ = runfiles.read(conn, run_dir, RECORDS, max(0, size - TAIL), TAIL, timeout)
        tail = (data or b"").decode("utf-8", errors="replace")
    return host_of(conn.host.name, run_dir, files, tail)


def find_complete(pool: ConnectionPool, hosts: list[Host], run_dir: str, timeout: float) -> Found:
    """:func:`choose` over what every host has now; a host that cannot be read has none."""
    results = run_on_hosts(
        hosts, lambda conn: read_host(conn, run_dir, timeout), forks=max(1, len(hosts)), pool=pool
    )
    told = []
    for result in results:
        if result.ok and result.value is not None:
            told.append(result.value)
        else:
            told.append(HostCheckpoints(result.host.name, reasons=[f"not read: {result.error}"]))
    return choose(told, run_dir)


def newest_complete(
    pool: ConnectionPool, hosts: list[Host], run_dir: str, timeout: float
) -> str | None:
    """The absolute path (on the nodes) of the newest checkpoint that every host in
    ``hosts`` holds whole, or None; what was ignored or incomplete is printed (stderr)."""
    found = find_complete(pool, hosts, run_dir, timeout)
    for host, why in found.reasons:
        ui.detail(0, host, why)
    return found.path
