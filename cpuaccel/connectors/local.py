"""Run commands on the controller itself, with the same interface (and quoting) as SSH."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import BinaryIO

from cpuaccel.connectors import commandline
from cpuaccel.connectors.base import CommandResult, CommandTimeout, Connector


class LocalConnector(Connector):
    def connect(self) -> None:
        pass

    def close(self) -> None:
        pass

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | BinaryIO | None = None,
        timeout: float | None = None,
    ) -> CommandResult:
        # The same rendered line as over SSH, run by sh: a command behaves alike on a
        # local host and a remote one, and quoting has one code path to test.
        line = commandline.render(argv, env=env, cwd=cwd)
        timeout = self.options.command_timeout if timeout is None else timeout
        started = time.monotonic()
        proc = subprocess.Popen(
            ["/bin/sh", "-c", line],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group, so a timeout ends all of it
        )
        try:
            data = stdin if stdin is None or isinstance(stdin, bytes) else stdin.read()
            out, err = proc.communicate(data or b"", timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise CommandTimeout(
                self.host.name, f"command timed out after {timeout:g} s: {line}"
            ) from None
        return CommandResult(
            host=self.host.name,
            command=line,
            exit_code=proc.returncode,
            stdout=out.decode(errors="replace"),
            stderr=err.decode(errors="replace"),
            seconds=time.monotonic() - started,
        )
