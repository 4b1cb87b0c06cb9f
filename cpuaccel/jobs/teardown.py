"""``cpuaccel stop RUN``: end a job on every node, verify nothing is left, record it.

A detached run (run.json's ``detached``) is ended by its supervisor on the head
(cpuaccel/node/supervisor.py): SIGTERM, after checking that the pid is still that run's
supervisor (its environment names the run; never a pattern); it does the teardown and
writes status.json. A foreground run is ended by SIGTERM to the ``cpuaccel run`` that
supervises it (the pid and start time in the controller's status.json), which then
does its own teardown, exactly as when its terminal sends it. Either way, this then
sweeps every node by CPUACCEL_RUN_ID itself (``sweep_hosts``) and reports
what stays; a supervisor that is gone (killed) leaves that sweep to end the job alone.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cpuaccel.connectors import programs
from cpuaccel.connectors.base import Connector
from cpuaccel.connectors.connect_options import ConnectOptions
from cpuaccel.errors import EXIT_NODE_FAILED, HostError, UsageError
from cpuaccel.executor import ConnectionPool, KeptPrograms, Request, Status, call_all
from cpuaccel.history import records
from cpuaccel.history.records import ENDED
from cpuaccel.inventory.host import Host
from cpuaccel.node.supervisor import mark_ended, read_status, start_time, write_status
from cpuaccel.slurm import queue as jobs
from cpuaccel.slurm.queue import JobState

# The supervisor's own teardown: GRACE twice, the launcher's exit, its sweep through ssh.
SUPERVISOR_WAIT = 60.0
# scancel: Slurm's KillWait (30 s by default) between SIGTERM and SIGKILL, the batch
# run's own teardown within it, then the epilog on every node.
SLURM_WAIT = 120.0
# Every wait after the kill ends within this: the launcher's last output, its exit
# status, and each node's sweep (its own 2 s grace plus a node program's start, with room).
# A node that does not answer in time is reported, not waited for.
TEARDOWN = 20.0


# A run id as a node reports it (node/jobprocs.live_runs): a name in the runs folder.
_RUN_ID = re.compile(r"[0-9a-f][0-9a-f-]{0,63}")


def ended_runs(found: Any, runs: Path) -> list[tuple[str, str]]:
    """(run id, state) of the runs a node reported processes of (``found``: run id ->
    processes) that this controller records in ``runs`` as ended; ids that are no run
    folder's name, runs unknown here and running ones left out."""
    if not isinstance(found, dict):
        return []
    ended: list[tuple[str, str]] = []
    for run_id in sorted(found):
        if not isinstance(run_id, str) or _RUN_ID.fullmatch(run_id) is None:
            continue
        folder = runs / run_id
        if not (folder / "run.json").is_file():
            continue
        state = records.load(folder).state()
        if state in ENDED:
            ended.append((run_id, state))
    return ended


def end_leftovers(conn: Connector, found: Any, runs: Path) -> list[str]:
    """End, on the node of ``conn``, the processes of every run the node reported
    (``found``: its fact probe's or its sync look's ``runs``) that this controller
    recorded in ``runs`` as ended: a node lost mid-run keeps its ranks until it is
    reached again. One line for each run ended (the run, its state, the pids); runs
    unknown here, or running, are left alone."""
    said: list[str] = []
    for run_id, state in ended_runs(found, runs):
        answer = programs.call(
            conn, "jobctl", ["end", run_id, "2"],
            what="ending an ended run's processes", timeout=TEARDOWN,
        )  # fmt: skip
        ended = [pid for pid, _ in answer["terminated"] + answer["killed"]]
        left = [pid for pid, _ in answer["left"]]
        line = f"run {run_id} had ended ({state}) but had processes left here"
        line += f"; ended pids {' '.join(map(str, sorted(set(ended))))}" if ended else ""
        line += f"; still running: pids {' '.join(map(str, left))}" if left else ""
        said.append(line)
    return said


def sweep_hosts(
    hosts: list[Host],
    run_id: str,
    run_dir: str,
    pool: ConnectionPool,
    forks: int,
    lost: list[str],
    *,
    timeout: float,
    kept: KeptPrograms | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """End the job's processes on every host not ``lost`` (a host found unreachable is
    added to it): (node -> what was ended, node -> what stays or why it was not checked),
    each node's answer awaited ``timeout`` s at most: a foreground run's own at its end
    (through its ``kept`` programs), and ``stop``'s, which has none."""

    # With the run folder: the node removes secret.env once the job is over.
    words = ["end", run_id, "2", run_dir]
    reachable = [h for h in hosts if h.name not in lost]
    request = Request("jobctl", words, what="ending the job's processes", timeout=timeout)
    results = call_all(reachable, request, forks=forks, pool=pool, kept=kept)
    swept: dict[str, Any] = {}
    left: dict[str, Any] = {name: "not checked: the connection to it was lost" for name in lost}
    for r in results:
        if r.value is None:
            if r.status is Status.UNREACHABLE and r.host.name not in lost:
                lost.append(r.host.name)
            left[r.host.name] = f"could not check: {r.error}"
            continue
        ended = r.value["terminated"] + r.value["killed"]
        if ended:
            swept[r.host.name] = ended
        if r.value["left"]:
            left[r.host.name] = r.value["left"]
    return swept, left


class HeadUnreachable(HostError):
    exit_code = EXIT_NODE_FAILED


@dataclass
class Stopped:
    run_id: str
    state: str  # status.json's state once stopped (or as it had ended before)
    already: bool  # it had ended before: nothing was signalled
    swept: dict[str, Any] = field(default_factory=dict)
    left: dict[str, Any] = field(default_factory=dict)
    slurm: JobState | None = None  # a submitted run's job, as Slurm last said


def find_run(runs: Path, word: str) -> Path:
    """The run folder RUN names: an id, an unambiguous prefix of one, or ``last``."""
    return records.find_run(word, runs)  # one home for RUN, shared with ps, logs, fetch


def read_record(folder: Path) -> dict[str, Any]:
    """run.json, read as ps and logs read it (records.read_json: no link followed, a
    regular file, bounded)."""
    problems: list[str] = []
    record = records.read_json(folder / "run.json", problems)
    if record is None:
        why = problems[0].removeprefix("run.json: ") if problems else "missing"
        raise UsageError(
            f"{folder / 'run.json'}: {why}: not a run record",
            hint="give the id of a run that cpuaccel run recorded (cpuaccel ps lists them)",
        )
    return record


def _wait_ended(read: Any, seconds: float) -> dict[str, Any] | None:
    deadline = time.monotonic() + seconds
    status: dict[str, Any] | None = read()
    while status and status.get("state") == "running" and time.monotonic() < deadline:
        time.sleep(0.3)
        status = read()
    return status


def stop_foreground(folder: Path, record: dict[str, Any]) -> Stopped | None:
    """SIGTERM the `cpuaccel run` that supervises a foreground run; None when it is
    gone (killed): the caller's sweep then ends the job alone."""
    run_id = str(record.get("run_id"))
    status = read_status(str(folder))
    if status is None or status.get("state") != "running":
        state = status.get("state") if status else str(record.get("reason", "unknown"))
        return Stopped(run_id, str(state), already=True)
    sup = status.get("supervisor") or {}
    pid = sup.get("pid")
    if sup.get("host") != socket.gethostname():
        raise UsageError(
            f"run {run_id} is supervised by cpuaccel run on {sup.get('host')} (pid {pid})",
            hint="run cpuaccel stop on that machine, or press Ctrl-C in its terminal",
        )
    if isinstance(pid, int) and start_time(pid) == sup.get("start_time"):
        os.kill(pid, signal.SIGTERM)  # the same pid and start: that cpuaccel run itself
        status = _wait_ended(lambda: read_status(str(folder)), SUPERVISOR_WAIT)
        if status is not None and status.get("state") != "running":
            return Stopped(run_id, str(status["state"]), already=False)
    return None


class _Head:
    """The detached run's supervisor, reached on its head node."""

    def __init__(self, conn: Connector, record: dict[str, Any]) -> None:
        self.conn = conn
        self.run_id = str(record["run_id"])
        self.run_dir = str(record["head_run_dir"])

    def call(self, words: list[str], timeout: float = 60.0) -> dict[str, Any]:
        return programs.call(
            self.conn, "detached", words, what="reaching the run's supervisor", timeout=timeout
        )

    def status(self) -> dict[str, Any] | None:
        found = self.call(["status", self.run_dir]).get("status")
        return found if isinstance(found, dict) else None


def stop_detached(record: dict[str, Any], head: _Head) -> tuple[Stopped | None, dict[str, Any]]:
    """SIGTERM the supervisor and wait for its final status; None when it is gone."""
    status = head.status()
    if status is None:
        raise HeadUnreachable(
            str(record["head"]),
            f"no status.json in {head.run_dir}",
            hint="was the run folder removed?",
        )
    if status.get("state") != "running":
        return Stopped(head.run_id, str(status["state"]), already=True), status
    pid = (status.get("supervisor") or {}).get("pid")
    if isinstance(pid, int):
        words = ["stop", head.run_id, str(pid), str(SUPERVISOR_WAIT)]
        head.call(words, timeout=SUPERVISOR_WAIT + 30)
        ended = _wait_ended(head.status, 10.0)
        if ended is not None and ended.get("state") != "running":
            return Stopped(head.run_id, str(ended["state"]), already=False), ended
    return None, status


def stop(
    folder: Path, record: dict[str, Any], hosts: list[Host], connect: ConnectOptions, forks: int
) -> Stopped:
    """End the run of ``folder`` on ``hosts`` (run.json's, head first), verified."""
    run_id = str(record["run_id"])
    with ConnectionPool(connect) as pool:
        if record.get("detached"):
            try:
                head = _Head(pool.get(hosts[0]), record)
                done, status = stop_detached(record, head)
            except HostError as exc:
                raise HeadUnreachable(exc.host, exc.reason, hint=exc.hint) from None
            run_dir = head.run_dir
        else:
            done, status, run_dir = stop_foreground(folder, record), {}, str(folder)
        lost: list[str] = []
        if done is not None and done.already:
            # Swept all the same: a node lost mid-run keeps the ranks it had, which
            # the run's own sweep could not end; back now, they end here.
            done.swept, done.left = sweep_hosts(
                hosts, run_id, run_dir, pool, forks, lost, timeout=TEARDOWN
            )
            _bring_home(folder, record, status)
            return done
        swept, left = sweep_hosts(hosts, run_id, run_dir, pool, forks, lost, timeout=TEARDOWN)
        if done is None:  # the supervisor was gone: the sweep ended the job; say so
            if record.get("detached"):
                status = head.call(["ended", run_dir, "stopped", "stop"]).get("status") or {}
            else:
                status = mark_ended(run_dir, "stopped", "stop") or {}
            done = Stopped(run_id, str(status.get("state", "stopped")), already=False)
        elif record.get("detached"):
            status = head.status() or status
    done.swept, done.left = swept, left
    _bring_home(folder, record, status)
    return done


def _bring_home(folder: Path, record: dict[str, Any], status: dict[str, Any]) -> None:
    """The head's final status.json, copied to the controller's run folder."""
    if not status or not record.get("detached"):
        return
    if os.path.realpath(folder) != os.path.realpath(str(record["head_run_dir"])):
        write_status(str(folder), status)


def stop_submitted(folder: Path, record: dict[str, Any], job: str) -> Stopped:
    """``scancel`` a submitted run's job, then verify: Slurm says it ended (CANCELLED,
    out of COMPLETING: every process of it ended on every node, the batch run's own
    sweep included), and its status.json no longer says running."""
    run_id = str(record.get("run_id"))
    before = jobs.state(job)
    own = records.load(folder)
    if before is not None and before.ended:
        state = dataclasses.replace(own, slurm=before).state()
        return Stopped(run_id, state, already=True, slurm=before)
    if before is None and own.state() in records.ENDED:  # Slurm has forgotten it since
        return Stopped(run_id, own.state(), already=True)
    jobs.cancel(job)
    after = jobs.wait_ended(job, SLURM_WAIT)
    if after is None or not after.ended:
        said = after.state if after else "not known to Slurm"
        return Stopped(run_id, "running", already=False, left={f"Slurm job {job}": said})
    # The batch run wrote its end within KillWait, or was killed before it could.
    status = _wait_ended(lambda: read_status(str(folder)), 10.0)
    if status is not None and status.get("state") == "running":
        status = mark_ended(str(folder), "stopped", "stop")
    state = dataclasses.replace(records.load(folder), slurm=after).state()
    return Stopped(run_id, state, already=False, slurm=after)
