"""Run the ``cpuaccel run`` CLI as a user does, for tests: a subprocess in a project folder.

Tests of run, the runtime and Accelerate compatibility share these: a project folder of
the test's own (synced to ``{{cpuaccel_workdir}}/<folder>`` on the nodes), the finished
run with its labelled output parsed, and the run directory's record.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from testsupport.command import clean_env, cpuaccel, start_cpuaccel

if TYPE_CHECKING:
    from cpuaccel.testbed.cluster import Cluster

# A clean environment: what a user's shell would pass, without this session's variables.
ENV = clean_env()
LABELLED = re.compile(r"^\[rank (\d+) ([^\]]+)\] (.*)$")


class Run:
    """One finished ``cpuaccel run``."""

    def __init__(self, proc: subprocess.CompletedProcess[str], seconds: float) -> None:
        self.code = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        self.seconds = seconds

    def __repr__(self) -> str:  # what pytest shows when an assertion fails
        return f"exit {self.code} in {self.seconds:.1f}s\n{self.stdout}\n{self.stderr}"

    @property
    def run_dir(self) -> Path:
        found = re.findall(r"^run directory: (.+)$", self.stderr, re.M)
        assert len(found) == 1, self
        return Path(found[0])

    def record(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.run_dir / "run.json").read_text())
        return data

    def labelled(self) -> list[tuple[int, tuple[str, str]]]:
        """(rank, (host of its label, text)) of every stdout line, in order; every
        stdout line must carry a rank label."""
        found = []
        for line in self.stdout.splitlines():
            match = LABELLED.match(line)
            assert match, f"unlabelled line {line!r} in\n{self}"
            found.append((int(match[1]), (match[2], match[3])))
        return found

    def ranks(self) -> dict[int, tuple[str, str]]:
        """rank -> (host of its label, text) of the last labelled stdout line of each rank."""
        return dict(self.labelled())

    def lines(self, rank: int) -> list[str]:
        """What ``rank`` printed."""
        return [text for r, (_, text) in self.labelled() if r == rank]

    def json_lines(self) -> dict[int, tuple[str, dict[str, Any]]]:
        """rank -> (host of its label, the JSON object it printed) of the ranks that
        printed a line starting with ``{``."""
        return {
            rank: (host, json.loads(text))
            for rank, (host, text) in self.labelled()
            if text.startswith("{")
        }


def make_project(tmp_path: Path, files: Mapping[str, str]) -> Path:
    """A project folder of its own (unique name) holding ``files``."""
    folder = tmp_path / f"proj-{uuid.uuid4().hex[:10]}"
    folder.mkdir()
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


def cpuaccel_run(project: Path, *args: str, timeout: float = 240) -> Run:
    """``cpuaccel run ARGS`` from the project folder; never a traceback."""
    started = time.monotonic()
    proc = cpuaccel("run", *args, cwd=project, env=ENV, timeout=timeout)
    run = Run(proc, time.monotonic() - started)
    assert "Traceback" not in run.stderr, run
    return run


class BackgroundRun:
    """``cpuaccel run`` in the background, its output collected line by line, for tests
    that act on a job while it runs (signals, a node cut off)."""

    def __init__(self, project: Path, *args: str, new_session: bool = False) -> None:
        self.proc = start_cpuaccel(
            "run",
            *args,
            cwd=project,
            env=ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=new_session,
        )
        self.out: list[str] = []
        self.err: list[str] = []
        self._readers = [
            threading.Thread(target=self._read, args=(self.proc.stdout, self.out), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, self.err), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream: Any, into: list[str]) -> None:
        for line in stream:
            into.append(line.rstrip("\n"))

    def wait_for(self, text: str, count: int, timeout: float = 60) -> None:
        """Until ``count`` lines of stdout hold ``text``; fails if the run ends first."""
        deadline = time.monotonic() + timeout
        while sum(text in line for line in self.out) < count:
            assert self.proc.poll() is None, self.report()
            assert time.monotonic() < deadline, self.report()
            time.sleep(0.05)

    def finish(self, timeout: float = 60) -> Run:
        started = time.monotonic()
        code = self.proc.wait(timeout=timeout)
        for reader in self._readers:
            reader.join(timeout=10)
        done = subprocess.CompletedProcess(
            self.proc.args, code, "\n".join(self.out) + "\n", "\n".join(self.err) + "\n"
        )
        return Run(done, time.monotonic() - started)

    def stop(self) -> None:
        """Kill it if it still runs (a test's clean-up after a failed assertion)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def report(self) -> str:
        return "\n".join([*self.out, *self.err])


def job_processes(cluster: Cluster, node: str, run_id: str) -> list[str]:
    """Processes inside the node whose environment carries this run's id."""
    marker = f"CPUACCEL_RUN_ID={run_id}".encode()
    found = []
    for pid in cluster.pids(node):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if marker in environ:
            found.append(f"{pid} {cmd.decode(errors='replace')}")
    return found
