"""Reaching the head node of a recorded run, for ps, logs, fetch, stop and a ``Run``."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cpuaccel.api.target import HostFlags, resolve_target
from cpuaccel.connectors.base import Connector
from cpuaccel.connectors.connect_options import DEFAULT_CONNECT_TIMEOUT
from cpuaccel.connectors.runfiles import HeadFiles
from cpuaccel.errors import EXIT_NODE_FAILED, HostError, UsageError
from cpuaccel.executor import ConnectionPool
from cpuaccel.history.records import RunRecord


class Heads:
    """Connections to the heads of recorded runs, one a host, opened when first used."""

    def __init__(self, inventory_path: str | None, connect_timeout: float, no_hkc: bool) -> None:
        self.inventory_path = inventory_path
        self.connect_timeout = connect_timeout
        self.no_hkc = no_hkc
        self._pools: dict[str, ConnectionPool] = {}
        self._targets: dict[str | None, Any] = {}
        self._lock = threading.Lock()  # ps asks several heads at once
        if inventory_path:  # a bad -i is said at once, even when no head is asked
            self._target(inventory_path)

    def target(self, path: str | None) -> Any:
        """The ``Target`` of the inventory at ``path`` (read once)."""
        with self._lock:
            return self._target(path)

    def _target(self, path: str | None) -> Any:
        if path not in self._targets:
            given = HostFlags(path, timeout=self.connect_timeout, no_host_key_checking=self.no_hkc)
            self._targets[path] = resolve_target(given)
        return self._targets[path]

    def connector(self, run: RunRecord) -> Callable[[], Connector]:
        """How to reach ``run``'s head (connecting on first use); UsageError when no
        inventory names it."""
        with self._lock:
            return self._connector(run)

    def files(self, run: RunRecord) -> HeadFiles:
        """``run``'s folder on its head (a detached run's), read there."""
        conn = self.connector(run)  # UsageError when no inventory names the head
        assert run.head_run_dir is not None
        return HeadFiles(run.head or "the head", run.head_run_dir, conn)

    def _connector(self, run: RunRecord) -> Callable[[], Connector]:
        head = run.head
        if head is None:
            raise UsageError(f"{run.path}/run.json names no head node", hint="is it a run folder?")
        path = self.inventory_path or run.record.get("inventory")
        target = self._target(str(path) if path else None)
        host = target.inventory.hosts.get(head)
        if host is None:
            where = target.inventory.source or "the default inventory (this machine)"
            raise UsageError(
                f"run {run.run_id}'s head {head} is not in {where}",
                hint="give the inventory the run used: -i FILE",
            )
        key = f"{path}:{head}"
        if key not in self._pools:
            self._pools[key] = ConnectionPool(target.connect)
        pool = self._pools[key]
        return lambda: pool.get(host)

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()


def node_failed(exc: HostError) -> HostError:
    """The head could not be reached or failed its task: exit 69, as other verbs do."""
    exc.exit_code = EXIT_NODE_FAILED
    return exc


@dataclass(frozen=True)
class HeadOptions:
    """How a ``Run`` reaches its head: ``-i`` (None: the inventory the run recorded),
    ``-T``, and whether host keys go unchecked (``--no-host-key-checking``)."""

    inventory_path: str | None = None
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    no_host_key_checking: bool = False

    def open(self) -> Heads:
        return Heads(self.inventory_path, self.connect_timeout, self.no_host_key_checking)
