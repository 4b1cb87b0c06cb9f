"""Nodes that see the same destination folder (a shared filesystem): one writes, the
others wait for it and then verify."""

from __future__ import annotations

import threading


class SharedDestinations:
    """Elects one writer per filesystem id; the others wait for it and then verify."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._writers: dict[str, tuple[str, threading.Event]] = {}

    def claim(self, fsid: str, host: str) -> tuple[str, threading.Event] | None:
        """None when host is the writer, else (writer, event set when it is done)."""
        with self._lock:
            if fsid not in self._writers:
                self._writers[fsid] = (host, threading.Event())
                return None
            return self._writers[fsid]

    def done(self, fsid: str | None) -> None:
        if fsid is not None:
            with self._lock:
                writer = self._writers.get(fsid)
            if writer is not None:
                writer[1].set()
