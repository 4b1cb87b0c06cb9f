"""check keeps only the head's connection open once a node's facts are in: the pool's
connections (each a paramiko transport thread and a socket) stay bounded by --forks
plus the head, not one per node of the inventory."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest

from cpuaccel.cli import check
from cpuaccel.connectors.base import Connector
from cpuaccel.connectors.connect_options import ConnectOptions
from cpuaccel.executor import ConnectionPool, Status
from cpuaccel.inventory.host import Host

LOCAL = {"ansible_connection": "local"}


def test_only_the_head_stays_connected_and_open_at_once_is_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hosts = [Host(f"h{i}", LOCAL) for i in range(6)]
    lock = threading.Lock()
    peak = [0]
    pool = ConnectionPool(ConnectOptions())

    def fake_gather(conn: Connector, resolve: Any = ()) -> dict[str, Any]:
        with lock:
            peak[0] = max(peak[0], len(pool.open_hosts()))
        return {"hostname": conn.host.name}

    monkeypatch.setattr(check, "gather", fake_gather)
    target = SimpleNamespace(hosts=hosts, forks=2, connect=ConnectOptions())
    with pool:
        results = check._gather(target, None, pool, keep="h3")  # type: ignore[arg-type]
        assert [r.status for r in results] == [Status.OK] * 6
        assert [r.value for r in results] == [{"hostname": h.name} for h in hosts]
        assert pool.open_hosts() == ["h3"]
    assert peak[0] <= 2 + 1  # forks at once, and the head kept


def test_without_a_head_to_keep_every_connection_stays(monkeypatch: pytest.MonkeyPatch) -> None:
    hosts = [Host(f"h{i}", LOCAL) for i in range(3)]
    monkeypatch.setattr(check, "gather", lambda conn, resolve=(): {})
    target = SimpleNamespace(hosts=hosts, forks=3, connect=ConnectOptions())
    with ConnectionPool(ConnectOptions()) as pool:
        check._gather(target, None, pool)  # type: ignore[arg-type]
        assert pool.open_hosts() == ["h0", "h1", "h2"]
