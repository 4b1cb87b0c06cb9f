"""A detached run's supervisor on the head node: the node program ``supervisor``.

``cpuaccel run --detach`` writes this program into the run folder (``supervisor.py``,
with ``supervisor.json``: the run's id, world size, timeout and the other nodes) and
starts it there with ``start``; it then does on the head what the controller's
``jobs/supervise.Job`` does for a foreground run, so that the job outlives the
controller's connection:

  start RUN_DIR           run ``watch`` in a session of its own (it survives the
                          connection closing), its environment carrying
                          CPUACCEL_SUPERVISES=<run id>; answer its pid
  watch RUN_DIR           run launch.sh, split its labelled output into rank-R.log
                          (launcher.log for the launcher's own lines), end the job
                          when a rank fails, the timeout passes or on SIGTERM (the
                          launcher's process group: SIGTERM, GRACE, SIGKILL; then
                          every node swept by CPUACCEL_RUN_ID), and keep status.json
  stop RUN_ID PID GRACE   SIGTERM the supervisor PID once its environment shows it is
                          this run's (never a pattern), wait up to GRACE s for its end
  status RUN_DIR          the run's status.json, null when there is none
  ended RUN_DIR STATE BY  a status.json still "running" whose supervisor is gone, marked
                          ended (after `cpuaccel stop` swept the nodes itself)
  end RUN_ID GRACE RUN_DIR
                          the jobs program's sweep, run on another node through the
                          run's ssh.sh (every node has this file in its run folder)
  stacks RUN_ID TIMEOUT RANKS
                          run --hang-timeout: py-spy's dumps of this node's ranks
                          (RANKS: JSON {rank: [host, pid]}), also through ssh.sh; the
                          watch ends a job no rank of which progressed for hang_timeout
                          (cpuaccel.node.progress) as "failed", ended_by "hang", 124
  ready RUN_DIR; attempt RUN_DIR K [RESUME]: run --max-restarts's, node/reattempt.py

status.json (written atomically) is the contract with ``ps``/``logs``/``fetch``:
run_id, state, exit_code, ended_by, started, ended, detached, supervisor, ranks (and
with run --max-restarts: attempt, attempts, the attempts.jsonl lines so far).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

from cpuaccel.node.checkpoints import gather_here
from cpuaccel.node.common import write_atomic
from cpuaccel.node.jobctl import end, job_pids, signal_launcher
from cpuaccel.node.progress import gather, stacks, tracker_of, write_stacks
from cpuaccel.node.reattempt import Restarts, on_nodes, set_attempt_env

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import IO, Any

MARK = "CPUACCEL_SUPERVISES"  # not CPUACCEL_RUN_ID: the sweep must not end the supervisor
LABEL = re.compile(r"^\[rank (\d+) ([^\]]*)\] ?(.*)$")  # as cpuaccel/_labels.py writes them
EXIT_MARKER = "[cpuaccel] exit code"  # cpuaccel.worker's (a node part imports no cpuaccel)
KILLED_MARKER = "[cpuaccel] killed by"
GRACE = 5.0  # seconds between SIGTERM and SIGKILL, as for a foreground run
SWEEP_TIMEOUT = 30.0  # another node's sweep through ssh.sh: its 2 s grace, ssh, room
# A foreground run's reasons (jobs/supervise.Outcome) as status.json's states.
STATES = {
    "completed": "succeeded",
    "failed": "failed",
    "terminated": "stopped",
    "interrupted": "interrupted",
    "timeout": "timeout",
    "lost": "lost",
    "hang": "failed",  # run --hang-timeout: a failure (ft-restart retries it), exit 124
}
_APPEND = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
CODES = {"terminated": 143, "interrupted": 130, "timeout": 124, "lost": 255, "hang": 124}


def start_time(pid: int) -> int | None:
    """The process's start (clock ticks since boot): with the pid, its identity."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def write_status(run_dir: str, doc: dict[str, Any]) -> None:
    folder = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        data = (json.dumps(doc, indent=2) + "\n").encode()
        write_atomic("status.json", data, 0o600, dir_fd=folder)
    finally:
        os.close(folder)


def read_status(run_dir: str) -> dict[str, Any] | None:
    try:
        fd = os.open(os.path.join(run_dir, "status.json"), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        try:
            doc = json.loads(f.read(1 << 20))
        except ValueError:
            return None
    return doc if isinstance(doc, dict) else None


def status_doc(
    run_id: str, started: float, detached: bool, supervisor: Any, world: int
) -> dict[str, Any]:
    """status.json of a run that has just started."""
    return {
        "run_id": run_id,
        "state": "running",
        "exit_code": None,
        "ended_by": None,
        "started": started,
        "ended": None,
        "detached": detached,
        "supervisor": supervisor,
        "ranks": {str(r): None for r in range(world)},
    }


def start(run_dir: str) -> dict[str, Any]:
    with open(os.path.join(run_dir, "supervisor.json")) as f:
        run_id = json.load(f)["run_id"]
    log = os.open(os.path.join(run_dir, "supervisor.log"), _APPEND, 0o600)
    try:
        proc = subprocess.Popen(
            [sys.executable, os.path.join(run_dir, "supervisor.py"), "-", "watch", run_dir],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            cwd=run_dir,
            env={**os.environ, MARK: run_id},
            start_new_session=True,  # no hangup when the connection that started it closes
        )
    finally:
        os.close(log)
    return {"pid": proc.pid, "start_time": start_time(proc.pid), "host": socket.gethostname()}


def is_supervisor(pid: int, run_id: str) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return (MARK + "=" + run_id).encode() in f.read().split(b"\0")
    except OSError:
        return False


def stop(run_id: str, pid: int, grace: float) -> dict[str, Any]:
    """SIGTERM this run's supervisor; {"signalled", "alive"} (alive: still there after grace)."""
    if not is_supervisor(pid, run_id):
        return {"signalled": False, "alive": False}
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return {"signalled": False, "alive": False}
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and is_supervisor(pid, run_id):
        time.sleep(0.1)
    return {"signalled": True, "alive": is_supervisor(pid, run_id)}


def mark_ended(run_dir: str, state: str, ended_by: str) -> dict[str, Any] | None:
    """A status.json still "running" whose supervisor is gone (killed, or its node
    restarted), once `cpuaccel stop` has swept the nodes: recorded as ``state``."""
    doc = read_status(run_dir)
    if doc is not None and doc.get("state") == "running":
        doc.update(state=state, ended_by=ended_by, ended=time.time())
        write_status(run_dir, doc)
    return doc


class Supervisor:
    """One detached job, from launch.sh to its final status."""

    def __init__(self, run_dir: str, config: dict[str, Any]) -> None:
        self.run_dir = run_dir
        self.run_id: str = config["run_id"]
        self.timeout: float | None = config.get("timeout")
        self.nodes: dict[str, str] = config.get("nodes", {})  # other node -> its python
        self.doc = status_doc(
            self.run_id,
            time.time(),
            True,
            {
                "host": config.get("head") or socket.gethostname(),
                "pid": os.getpid(),
                "start_time": start_time(os.getpid()),
            },
            int(config["world"]),
        )
        self.failures: list[tuple[int, int]] = []  # (rank, code), in the order reported
        self.failed = threading.Event()
        self.quiet = False  # while ending the job: ranks it kills are not failures
        self.stop_reason: str | None = None
        self._logs: dict[str, IO[str]] = {}
        self.progress = tracker_of(config, time.monotonic())  # run --hang-timeout, else None
        self.config = config
        self.restarts = Restarts(run_dir, config) if config.get("max_restarts") else None

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.stop_reason is None:
            self.stop_reason = "interrupted" if signum == signal.SIGINT else "terminated"

    def _log(self, name: str) -> IO[str]:
        if name not in self._logs:
            path = os.path.join(self.run_dir, name)
            fd = os.open(path, _APPEND, 0o600)
            self._logs[name] = os.fdopen(fd, "a", buffering=1)
        return self._logs[name]

    def feed(self, line: str) -> None:
        """One line of the launcher's output, as jobs/supervise.OutputRouter takes it."""
        match = LABEL.match(line)
        if match is None:
            if "BAD TERMINATION" in line:
                self.failed.set()
            self._log("launcher.log").write(line + "\n")
            return
        rank, text = int(match[1]), match[3]
        if self.progress is not None and self.progress.line(rank, match[2], text, time.monotonic()):
            return  # cpuaccel's progress marker: not for rank-R.log
        code = None
        if text.startswith(EXIT_MARKER):
            word = text[len(EXIT_MARKER) :].strip()
            code = int(word) if word.lstrip("-").isdigit() else 1
            self.doc["ranks"][str(rank)] = code
            if code == 0:
                return
        self._log(f"rank-{rank}.log").write(text + "\n")
        if code is not None and not self.quiet:
            self.failures.append((rank, code))
            self.failed.set()

    def _pump(self, stream: IO[bytes]) -> None:
        for raw in stream:
            self.feed(raw.decode(errors="replace").rstrip("\n"))

    def run(self) -> None:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        write_status(self.run_dir, self.doc)
        restarts, k = self.restarts, 0
        while True:  # attempt after attempt, with run --max-restarts (node/reattempt.py)
            started = time.time()
            launcher_exit, left = self._attempt(k, forget=restarts is None)
            ended = self._outcome(launcher_exit)
            if restarts is None:
                break
            rank = self.failures[0][0] if self.failures else None
            self.doc["attempts"] = restarts.ended(k, started, ended[0], ended[1], rank)
            write_status(self.run_dir, self.doc)
            self.stop_reason = None  # a SIGTERM between attempts: "terminated"
            if not restarts.again(lambda: self.stop_reason is not None):
                ended = restarts.final(ended, self.stop_reason, self.doc)
                left = self.sweep(forget=True) or left  # secret.env off every node now
                break
            k += 1
        self._finish(ended, launcher_exit, left)

    def _attempt(self, k: int, forget: bool) -> tuple[int | None, dict[str, Any]]:
        """Attempt ``k``: launch.sh run, watched, ended, swept (``forget``: secret.env
        removed too, the job being over). The launcher's exit and what stayed."""
        if k:  # a fresh watch: no failure seen yet, every rank running (run --max-restarts)
            self.failures, self.quiet = [], False
            self.failed.clear()
            self.progress = tracker_of(self.config, time.monotonic())
            self.doc.update(ranks={r: None for r in self.doc["ranks"]}, attempt=k)
            write_status(self.run_dir, self.doc)
        # stdin a pipe held here: launch.sh ends the job when it closes (this process died).
        proc = subprocess.Popen(
            ["setsid", "-w", "/bin/sh", os.path.join(self.run_dir, "launch.sh")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=self.run_dir,
        )
        reader = threading.Thread(target=self._pump, args=(proc.stdout,), daemon=True)
        reader.start()
        self._watch(reader, time.monotonic())
        try:
            launcher_exit: int | None = proc.wait(20)
        except subprocess.TimeoutExpired:
            launcher_exit = None
        assert proc.stdin is not None
        proc.stdin.close()
        left = self.sweep(forget)
        reader.join(GRACE)
        return launcher_exit, left

    def _watch(self, reader: threading.Thread, started: float) -> None:
        while reader.is_alive():
            reader.join(0.2)
            if self.timeout is not None and time.monotonic() - started > self.timeout:
                self.stop_reason = self.stop_reason or "timeout"
            if self.failed.is_set():
                self.stop_reason = self.stop_reason or "failed"
            self._notice_hang()
            if self.stop_reason:
                self.quiet = True
                pidfile = os.path.join(self.run_dir, "launcher.pid")
                signal_launcher(self.run_id, pidfile, signal.SIGTERM)
                reader.join(GRACE)
                if reader.is_alive():
                    signal_launcher(self.run_id, pidfile, signal.SIGKILL)
                    reader.join(GRACE)
                return

    def _notice_hang(self) -> None:
        """No rank progressed for hang_timeout: the ranks in supervisor.log and
        status.json ("hang"), their stacks in hang-R.txt; the job then ends (hang)."""
        now = time.monotonic()
        if self.progress is None or self.stop_reason or not self.progress.stalled(now):
            return
        self.stop_reason = "hang"
        print(f"hang: no rank made progress for {self.progress.idle(now):.1f} s", flush=True)
        for line in self.progress.report(now):
            print("  " + line, flush=True)
        self.doc["hang"] = [p.to_json(now) for p in self.progress.stuck_first()]
        ours = set(job_pids(self.run_id))
        dumps = gather(self.run_id, self.run_dir, self.progress.pids(), self.nodes, ours)
        write_stacks(self.run_dir, dumps)

    def sweep(self, forget: bool = True) -> dict[str, Any]:
        """End what is left of the job here and on the other nodes (through ssh.sh, as
        MPI reaches them); node -> what stayed (or why it could not be checked).
        ``forget``: the run's secret.env removed too (not between two attempts)."""
        words = ["end", self.run_id, "2"] + ([self.run_dir] if forget else [])
        answers = on_nodes(self.run_dir, self.nodes, words, SWEEP_TIMEOUT)
        left: dict[str, Any] = {}
        here = end(self.run_id, 2, self.run_dir if forget else None)
        if here["left"]:
            left["head"] = here["left"]
        for name, found in answers.items():
            if not isinstance(found, dict) or "left" not in found:
                left[name] = "could not check: " + str(found)
            elif found["left"]:
                left[name] = found["left"]
        return left

    def _outcome(self, launcher_exit: int | None) -> tuple[str, int, str]:
        """How the attempt ended: (reason, exit code, ended_by)."""
        reason = self.stop_reason
        if reason in CODES:
            return reason, CODES[reason], "stop" if reason == "terminated" else reason
        if self.failures:
            rank, code = self.failures[0]
            return "failed", code, f"rank {rank}"
        if reason == "failed" or launcher_exit != 0:
            return "failed", launcher_exit or 1, "launcher"
        return "completed", 0, "completed"

    def _finish(
        self, ended: tuple[str, int, str], launcher_exit: int | None, left: dict[str, Any]
    ) -> None:
        reason, code, ended_by = ended
        self.doc.update(state=STATES[reason], exit_code=code, ended_by=ended_by, ended=time.time())
        self.doc.update(launcher_exit=launcher_exit, left=left)
        write_status(self.run_dir, self.doc)
        for log in self._logs.values():
            log.close()


def watch(run_dir: str) -> dict[str, Any]:
    with open(os.path.join(run_dir, "supervisor.json")) as f:
        config = json.load(f)
    Supervisor(run_dir, config).run()
    return {}


def main() -> None:
    mode, args = sys.argv[2], sys.argv[3:]  # after BOOT's LENGTH, or "-" when run as a file
    if mode == "start":
        result = start(args[0])
    elif mode == "watch":
        result = watch(args[0])
    elif mode == "stop":
        result = stop(args[0], int(args[1]), float(args[2]))
    elif mode == "ended":
        result = {"status": mark_ended(args[0], args[1], args[2])}
    elif mode == "status":
        result = {"status": read_status(args[0])}
    elif mode == "end":
        result = end(args[0], float(args[1]), args[2] if len(args) > 2 else None)
    elif mode == "ready":  # run --detach --max-restarts: this node's checkpoints
        result = gather_here(args[0])
    elif mode == "attempt":
        result = set_attempt_env(args[0], int(args[1]), args[2] if len(args) > 2 else None)
    elif mode == "stacks":
        ours = set(job_pids(args[0]))
        result = {"stacks": stacks(json.loads(args[2]), ours, float(args[1]))}
    else:
        raise SystemExit(f"unknown mode {mode}")
    sys.stdout.write(json.dumps(result) + "\n")
