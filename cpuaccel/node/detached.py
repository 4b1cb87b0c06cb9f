"""A detached run on its head node: the node program ``detached``.

Part of cpuaccel's node package (see ``cpuaccel.node``): stdlib only, Python 3.8+.
``cpuaccel run --detach`` writes this program into the run folder (``supervisor.py``, with
``supervisor.json``: the run's id, hosts, ranks per node and limits) and starts it there
with ``start``. It then supervises the run on the head with the supervisor every run has
(node/supervisor.py), so that the job outlives the controller's connection; this module
is that supervisor's side on the head: launch.sh as a child process, and the other
nodes reached through the run's ssh.sh, as MPI reaches them.

  start RUN_DIR           run ``watch`` in a session of its own (it survives the
                          connection closing), its environment carrying
                          CPUACCEL_SUPERVISES=<run id>; answer its pid
  watch RUN_DIR           supervise the run to its end (node/supervisor.py)
  stop RUN_ID PID GRACE   SIGTERM the supervisor PID once its environment shows it is
                          this run's (never a pattern), wait up to GRACE s for its end
  status RUN_DIR          the run's status.json, null when there is none
  ended RUN_DIR STATE BY  a status.json still "running" whose supervisor is gone, marked
                          ended (after `cpuaccel stop` swept the nodes itself)
  end RUN_ID GRACE [RUN_DIR]
                          the jobctl program's sweep, run on another node through ssh.sh
                          (every node has this file in its run folder)
  stacks RUN_ID TIMEOUT RANKS
                          py-spy's dumps of this node's ranks (RANKS: JSON {rank:
                          [host, pid]}) for --hang-timeout, also through ssh.sh
  ready RUN_DIR           this node's listing and checkpoints.jsonl tail, between two
                          attempts: whether it answers, and its checkpoints
  attempt RUN_DIR K [RESUME]
                          env.sh with attempt K's CPUACCEL_RESTART and CPUACCEL_RESUME
  guard RUN_ID RUN_DIR HEAD PYTHON PID
                          on every other node, in a session of its own: hold an ssh
                          session to the head (``alive``) while the supervisor PID
                          lives; answer its pid
  alive RUN_ID PID        on the head: say so, then return once the supervisor ends
  hold RUN_DIR            on every other node of an attempt, through ssh.sh: say so,
                          then return when the head closes the session, or once this
                          node's guard wrote lost.json (the head is gone: nothing will
                          close it)

A lost node is found as a foreground run finds it. The controller of a foreground run
holds a connection to every node, and one whose keepalives go unanswered is named
lost and ends the attempt; here the supervisor holds a session (``hold``) through ssh.sh
to every other node of the attempt, with the run's keepalives, so that a node that goes
silent mid-attempt is named within the ServerAlive window instead of leaving the MPI
launcher waiting on its dead connections.

A lost head is handled as a foreground run handles it. When the controller loses its
connection to a foreground run's head, it names the node and ends the job on the
others; here the supervisor is lost with the head, so each other node's guard does
it: its session to the head stops answering keepalives (ssh exits 255 after the run's
ServerAlive window), and the guard says "lost the connection to HEAD (no answer to
keepalives): ending the job on the other nodes" in its node's guard.log and
``lost.json``, and sweeps the run's processes (and secret.env) off its node. A guard
that never reached the head (no key for it there) says so and ends nothing.

Between two attempts every other node is asked through ssh.sh, bounded. A node that does
not answer is left out while --nodes MIN remain (supervisor.json's ``min_nodes``): the
controller rendered launch.sh for each smaller count of nodes (``launch_files``) and
each node's hostfile line (``hostfile_lines``), so the head rewrites the hostfile and
starts the launch.sh of the remaining count; the head itself is never left out (the
supervisor runs there). Without MIN, such a node ends the run as failed, named.
"""

from __future__ import annotations

import json
import os
import select
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time

from cpuaccel.node.boundedjson import loads
from cpuaccel.node.checkpoints import HostCheckpoints, choose, gather_here, host_of
from cpuaccel.node.common import write_atomic
from cpuaccel.node.jobctl import end, signal_launcher
from cpuaccel.node.jobprocs import job_pids
from cpuaccel.node.progress import DUMP_TIMEOUT, stacks
from cpuaccel.node.supervisor import (
    RESTART_ENV,
    RESUME_ENV,
    Launched,
    Limits,
    Outcome,
    Side,
    Supervised,
    mark_ended,
    read_status,
    start_time,
    status_doc,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence
    from typing import Any

MARK = "CPUACCEL_SUPERVISES"  # not CPUACCEL_RUN_ID: the sweep must not end the supervisor
ALIVE = "alive"  # the head's first word to a guard: the session is up
SSH_FAILED = 255  # ssh's own exit code: the connection, not the command, failed
REACH_TIMEOUT = 30.0  # a node's answer through ssh.sh: ssh's connect, the program, room
GRACE_CLOSE = 5.0  # the ``hold`` sessions' end once their stdin closed
HOLD_POLL = 1.0  # how often a ``hold`` looks for lost.json
HOLD_BEAT = 15.0  # a ``hold`` writes a line this often: its sshd then finds a dead peer
SWEEP_TIMEOUT = 30.0  # another node's sweep through ssh.sh: its 2 s grace, ssh, room
ENV_MARK = "# cpuaccel: this attempt's"  # env.sh's lines from here on are rewritten
_APPEND = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC


def on_nodes(
    run_dir: str, nodes: dict[str, str], words: list[str], timeout: float
) -> dict[str, Any]:
    """``supervisor.py - WORDS`` on every node of ``nodes`` (name -> its python) through
    the run's ssh.sh, at once; node -> its JSON answer, or a str: why there is none."""
    return _answers(_ask(run_dir, nodes, words), timeout)


def _ask(
    run_dir: str, nodes: dict[str, str], words: list[str]
) -> dict[str, subprocess.Popen[bytes]]:
    """``supervisor.py - WORDS`` started on every node of ``nodes`` through ssh.sh."""
    return {
        name: subprocess.Popen(
            _through_ssh(run_dir, name, python, words),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        for name, python in nodes.items()
    }


def _through_ssh(run_dir: str, name: str, python: str, words: list[str]) -> list[str]:
    """The argv of ``supervisor.py - WORDS`` on node ``name`` through the run's ssh.sh."""
    program = os.path.join(run_dir, "supervisor.py")
    return [
        "/bin/sh",
        os.path.join(run_dir, "ssh.sh"),
        name,
        shlex.join([python, program, "-", *words]),
    ]


def _session(run_dir: str, name: str, python: str, words: list[str]) -> subprocess.Popen[bytes]:
    """``supervisor.py - WORDS`` on node ``name`` through ssh.sh, its stdin a pipe held
    here: the node's program sees it close when this process closes it or dies."""
    return subprocess.Popen(
        _through_ssh(run_dir, name, python, words),
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _close(proc: subprocess.Popen[bytes]) -> None:
    try:
        if proc.stdin is not None:
            proc.stdin.close()
    except OSError:
        pass  # the session already broke


def _answers(procs: dict[str, subprocess.Popen[bytes]], timeout: float) -> dict[str, Any]:
    """Each started node's JSON answer within ``timeout`` s from now, or why none."""
    answers: dict[str, Any] = {}
    deadline = time.monotonic() + timeout
    for name, p in procs.items():
        try:
            out, err = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
            answers[name] = loads(out.decode().strip().splitlines()[-1])
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
    foreground."""
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


def gather(
    run_id: str, run_dir: str, pids: dict[str, list[Any]], nodes: dict[str, str], ours: set[int]
) -> dict[str, str]:
    """The ranks' stacks for a hang: this node's (``ours``: the job's pids here), and
    every other node's (name -> its python) through the run's ssh.sh, as its sweep
    reaches them; rank -> dump. A node that does not answer in time gives none."""
    asked = _ask(run_dir, nodes, ["stacks", run_id, f"{DUMP_TIMEOUT:g}", json.dumps(pids)])
    found = stacks(pids, ours, DUMP_TIMEOUT)  # the head's own, while the others dump
    for answer in _answers(asked, DUMP_TIMEOUT + 10).values():
        dumps = answer.get("stacks") if isinstance(answer, dict) else None
        if isinstance(dumps, dict):
            found.update({str(rank): str(text) for rank, text in dumps.items()})
    return found


# ---------------------------------------------------------------- the supervisor's side


class _Child(Launched):
    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc

    def lines(self) -> Iterator[tuple[str, str]]:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            yield "out", raw.decode(errors="replace").rstrip("\n")

    def wait(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()


class HeadSide(Side):
    """The run seen from its head: launch.sh a child, the other nodes through ssh.sh."""

    def __init__(self, run_dir: str, config: dict[str, Any]) -> None:
        self.run_dir = run_dir
        self.run_id: str = config["run_id"]
        self.head: str = config.get("head") or socket.gethostname()
        self.all_hosts: list[str] = list(config.get("hosts") or [self.head])
        self.hosts = list(self.all_hosts)
        self.pythons: dict[str, str] = dict(config.get("nodes", {}))  # other node -> python
        self.launch_files: dict[str, str] = dict(config.get("launch_files") or {})
        self.forget = not config.get("max_restarts")  # a one-attempt run's sweep forgets
        self.held: dict[str, subprocess.Popen[bytes]] = {}  # node -> its ``hold`` session

    @property
    def nodes(self) -> dict[str, str]:
        """The current attempt's other nodes, name -> python."""
        return {h: self.pythons[h] for h in self.hosts[1:] if h in self.pythons}

    def say(self, level: str, text: str) -> None:
        print(text, flush=True)  # the supervisor's stdout: supervisor.log

    def start(self) -> Launched:
        self.hold()
        name = "launch.sh"
        if len(self.hosts) < len(self.all_hosts):  # nodes left out: fewer ranks
            name = self.launch_files[str(len(self.hosts))]
        # stdin a pipe held here: launch.sh ends the job when it closes (this process died).
        proc = subprocess.Popen(
            ["setsid", "-w", "/bin/sh", os.path.join(self.run_dir, name)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=self.run_dir,
        )
        return _Child(proc)

    def hold(self) -> None:
        """A ``hold`` session to every node of the attempt that has none open, started
        beside the launch: ssh's keepalives then watch each node for the attempt."""
        for name, python in self.nodes.items():
            held = self.held.get(name)
            if held is None or held.poll() is not None:
                self.held[name] = _session(self.run_dir, name, python, ["hold", self.run_dir])

    def lost(self) -> list[str]:
        """The attempt's nodes whose session broke: ssh's own exit code, after the
        keepalives went unanswered or the node could not be reached at all."""
        return [n for n in self.nodes if n in self.held and self.held[n].poll() == SSH_FAILED]

    def release(self) -> None:
        """Every session closed (each node's ``hold`` returns), within a bound."""
        for held in self.held.values():
            _close(held)
        deadline = time.monotonic() + GRACE_CLOSE
        for held in self.held.values():
            try:
                held.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(held.pid, signal.SIGKILL)
                held.wait()
        self.held = {}

    def signal_launcher(self, signum: int, lost: Sequence[str]) -> None:
        signal_launcher(self.run_id, os.path.join(self.run_dir, "launcher.pid"), signum)

    def stacks(self, pids: dict[str, list[Any]], lost: Sequence[str]) -> dict[str, str]:
        others = {h: p for h, p in self.nodes.items() if h not in lost}
        return gather(self.run_id, self.run_dir, pids, others, set(job_pids(self.run_id)))

    def sweep(
        self, lost: list[str], forget: bool | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The run's processes ended here and on the attempt's other nodes (through
        ssh.sh); ``forget``: its secret.env removed too, the job being over, and then on
        every node the run started with, those left out included."""
        forget = self.forget if forget is None else forget
        words = ["end", self.run_id, "2"] + ([self.run_dir] if forget else [])
        nodes = self.pythons if forget else self.nodes
        others = {h: p for h, p in nodes.items() if h not in lost}
        answers = on_nodes(self.run_dir, others, words, SWEEP_TIMEOUT)
        swept: dict[str, Any] = {}
        left: dict[str, Any] = {n: "not checked: the connection to it was lost" for n in lost}
        here = end(self.run_id, 2, self.run_dir if forget else None)
        for name, found in {self.head: here, **answers}.items():
            if not isinstance(found, dict) or "left" not in found:
                left[name] = "could not check: " + str(found)
                continue
            ended = list(found.get("terminated", [])) + list(found.get("killed", []))
            if ended:
                swept[name] = ended
            if found["left"]:
                left[name] = found["left"]
        return swept, left


class HeadRun(Supervised):
    """A detached run's attempts, supervised on its head."""

    side: HeadSide

    def __init__(self, run_dir: str, config: dict[str, Any]) -> None:
        side = HeadSide(run_dir, config)
        limits = Limits(
            timeout=config.get("timeout"),
            hang_timeout=config.get("hang_timeout"),
            rendezvous_timeout=config.get("rendezvous_timeout"),
            max_restarts=int(config.get("max_restarts") or 0),
            restart_delay=float(config.get("restart_delay") or 0.0),
            ppn=config.get("ppn"),
        )
        me = {"host": side.head, "pid": os.getpid(), "start_time": start_time(os.getpid())}
        doc = status_doc(side.run_id, time.time(), True, me, int(config["world"]))
        super().__init__(side, limits, doc)
        self.min_nodes: int | None = config.get("min_nodes")
        self.lines: dict[str, str] = dict(config.get("hostfile_lines") or {})
        self.unreachable: dict[str, str] = {}
        self.answers: dict[str, Any] | None = None  # the last asking, between two attempts

    def run(self, k: int, resume: str | None) -> Outcome:
        self.answers = None
        return super().run(k, resume)

    def _ask(self) -> dict[str, Any]:
        """Every node of the attempt asked for its checkpoints (whether it answers)."""
        answers = on_nodes(self.side.run_dir, self.side.nodes, ["ready", self.side.run_dir],
                           REACH_TIMEOUT)  # fmt: skip
        self.answers = {self.side.head: gather_here(self.side.run_dir), **answers}
        return self.answers

    def newest_checkpoint(self) -> str | None:
        told = []
        for name, answer in self._ask().items():
            if not isinstance(answer, dict):
                continue  # preflight() says why
            try:
                told.append(host_of(name, self.side.run_dir, answer["files"], answer["tail"]))
            except (KeyError, TypeError, ValueError):  # a host that cannot be read has none
                told.append(HostCheckpoints(name, reasons=[f"not read: {answer!r:.200}"]))
        found = choose(told, self.side.run_dir)
        for host, why in found.reasons:
            self.side.say("note", f"  {host}: {why}")
        return found.path

    def preflight(self) -> bool:
        answers = self.answers if self.answers is not None else self._ask()
        silent = {n: str(a) for n, a in answers.items() if not isinstance(a, dict)}
        if not silent:
            return True
        kept = [h for h in self.side.hosts if h not in silent]
        if self.min_nodes is None or len(kept) < self.min_nodes:
            for name, why in silent.items():
                self.unreachable[name] = why
                self.side.say(
                    "error", f"not restarting: {name} did not answer from the head ({why})"
                )
            return False
        for name, why in silent.items():
            self.side.say(
                "warning",
                f"leaving out {name}: did not answer from the head ({why}) "
                f"({len(kept)} node(s) remain, --nodes allows {self.min_nodes})",
            )
        self.side.hosts = kept
        hostfile = "".join(self.lines.get(h, h + "\n") for h in kept)
        write_atomic(os.path.join(self.side.run_dir, "hostfile"), hostfile.encode(), 0o600)
        self.answers = None  # the remaining nodes' checkpoints are asked again
        return True

    def prepare(self, k: int, resume: str | None) -> bool:
        problems: dict[str, str] = {}
        try:
            set_attempt_env(self.side.run_dir, k, resume)
        except (OSError, UnicodeError) as exc:
            problems[self.side.head] = f"env.sh not written: {exc}"
        words = ["attempt", self.side.run_dir, str(k)] + ([resume] if resume else [])
        for name, answer in on_nodes(self.side.run_dir, self.side.nodes, words,
                                     REACH_TIMEOUT).items():  # fmt: skip
            if not isinstance(answer, dict):
                problems[name] = str(answer)
        for name, why in problems.items():
            self._unreachable(name, why)
        if problems:
            return False
        self.side.say("note", f"attempt {k}" + (f" from {resume}" if resume else " from the start"))
        return True

    def _unreachable(self, name: str, why: str) -> None:
        self.unreachable[name] = why
        self.side.say("error", f"not restarting: {name} did not answer from the head ({why})")

    def ended_by(self, outcome: Outcome) -> str:
        if self.unreachable:
            return "unreachable: " + ", ".join(self.unreachable)
        return super().ended_by(outcome)

    def finish(self, outcome: Outcome) -> None:
        if self.limits.max_restarts:  # the last sweep: secret.env off every node now
            _, left = self.side.sweep([], forget=True)
            outcome.left = left or outcome.left
        if self.unreachable:
            self.doc["unreachable"] = self.unreachable
        super().finish(outcome)

    def state_of(self, outcome: Outcome) -> str:
        return "failed" if self.unreachable else super().state_of(outcome)


# ---------------------------------------------------------------- the head, lost


def lost_words(head: str) -> str:
    """How a lost head is named, in a foreground run's words."""
    return (
        f"lost the connection to {head} (no answer to keepalives): ending the job on the "
        "other nodes"
    )


def guard(run_id: str, run_dir: str, head: str, python: str, pid: int) -> dict[str, Any]:
    """Start :func:`watch_head` in a session of its own; answer its pid."""
    log = os.open(os.path.join(run_dir, "guard.log"), _APPEND, 0o600)
    try:
        program = os.path.join(run_dir, "supervisor.py")
        proc = subprocess.Popen(
            [sys.executable, program, "-", "watchhead", run_id, run_dir, head, python, str(pid)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            cwd=run_dir,
            env={**os.environ, MARK: run_id},
            start_new_session=True,
        )
    finally:
        os.close(log)
    return {"pid": proc.pid}


def watch_head(run_id: str, run_dir: str, head: str, python: str, pid: int) -> dict[str, Any]:
    """Hold a session to the head while its supervisor lives; when the session breaks
    after the head said it was up, the head is lost: the job ends on this node."""
    program = os.path.join(run_dir, "supervisor.py")
    remote = [python, program, "-", "alive", run_id, str(pid)]
    proc = subprocess.Popen(
        ["/bin/sh", os.path.join(run_dir, "ssh.sh"), head, shlex.join(remote)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    reached = proc.stdout.readline().decode(errors="replace").strip() == ALIVE
    if reached:
        print(f"watching {head}'s supervisor (pid {pid})", flush=True)
    _, err = proc.communicate()
    if proc.returncode != SSH_FAILED:
        return {"head": "ended"}  # the supervisor ended: so did the run, there
    if not reached:
        why = err.decode(errors="replace").strip()[-300:]
        print(f"cannot watch {head} from here: {why or 'ssh failed'}", flush=True)
        return {"head": "not reached"}
    words = lost_words(head)
    print(words, flush=True)
    record = {"lost": head, "said": words, "time": time.time()}
    folder = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        write_atomic("lost.json", (json.dumps(record) + "\n").encode(), 0o600, dir_fd=folder)
    finally:
        os.close(folder)
    ended = end(run_id, 2, run_dir)
    print(f"ended here: {ended}", flush=True)
    return {"head": "lost"}


def hold(run_dir: str) -> dict[str, Any]:
    """On another node: ALIVE at once, then wait until the head closes the session.

    A head whose link went silent never closes it, and this node's sshd, which sends
    no keepalives of its own, would keep the session forever: so the wait also ends
    once this node's guard wrote lost.json (it found the head lost), and a line every
    HOLD_BEAT seconds makes sshd's TCP give up on a peer that never answers."""
    sys.stdout.write(ALIVE + "\n")
    sys.stdout.flush()
    lost = os.path.join(run_dir, "lost.json")
    beat = time.monotonic() + HOLD_BEAT
    while True:
        ready, _, _ = select.select([sys.stdin.fileno()], [], [], HOLD_POLL)
        if ready and not os.read(sys.stdin.fileno(), 4096):
            return {}
        if os.path.lexists(lost):
            return {"head": "lost"}
        if time.monotonic() >= beat:
            beat = time.monotonic() + HOLD_BEAT
            try:
                sys.stdout.write("\n")
                sys.stdout.flush()
            except OSError:  # the session is gone
                return {}


def alive(run_id: str, pid: int) -> dict[str, Any]:
    """On the head: ALIVE at once, then wait while the supervisor lives."""
    sys.stdout.write(ALIVE + "\n")
    sys.stdout.flush()
    while is_supervisor(pid, run_id):
        time.sleep(1.0)
    return {}


# ---------------------------------------------------------------- the program


def start(run_dir: str) -> dict[str, Any]:
    with open(os.path.join(run_dir, "supervisor.json")) as f:
        run_id = loads(f.read())["run_id"]
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


def watch(run_dir: str) -> dict[str, Any]:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    with open(os.path.join(run_dir, "supervisor.json")) as f:
        config = loads(f.read())
    run = HeadRun(run_dir, config)
    python = config.get("python") or sys.executable
    guards = threading.Thread(target=_start_guards, args=(run.side, python), daemon=True)
    guards.start()  # beside attempt 0's launch, not before it
    try:
        run.supervise()
    finally:
        run.side.release()
    guards.join(REACH_TIMEOUT)
    return {}


def _start_guards(side: HeadSide, python: str) -> None:
    """Every other node's guard of the head (see the module's docstring); a node that
    cannot start one is said in supervisor.log, and the run goes on without it."""
    words = ["guard", side.run_id, side.run_dir, side.head, python, str(os.getpid())]
    for name, answer in on_nodes(side.run_dir, side.pythons, words, REACH_TIMEOUT).items():
        if not isinstance(answer, dict):
            side.say("warning", f"{name} does not guard against the head's loss: {answer}")


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
    elif mode == "ready":
        result = gather_here(args[0])
    elif mode == "attempt":
        result = set_attempt_env(args[0], int(args[1]), args[2] if len(args) > 2 else None)
    elif mode == "stacks":
        ours = set(job_pids(args[0]))
        result = {"stacks": stacks(loads(args[2]), ours, float(args[1]))}
    elif mode == "guard":
        result = guard(args[0], args[1], args[2], args[3], int(args[4]))
    elif mode == "watchhead":
        result = watch_head(args[0], args[1], args[2], args[3], int(args[4]))
    elif mode == "hold":
        result = hold(args[0])
    elif mode == "alive":
        result = alive(args[0], int(args[1]))
    else:
        raise SystemExit(f"unknown mode {mode}")
    sys.stdout.write(json.dumps(result) + "\n")
