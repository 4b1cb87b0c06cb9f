"""Run commands on the controller itself, with the same interface (and quoting) as SSH."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import threading
from collections.abc import Iterator
from typing import IO, BinaryIO

from cpuaccel.connectors.base import Command, Connector, Process, RsyncRoute, split_lines
from cpuaccel.errors import CommandTimeout

_CHUNK = 1 << 18


def _feed(pipe: IO[bytes] | None, data: bytes | BinaryIO | None) -> None:
    """Write ``data`` (bytes, or a binary file streamed in chunks) to ``pipe``, then
    close it: the command sees EOF. A command that ended early breaks the pipe; its exit
    status and stderr say why."""
    assert pipe is not None
    with contextlib.suppress(OSError, ValueError):
        if isinstance(data, bytes):
            pipe.write(data)
        elif data is not None:
            while chunk := data.read(_CHUNK):
                pipe.write(chunk)
    with contextlib.suppress(OSError):
        pipe.close()


class LocalProcess(Process):
    def __init__(self, proc: subprocess.Popen[bytes], host_name: str) -> None:
        self._proc = proc
        self._host_name = host_name
        self._queue: queue.Queue[tuple[str, str] | None] = queue.Queue()
        self._readers = [
            threading.Thread(target=self._read, args=(name, stream), daemon=True)
            for name, stream in (("out", proc.stdout), ("err", proc.stderr))
        ]
        for reader in self._readers:
            reader.start()

    def _read(self, name: str, stream: IO[bytes] | None) -> None:
        assert stream is not None
        pending = b""
        while chunk := stream.read1(65536):  # type: ignore[attr-defined]
            lines, pending = split_lines(pending, chunk)
            for line in lines:
                self._queue.put((name, line))
        if pending:
            self._queue.put((name, pending.decode(errors="replace")))
        self._queue.put(None)

    def lines(self) -> Iterator[tuple[str, str]]:
        ended = 0
        while ended < len(self._readers):
            item = self._queue.get()
            if item is None:
                ended += 1
            else:
                yield item

    def wait(self, timeout: float | None = None) -> int:
        try:
            return self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise CommandTimeout(
                self._host_name, f"no exit status {timeout:g} s after its output ended"
            ) from None

    def send(self, data: bytes) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.write(data)
        self._proc.stdin.flush()

    def close(self) -> None:
        if self._proc.stdin is not None and not self._proc.stdin.closed:
            with contextlib.suppress(OSError):
                self._proc.stdin.close()

    def end_input(self) -> None:
        self.close()  # closing stdin is all close does: the output is still read


class LocalConnector(Connector):
    def connect(self) -> None:
        pass

    def wrap(self, line: str) -> list[str]:
        """The argv that runs a rendered shell line (connectors/srun.py puts srun first)."""
        return ["/bin/sh", "-c", line]

    def close(self) -> None:
        pass

    def rsync_route(self, dest: str) -> RsyncRoute:
        # No shell expands "~" here: rsync would make a folder named "~" in the cwd.
        return RsyncRoute(os.path.expanduser(dest))

    def spawn(self, command: Command) -> Process:
        proc = subprocess.Popen(
            self.wrap(command.line),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # like an SSH session: its own group, away from our ^C
        )
        return LocalProcess(proc, self.host.name)

    def execute(
        self, command: Command, stdin: bytes | BinaryIO | None, timeout: float
    ) -> tuple[int, bytes, bytes]:
        # The same rendered line as over SSH, run by sh: a command behaves alike on a
        # local host and a remote one, and quoting has one code path to test.
        proc = subprocess.Popen(
            self.wrap(command.line),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group, so a timeout ends all of it
        )
        # stdin from a thread of its own, in large writes: communicate() feeds it one
        # PIPE_BUF (4 kB) a turn of its select loop, and reads a file's stream whole first.
        writer = threading.Thread(target=_feed, args=(proc.stdin, stdin), daemon=True)
        proc.stdin = None  # the writer's alone: communicate() only reads
        writer.start()
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            # A process that left the group may hold the pipes open: do not wait for it.
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.communicate(timeout=5)
            raise self.timed_out(command, timeout) from None
        writer.join(5)  # its pipe is closed or broken once the command ended
        return proc.returncode, out, err
