"""The sync receiver's protocol, from the controller: the node program ``tree``
(cpuaccel.node.tree) called in one mode on one destination, ``NodeSession`` (the same
modes as requests to ``treesession``, one interpreter a node for a whole sync), and the
apply request."""

from __future__ import annotations

import contextlib
import json
import queue
import threading
import time
from collections.abc import Sequence
from typing import Any, BinaryIO

from cpuaccel import node
from cpuaccel.connectors import programs
from cpuaccel.connectors.base import CommandResult, CommandTimeout, Connector, Process
from cpuaccel.errors import HostError
from cpuaccel.sync.ignore import PRUNE_NAMES
from cpuaccel.sync.location import DestinationRefused
from cpuaccel.sync.manifest import SourceManifest

REMOTE_TIMEOUT = 3600.0


def call_remote(
    conn: Connector,
    mode: str,
    dest: str,
    payload: bytes | BinaryIO = b"",
    expect: str | None = None,
) -> dict[str, Any]:
    """Run the node program in MODE on DEST; ``payload`` follows it on stdin.

    With ``expect`` (a manifest hash), a scan leaves its entries out (None) when the
    node's tree has exactly that hash: an unchanged node answers in a few bytes. Raises
    DestinationRefused when the node will not sync into DEST as it resolves there.
    """
    value = programs.call(
        conn, "tree", words(mode, dest, conn.host.workdir, expect), payload,
        what=f"syncing to {dest}", timeout=REMOTE_TIMEOUT,
    )  # fmt: skip
    return checked(conn.host.name, value)


class NodeSession:
    """``treesession`` on one node, started by the first request (``look``) and kept
    until ``close``: the change is sent on the channel that looked, once every node has
    accepted its destination. Every answer is awaited at most REMOTE_TIMEOUT."""

    def __init__(self, conn: Connector, dest: str) -> None:
        self.conn = conn
        self.dest = dest
        self._process: Process | None = None
        self._closed = False
        self._answers: queue.Queue[str | None] = queue.Queue()
        self._stderr: list[str] = []
        self._ended_output = threading.Event()  # both streams closed: it is exiting

    def request(
        self, mode: str, payload: bytes | BinaryIO = b"", expect: str | None = None
    ) -> dict[str, Any]:
        """MODE's answer on this node (as ``call_remote``'s); DestinationRefused, or
        HostError when the program or the connection ended without one."""
        if self._process is None:
            self._start()
        assert self._process is not None
        length = len(payload) if isinstance(payload, bytes) else payload.seek(0, 2)
        line = {"mode": mode, "expect": expect, "length": length}
        try:
            self._send(json.dumps(line).encode() + b"\n", payload)
        except OSError:  # the program (or the connection) is gone: say why
            raise self._ended() from None
        try:
            answer = self._answers.get(timeout=REMOTE_TIMEOUT)
        except queue.Empty:
            raise CommandTimeout(
                self.conn.host.name, f"syncing to {self.dest}: no answer in {REMOTE_TIMEOUT:g} s"
            ) from None
        if answer is None:  # the program ended: say why, as a one-shot call would
            raise self._ended()
        result = CommandResult(self.conn.host.name, "treesession", 0, answer, "", 0.0)
        value = programs.answer(self.conn.host.name, self._python, result, self._what)
        return checked(self.conn.host.name, value)

    def _send(self, head: bytes, payload: bytes | BinaryIO) -> None:
        assert self._process is not None
        self._process.send(head)
        if isinstance(payload, bytes):
            self._process.send(payload)
            return
        payload.seek(0)
        while chunk := payload.read(1 << 20):
            self._process.send(chunk)

    @property
    def _python(self) -> str:
        return self.conn.host.python

    @property
    def _what(self) -> str:
        return f"syncing to {self.dest}"

    def _start(self) -> None:
        program = node.program("treesession")
        request = words("", self.dest, self.conn.host.workdir)[1:]  # DEST --workdir=W PRUNE...
        self._process = self.conn.start(programs.argv(self._python, "treesession", request))
        self._process.send(program)
        threading.Thread(target=self._read, args=(self._process,), daemon=True).start()

    def _read(self, process: Process) -> None:
        for stream, line in process.lines():
            if stream == "out":
                self._answers.put(line)
            elif len(self._stderr) < 200:
                self._stderr.append(line)
        self._answers.put(None)
        self._ended_output.set()

    def _ended(self) -> Exception:
        assert self._process is not None
        try:
            code = self._process.wait(timeout=30)
        except CommandTimeout as exc:
            return exc
        stderr = "\n".join(self._stderr)
        failure = self.conn.failure(code, stderr)
        if failure is not None:
            return failure
        result = CommandResult(self.conn.host.name, "treesession", code or 1, "", stderr, 0.0)
        try:
            programs.answer(self.conn.host.name, self._python, result, self._what)
        except HostError as exc:  # the error that says why
            return exc
        raise AssertionError("unreachable: a failed result always raises")

    def close(self) -> None:
        """End the program (EOF on its stdin); ``wait`` for it afterwards."""
        if self._process is not None and not self._closed:
            self._closed = True
            self._process.close()

    def wait(self, deadline: float) -> None:
        """Wait for the program's end: first for its output to close (an event, where
        the process's own wait with a timeout polls and sleeps up to 50 ms a node)."""
        if self._process is not None:
            self._ended_output.wait(max(0.1, deadline - time.monotonic()))
            # its answers are in: an unclean end changes nothing
            with contextlib.suppress(HostError):
                self._process.wait(timeout=max(0.1, deadline - time.monotonic()))


def words(mode: str, dest: str, workdir: str, expect: str | None = None) -> list[str]:
    """The request words of the ``tree`` program (also sent in one srun step to every
    node of an allocation: launch/preflight.py)."""
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
