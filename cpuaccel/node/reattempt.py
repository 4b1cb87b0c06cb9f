"""A detached run's restarts (``run --detach --max-restarts N``), kept on the head.

Part of cpuaccel's node package (see ``cpuaccel.node``): stdlib only, Python 3.8+. The
supervisor (node/supervisor.py) runs the attempt loop itself, since a detached run has no
controller to come back to. Between two attempts, once the failed one is ended and swept
everywhere, :class:`Restarts`:

- records it as the foreground loop does (node/restarts.py's :class:`Attempt` a line of
  ``attempts.jsonl``, ``attempt-<k>/`` copies of its logs, a ``--- attempt k ---`` line
  in each rank log where the next starts), so ps, report and the dashboard read it alike;
- applies the same rule (:func:`decide`), waits ``restart_delay`` (a SIGTERM from
  `cpuaccel stop` ends the wait and the run);
- asks every other node through the run's ssh.sh (the launcher's ssh, bounded) for its
  checkpoints: a node that does not answer ends the run as failed, named (a detached run
  keeps its node set: leaving one out would need a new plan, from the controller);
- picks the newest checkpoint complete on every node (node/checkpoints.py), and writes
  the attempt's ``CPUACCEL_RESTART`` / ``CPUACCEL_RESUME`` at the end of env.sh on every
  node (rank.sh sources it on the rank's own node), before the next launch.sh.

Node operations (the supervisor program's words): ``ready RUN_DIR`` (this node's
listing and checkpoints.jsonl tail) and ``attempt RUN_DIR K [RESUME]`` (env.sh set).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time

from cpuaccel.node.checkpoints import HostCheckpoints, choose, gather_here, host_of
from cpuaccel.node.common import write_atomic
from cpuaccel.node.restarts import (
    ATTEMPTS,
    MARKER,
    RESTART_ENV,
    RESUME_ENV,
    RETRIED,
    Attempt,
    decide,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

REACH_TIMEOUT = 30.0  # a node's answer through ssh.sh: ssh's connect, the program, room
STOPPED = {"terminated": 143, "interrupted": 130}  # SIGTERM / SIGINT between attempts
ENV_MARK = "# cpuaccel: this attempt's"  # env.sh's lines from here on are rewritten
_APPEND = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC


def on_nodes(
    run_dir: str, nodes: dict[str, str], words: list[str], timeout: float
) -> dict[str, Any]:
    """``supervisor.py - WORDS`` on every node of ``nodes`` (name -> its python) through
    the run's ssh.sh, at once; node -> its JSON answer, or a str: why there is none."""
    ssh = os.path.join(run_dir, "ssh.sh")
    program = os.path.join(run_dir, "supervisor.py")
    procs = {}
    for name, python in nodes.items():
        remote = [python, program, "-", *words]
        procs[name] = subprocess.Popen(
            ["/bin/sh", ssh, name, " ".join(shlex.quote(w) for w in remote)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    answers: dict[str, Any] = {}
    deadline = time.monotonic() + timeout
    for name, p in procs.items():
        try:
            out, err = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
            answers[name] = json.loads(out.decode().strip().splitlines()[-1])
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
            answers[name] = f"no answer within {timeout:g} s"
        except (ValueError, IndexError):
            why = err.decode(errors="replace").strip()[-200:]
            answers[name] = why or f"no answer (exit code {p.returncode})"
    return answers


def set_attempt_env(run_dir: str, k: int, resume: str | None) -> dict[str, Any]:
    """env.sh with attempt ``k``'s variables at its end (a previous attempt's replaced).
    Without a checkpoint, a CPUACCEL_RESUME the user gave (--env) stays, as in the
    foreground loop."""
    folder = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        fd = os.open("env.sh", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
        with os.fdopen(fd, "rb") as f:
            text = f.read(1 << 20).decode()
        kept = text.split("\n" + ENV_MARK, 1)[0].rstrip("\n") + "\n"
        lines = [f"{ENV_MARK} (attempt {k}, written by the supervisor)"]
        lines.append(f"export {RESTART_ENV}={shlex.quote(str(k))}")
        if resume is not None:
            lines.append(f"export {RESUME_ENV}={shlex.quote(resume)}")
        write_atomic("env.sh", (kept + "\n".join(lines) + "\n").encode(), dir_fd=folder)
    finally:
        os.close(folder)
    return {"attempt": k}


class AttemptFiles:
    """The run folder's record of the attempts, as jobs/attempts.AttemptLog keeps it."""

    def __init__(self, run_dir: str, world: int) -> None:
        self.run_dir = run_dir
        self.names = [f"rank-{r}.log" for r in range(world)] + ["launcher.log"]
        self._offsets: dict[str, int] = {}

    def _path(self, name: str) -> str:
        return os.path.join(self.run_dir, name)

    def begin(self, k: int) -> None:
        for name in self.names:
            fd = os.open(self._path(name), _APPEND, 0o600)
            try:
                if name.startswith("rank-"):
                    os.write(fd, (MARKER.format(k) + "\n").encode())
                self._offsets[name] = os.fstat(fd).st_size
            finally:
                os.close(fd)

    def end(self, attempt: Attempt) -> None:
        folder = self._path(f"attempt-{attempt.attempt}")
        os.makedirs(folder, mode=0o700, exist_ok=True)
        for name in self.names:
            fd = os.open(self._path(name), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            with os.fdopen(fd, "rb") as log:
                log.seek(self._offsets.get(name, 0))
                data = log.read()
            write_atomic(os.path.join(folder, name), data, 0o600)
        fd = os.open(self._path(ATTEMPTS), _APPEND, 0o600)
        try:
            os.write(fd, (json.dumps(attempt.to_json()) + "\n").encode())
        finally:
            os.close(fd)


class Restarts:
    """The attempt loop's judgement between two attempts (see the module's docstring)."""

    def __init__(self, run_dir: str, config: dict[str, Any]) -> None:
        self.run_dir = run_dir
        self.max_restarts = int(config.get("max_restarts") or 0)
        self.delay = float(config.get("restart_delay") or 0.0)
        self.nodes: dict[str, str] = config.get("nodes", {})
        self.hosts: list[str] = list(config.get("hosts") or [])
        self.head: str = config.get("head") or (self.hosts[0] if self.hosts else "head")
        ppn, world = config.get("ppn"), int(config["world"])
        self.rank_hosts = {r: self.hosts[r // ppn] for r in range(world) if ppn and self.hosts}
        self.files = AttemptFiles(run_dir, world)
        self.history: list[Attempt] = []
        self.resume: str | None = None  # the checkpoint the current attempt resumed from
        self.unreachable: dict[str, str] = {}
        self.files.begin(0)  # before the supervisor's first launch.sh

    def say(self, line: str) -> None:
        print(line, flush=True)  # the supervisor's stdout: supervisor.log

    def ended(
        self, k: int, started: float, reason: str, code: int, rank: int | None
    ) -> list[dict[str, Any]]:
        """Attempt ``k`` recorded; every attempt's record so far (status.json's)."""
        attempt = Attempt(
            attempt=k,
            started=round(started, 3),
            ended=round(time.time(), 3),
            reason=reason,
            exit_code=code,
            rank=rank,
            host=self.rank_hosts.get(rank) if rank is not None else None,
            hosts=list(self.hosts),
            resume=self.resume,
        )
        self.history.append(attempt)
        self.files.end(attempt)
        return [a.to_json() for a in self.history]

    def again(self, stopped: Callable[[], bool]) -> bool:
        """After the last attempt: whether the next one is to start (its env.sh then
        written everywhere). False: the run ends with the last attempt's outcome, or
        stopped (``stopped()``), or failed for a node that did not answer."""
        last = self.history[-1]
        if last.reason not in RETRIED or last.attempt >= self.max_restarts:
            return self._verdict(None)
        self.say(f"attempt {last.attempt} failed ({last.why()}): restarting in {self.delay:g} s")
        deadline = time.monotonic() + self.delay
        while not stopped() and time.monotonic() < deadline:
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
        if stopped():
            self.say("stopped before the restart: no further attempt")
            return False
        resume = self._newest_checkpoint()
        if self.unreachable or not self._verdict(resume):
            return False
        k = last.attempt + 1
        self.resume = resume
        self._set_env(k, resume)
        if self.unreachable:
            return False
        self.say(f"attempt {k}" + (f" from {resume}" if resume else " from the start"))
        self.files.begin(k)
        return True

    def final(
        self, ended: tuple[str, int, str], stopped: str | None, doc: dict[str, Any]
    ) -> tuple[str, int, str]:
        """The run's (reason, exit code, ended_by) after its last attempt (``ended``):
        stopped between attempts, or failed for a node that did not answer (named in
        status.json's ``doc``), else the last attempt's."""
        if stopped is not None:
            return stopped, STOPPED.get(stopped, 143), "stop"
        if self.unreachable:
            doc["unreachable"] = self.unreachable
            return "failed", ended[1], "unreachable: " + ", ".join(self.unreachable)
        return ended

    def _verdict(self, resume: str | None) -> bool:
        verdict = decide(self.history, self.max_restarts, resume)
        if verdict.why:
            self.say(verdict.why)
        return verdict.restart

    def _newest_checkpoint(self) -> str | None:
        """Every node's checkpoints (the others through ssh.sh: whether they answer)."""
        answers = on_nodes(self.run_dir, self.nodes, ["ready", self.run_dir], REACH_TIMEOUT)
        answers = {self.head: gather_here(self.run_dir), **answers}
        told = []
        for name, answer in answers.items():
            if not isinstance(answer, dict):
                self._lost(name, str(answer))
                continue
            try:
                told.append(host_of(name, self.run_dir, answer["files"], answer["tail"]))
            except (KeyError, TypeError, ValueError):  # a host that cannot be read has none
                told.append(HostCheckpoints(name, reasons=[f"not read: {answer!r:.200}"]))
        found = choose(told, self.run_dir)
        for host, why in found.reasons:
            self.say(f"  {host}: {why}")
        return found.path

    def _set_env(self, k: int, resume: str | None) -> None:
        try:
            set_attempt_env(self.run_dir, k, resume)
        except (OSError, UnicodeError) as exc:
            self._lost(self.head, f"env.sh not written: {exc}")
        words = ["attempt", self.run_dir, str(k)] + ([resume] if resume else [])
        for name, answer in on_nodes(self.run_dir, self.nodes, words, REACH_TIMEOUT).items():
            if not isinstance(answer, dict):
                self._lost(name, str(answer))

    def _lost(self, name: str, why: str) -> None:
        self.unreachable[name] = why
        self.say(f"not restarting: {name} did not answer from the head ({why})")
