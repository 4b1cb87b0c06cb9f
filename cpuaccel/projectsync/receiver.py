"""The sync receiver's protocol, from the controller: ``NodeSession`` (the ``tree``
program's modes, cpuaccel.node.tree, as requests to ``treesession``: one interpreter a
node for a whole sync), the request words (also run's preflight look's), and the apply
request."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, BinaryIO

from cpuaccel.connectors import programs
from cpuaccel.connectors.base import Connector
from cpuaccel.projectsync.ignore import PRUNE_NAMES
from cpuaccel.projectsync.location import DestinationRefused
from cpuaccel.projectsync.manifest import SourceManifest

REMOTE_TIMEOUT = 3600.0


class NodeSession:
    """``treesession`` on one node (a ``programs.Kept``), started by the first request
    (``look``) and kept until ``close`` or a ``last`` request: the change is sent on the
    channel that looked, once every node has accepted its destination. Every answer is
    awaited at most REMOTE_TIMEOUT."""

    def __init__(self, conn: Connector, dest: str) -> None:
        self.conn = conn
        self.dest = dest
        self._kept: programs.Kept | None = None
        self._ended: list[programs.Kept] = []  # programs whose input ended (``last``)

    def request(
        self,
        mode: str,
        payload: bytes | BinaryIO = b"",
        expect: str | None = None,
        last: bool = False,
    ) -> dict[str, Any]:
        """MODE's answer on this node (``tree.answer``'s); DestinationRefused, or
        HostError when the program or the connection ended without one. ``last``: the
        program's input ends with this request, so that it ends right after answering,
        while the answer travels back, rather than when ``close`` comes; a request after
        it (the long way, when a one-trip change did not apply) starts a new program."""
        what = f"syncing to {self.dest}"
        kept = self.start()
        length = len(payload) if isinstance(payload, bytes) else payload.seek(0, 2)
        line = json.dumps({"mode": mode, "expect": expect, "length": length}).encode() + b"\n"
        if isinstance(payload, bytes):
            kept.send(line + payload)  # a gone one says why it ended
        else:
            kept.send(line)
            kept.send(payload)
        if last:
            kept.end_input()
            self._ended.append(kept)
            self._kept = None  # a request after all (the long way) gets a program of its own
        return checked(self.conn.host.name, kept.answer(what, REMOTE_TIMEOUT))

    def start(self) -> programs.Kept:
        """The program, started if not yet: it waits for its first request (a bounded
        wait, node/treesession.py), and an EOF ends it having changed nothing."""
        if self._kept is None:
            request = words("", self.dest, self.conn.host.workdir)[1:]  # DEST --workdir=W ...
            self._kept = programs.Kept(self.conn, "treesession", request)
        return self._kept

    def close(self) -> None:
        """End the programs (EOF on their stdin); ``wait`` for them afterwards."""
        for kept in self._programs():
            if kept.alive:
                kept.close()

    def wait(self, deadline: float) -> None:
        """Wait for the programs' end (until the monotonic ``deadline``)."""
        for kept in self._programs():
            kept.wait(deadline)

    def _programs(self) -> list[programs.Kept]:
        return [*self._ended, *([self._kept] if self._kept is not None else [])]


def words(mode: str, dest: str, workdir: str, expect: str | None = None) -> list[str]:
    """The request words of the ``tree`` program (also sent in one srun step to every
    node of an allocation: jobs/preflight.py)."""
    found = [mode, dest, *([f"--expect={expect}"] if expect else [])]
    found.append(f"--workdir={workdir}")  # the node resolves it, to protect it
    return [*found, *PRUNE_NAMES]


def checked(host: str, value: dict[str, Any]) -> dict[str, Any]:
    """The program's answer, refused destinations raised, entries as tuples."""
    if value.get("refused"):
        raise DestinationRefused(host, str(value["dest"]), str(value["refused"]))
    _tupled(value)
    if "scan" in value:  # apply's answer when the node's tree was not the expected one
        _tupled(value["scan"])
    return value


def _tupled(report: dict[str, Any]) -> None:
    """Entries as tuples, as the source's are (JSON brings lists)."""
    if report.get("entries") is not None:
        report["entries"] = {rel: tuple(entry) for rel, entry in report["entries"].items()}


def request(
    source: SourceManifest, deleted: Sequence[str], *, tar: bool, trusted: Sequence[str] = ()
) -> bytes:
    """The apply request: the manifest to verify against, what to delete, and which
    entries rsync delivered (verified by rsync's own checksums, see cpuaccel.node.tree.apply)."""
    header = {
        "manifest": source.entries,
        "delete": list(deleted),
        "tar": tar,
        "trusted": list(trusted),
    }
    return json.dumps(header).encode() + b"\n"
