"""Run cpuaccel's node programs (cpuaccel.node) on a host: one protocol, one error
translation.

The node needs nothing but a Python: the program's source travels on stdin, followed by
its payload, as ``python -c BOOT LENGTH WORD...``; BOOT reads LENGTH bytes of stdin as
the program and runs it, leaving the rest of stdin to the program. The words after
LENGTH are the request (the operation and its arguments); the answer is one JSON object
on stdout. The playbook agent boots the same way and then stays, one JSON line each way
per request (cpuaccel.playbook.session).
"""

from __future__ import annotations

import contextlib
import json
import queue
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any, BinaryIO

from cpuaccel import node
from cpuaccel.connectors.base import CommandResult, Connector
from cpuaccel.errors import CommandTimeout, CpuaccelError, HostError
from cpuaccel.jsonsource import Refused, loads

BOOT = "import sys;exec(compile(sys.stdin.buffer.read(int(sys.argv[1])),'cpuaccel','exec'))"
PYTHON_HINT = "set cpuaccel_python to the node's interpreter, or run cpuaccel provision"


class _Chain:
    """A readable stream: some bytes, then a file."""

    def __init__(self, head: bytes, tail: BinaryIO) -> None:
        self._head = head
        self._tail = tail

    def read(self, size: int = -1) -> bytes:
        if size < 0:
            head, self._head = self._head, b""
            return head + self._tail.read()
        if self._head:
            chunk, self._head = self._head[:size], self._head[size:]
            return chunk
        return self._tail.read(size)


# Programs run without the ``site`` module (``python -S``): the sync receiver and the
# broadcast relay, started on every node of every sync, and the network probe need
# nothing but the standard library, while site's processing of site-packages (its .pth
# files and what they import, sitecustomize) would be paid by every start. Not the
# others: the fact probe reads site-packages' dist-info, and the agent's modules run pip.
NO_SITE = frozenset({"treesession", "relay", "netprobe"})


def argv(python: str, program: str, words: Sequence[str] = ()) -> list[str]:
    """The command that boots ``program`` (its source to be sent first on stdin)."""
    flags = ["-S"] if program in NO_SITE else []
    return [python, *flags, "-c", BOOT, str(len(node.program(program))), *words]


def call(
    conn: Connector,
    program: str,
    words: Sequence[str],
    payload: bytes | BinaryIO = b"",
    *,
    what: str,
    timeout: float = 600.0,
    python: str | None = None,
) -> dict[str, Any]:
    """Run node program ``program`` (a name of cpuaccel.node.PROGRAMS) with the request
    ``words`` on the host; return its answer.

    ``what`` names the operation in error messages ("syncing to /x", "the fact probe");
    ``python`` is the interpreter to use, by default the host's ``cpuaccel_python``.
    """
    python = python or conn.host.python
    source = node.program(program)
    stdin: bytes | BinaryIO
    stdin = source + payload if isinstance(payload, bytes) else _Chain(source, payload)  # type: ignore[assignment]
    result = conn.run(argv(python, program, words), stdin=stdin, timeout=timeout)
    return answer(conn.host.name, python, result, what)


def answer(host: str, python: str, result: CommandResult, what: str) -> dict[str, Any]:
    """A node program's answer, or the HostError that says why there is none."""
    last = (result.stderr.strip().splitlines() or ["no message"])[-1]
    if result.exit_code in (126, 127):  # the shell's "not executable" / "not found"
        raise interpreter_error(host, python, last)
    if not result.ok:
        old = "SyntaxError" in result.stderr  # the node's Python is older than 3.8
        raise HostError(
            host,
            f"{what} failed on the node (exit code {result.exit_code}): {last}",
            hint=f"check that {python} is Python 3.8 or newer" if old else None,
        )
    try:
        value = loads(result.stdout)
    except Refused as exc:  # a text json would read, nested too deep: not ours
        raise HostError(
            host,
            f"{what}: the node program's answer was refused: {exc}",
            hint="check the node: cpuaccel's node programs never answer so",
        ) from None
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise HostError(
            host,
            f"{what}: the node program's answer was not understood "
            f"(first bytes: {result.stdout[:80]!r})",
            hint="a login script on the node may print text; make it quiet for "
            "non-interactive shells",
        )
    return value


def interpreter_error(host: str, python: str, detail: str, hint: str = PYTHON_HINT) -> HostError:
    return HostError(
        host, f"the interpreter {python!r} cannot be run on the node: {detail}", hint=hint
    )


class KeptGone(HostError):
    """A kept program that is no more (its input closed, or it ended): a fresh ``call``
    may still reach the node, unlike after a refusal or a timeout."""


class Kept:
    """A node program that stays after its first answer for more requests on its
    channel, an answer a JSON line: the one home of that channel for every program
    kept so (the ``prelaunch`` program's ``--keep``, which then answers ``jobctl``
    requests; the sync's ``treesession``). A request costs a message, not an sshd
    session and an interpreter start. Every wait for an answer is bounded; one that
    fails leaves the program closed (``alive``)."""

    def __init__(
        self,
        conn: Connector,
        program: str,
        words: Sequence[str],
        python: str | None = None,
        heartbeat: float | None = None,
    ) -> None:
        self.conn = conn
        self.host = conn.host.name
        self.python = python or conn.host.python  # another: a playbook's module interpreter
        self._process = conn.start(argv(self.python, program, words))
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._stderr: deque[str] = deque(maxlen=20)
        self._output_closed = threading.Event()  # both streams ended: it is exiting
        self._asking = threading.Lock()  # one request at a time (the results, the sweep)
        self._sending = threading.Lock()  # one message at a time: a request, a heartbeat
        self._closed = threading.Event()
        self.alive = True
        threading.Thread(target=self._read, name=f"kept-{self.host}", daemon=True).start()
        self.send(node.program(program))
        if heartbeat:
            threading.Thread(
                target=self._beat, args=(heartbeat,), name=f"beat-{self.host}", daemon=True
            ).start()

    def _beat(self, every: float) -> None:
        """An empty line every ``every`` s while the program is kept: the program's sign
        that this controller's session lives (node/prelaunch.serve ends the run's
        processes when they stop coming, and EOF never came)."""
        while not self._closed.wait(every):
            if not self._sending.acquire(timeout=every):
                continue  # a request being sent says as much
            try:
                if self.alive:
                    self._process.send(b"\n")
            except (OSError, ValueError, CpuaccelError):
                return  # the channel is gone: the requests' own errors say why
            finally:
                self._sending.release()

    def _read(self) -> None:
        try:
            for stream, line in self._process.lines():
                if stream == "out":
                    self._queue.put(line)
                else:
                    self._stderr.append(line)
        except Exception:  # a dead channel is an ended program
            pass
        self._queue.put(None)
        self._output_closed.set()

    def send(self, data: bytes | BinaryIO) -> None:
        """Bytes, or a whole file from its start in chunks, to the program's stdin; when
        it cannot take them, the error behind its end (``why_ended``)."""
        try:
            if isinstance(data, bytes):
                self._process.send(data)
                return
            data.seek(0)
            while chunk := data.read(1 << 20):
                self._process.send(chunk)
        except (OSError, ValueError):  # it ended, or its connection did: say which
            self.close()
            raise self.why_ended("sending to the node program") from None

    def answer(self, what: str, timeout: float) -> dict[str, Any]:
        """The next answer line, within ``timeout`` s; else the HostError that says why."""
        try:
            return self._next(what, timeout)
        except HostError:
            self.close()
            raise

    def _next(self, what: str, timeout: float) -> dict[str, Any]:
        try:
            line = self._queue.get(timeout=timeout)
        except queue.Empty:
            raise CommandTimeout(self.host, f"{what}: no answer within {timeout:g} s") from None
        if line is None:  # ended before it answered: its status and stderr say why
            raise self.why_ended(what)
        value = answer(self.host, self.python, CommandResult(self.host, "", 0, line, "", 0), what)
        if "error" in value and len(value) == 1:  # a later request's refusal
            raise HostError(self.host, f"{what} failed on the node: {value['error']}")
        return value

    def why_ended(self, what: str) -> HostError:
        """The error behind the program's end: the connection's own (ssh's words: the
        node is unreachable, its key refused), else a KeptGone with its exit status and
        last stderr line, as a one-shot ``call`` would say it."""
        try:
            code = self._process.wait(5.0)
        except HostError as exc:  # no status: the connection's error says why
            return exc
        except CpuaccelError as exc:
            return KeptGone(self.host, str(exc))
        stderr = "\n".join(self._stderr)
        failure = self.conn.failure(code, stderr)
        if failure is not None:
            return failure
        ended = CommandResult(self.host, "", code or 1, "", stderr, 0.0)
        try:
            answer(self.host, self.python, ended, what)  # raises for a failed status
        except HostError as exc:
            return KeptGone(self.host, exc.reason, hint=exc.hint)
        return KeptGone(self.host, f"{what}: the node program ended without an answer")

    def request(
        self, words: Sequence[str], payload: bytes, *, what: str, timeout: float
    ) -> dict[str, Any]:
        """The answer to ``words`` (with ``payload``), as ``call`` on the ``jobctl``
        program would give it (cpuaccel.node.prelaunch.serve)."""
        message = {"words": list(words), "payload": payload.decode()}
        if not self._asking.acquire(timeout=timeout):
            raise HostError(self.host, f"{what}: the node program stayed busy {timeout:g} s")
        try:
            if not self.alive:
                raise KeptGone(self.host, "the node program was closed")
            with self._sending:
                self.send(json.dumps(message).encode() + b"\n")
            return self.answer(what, timeout)
        finally:
            self._asking.release()

    def end_input(self) -> None:
        """EOF to the program after the request just sent, its answer still to come: a
        program that ends at EOF then ends right after answering, its end overlapping
        the answer's way back rather than waiting for ``close``."""
        self._process.end_input()

    def close(self) -> None:
        """EOF to the program (it ends, changing nothing more) and its channel closed."""
        self.alive = False
        self._closed.set()
        self._process.close()

    def wait(self, deadline: float) -> None:
        """Wait (until the monotonic ``deadline``) for the program's end: first for its
        output to close (an event, where the process's own wait polls and sleeps up to
        50 ms), then for its status; an unclean end changes nothing, its answers are in."""
        self._output_closed.wait(max(0.1, deadline - time.monotonic()))
        with contextlib.suppress(CpuaccelError):
            self._process.wait(timeout=max(0.1, deadline - time.monotonic()))


def call_kept(
    kept: Kept | None,
    conn: Connector,
    words: Sequence[str],
    payload: bytes = b"",
    *,
    what: str,
    timeout: float,
) -> dict[str, Any]:
    """``call`` of the ``jobctl`` program with ``words``, through ``kept`` (a kept
    prelaunch program on the same node) while it lives: a gone one gives way to a fresh
    call; a timeout or a refusal is the answer."""
    if kept is not None and kept.alive:
        try:
            return kept.request(words, payload, what=what, timeout=timeout)
        except KeptGone:
            pass
    return call(conn, "jobctl", words, payload, what=what, timeout=timeout)


def start(
    conn: Connector,
    program: str,
    words: Sequence[str],
    payload: bytes = b"",
    *,
    what: str,
    timeout: float,
    heartbeat: float | None = None,
) -> tuple[dict[str, Any], Kept]:
    """``program`` started with ``words`` as ``call`` would, kept open after its first
    answer (within ``timeout`` s): (that answer, the program for later requests); with
    ``heartbeat``, an empty line to it every that many seconds (``Kept._beat``)."""
    kept = Kept(conn, program, words, heartbeat=heartbeat)
    if payload:
        with kept._sending:
            kept.send(payload)
    return kept.answer(what, timeout), kept
