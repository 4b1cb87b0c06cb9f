"""Keeping a detached run's controller folder live while its page is looked at.

A detached run whose head run folder is elsewhere (``RunRecord.local`` false) writes its
logs, metrics and status.json on the head; the page reads the controller's copy. While
a page polls such a run (``Watcher.touch``), a thread of its own copies what changed
(runs/homecoming.Homecoming, the head's logs and status included) at most once every
results.INTERVAL s; when nobody has looked for LOOK_WINDOW s it stops; when the copied
status says the run ended, one last pass brings the rest and it stops for good.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from cpuaccel.connectors.base import Connector
from cpuaccel.errors import CpuaccelError
from cpuaccel.history.records import ENDED, RunRecord, load
from cpuaccel.jobs import homecoming as results

LOOK_WINDOW = 15.0  # seconds after the last poll that a run is still "looked at"
ConnectorFor = Callable[[RunRecord], Callable[[], Connector]]


def wanted(run: RunRecord) -> bool:
    """Does the controller's copy of ``run`` need bringing from its head?"""
    return run.detached and not run.local and run.head_run_dir is not None


@dataclass
class _Watch:
    run: RunRecord
    looked: float  # time.monotonic() of the last touch
    thread: threading.Thread | None = None
    error: str | None = None  # the last pass's failure, shown on the page
    fetched: float | None = None  # time.time() of the last pass that worked
    done: bool = False  # the final pass after the run ended was made


class Watcher:
    def __init__(self, connector_for: ConnectorFor, interval: float = results.INTERVAL) -> None:
        self.connector_for = connector_for
        self.interval = interval
        self._watches: dict[str, _Watch] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()

    def touch(self, run: RunRecord) -> dict[str, object] | None:
        """``run`` is looked at: keep its folder live. Returns what the page may show
        about the copy (its last error, when it last worked); None for a local run."""
        if not wanted(run):
            return None
        with self._lock:
            watch = self._watches.get(run.run_id)
            if watch is None:
                watch = self._watches[run.run_id] = _Watch(run, time.monotonic())
            watch.looked = time.monotonic()
            alive = watch.thread is not None and watch.thread.is_alive()
            if not alive and not watch.done and not self._closed.is_set():
                watch.thread = threading.Thread(
                    target=self._follow, args=(watch,), name=f"home-{run.run_id}", daemon=True
                )
                watch.thread.start()
            return {"error": watch.error, "fetched": watch.fetched}

    def _follow(self, watch: _Watch) -> None:
        try:
            conn = self.connector_for(watch.run)
            home = results.Homecoming(
                conn, str(watch.run.head_run_dir), watch.run.path, supervised_there=True
            )
        except CpuaccelError as exc:
            watch.error = str(exc)
            return
        while not self._closed.is_set():
            ended = load(watch.run.path).state() in ENDED
            self._pass(watch, home)
            if ended:  # this pass came after the end was seen: the last one
                watch.done = watch.error is None
                return
            if self._closed.wait(self.interval):
                return
            if time.monotonic() - watch.looked > LOOK_WINDOW:
                return  # nobody looks: the next touch starts again

    @staticmethod
    def _pass(watch: _Watch, home: results.Homecoming) -> None:
        try:
            home.once()
        except (CpuaccelError, OSError) as exc:
            watch.error = str(exc)
        else:
            watch.error, watch.fetched = None, time.time()

    def close(self, wait: float = 0.0) -> None:
        """No more passes; waits up to ``wait`` s for the ones under way."""
        self._closed.set()
        with self._lock:
            threads = [w.thread for w in self._watches.values() if w.thread is not None]
        deadline = time.monotonic() + wait
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
