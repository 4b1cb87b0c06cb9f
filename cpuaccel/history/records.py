"""The controller's run records: ``runs/<id>/`` with run.json (and status.json).

``cpuaccel report``, ``logs``, ``fetch`` and ``stop`` name a run as ``last``, its
id, a prefix of it that only one run has, or its folder (:func:`find_run`); its state
comes from status.json when there is one (the supervisor's word), else from run.json's
exit code and reason; a foreground run that status.json says is running is "lost" when
the ``cpuaccel run`` supervising it (the pid and start time it recorded) is gone. Only
what is needed is read: run.json, status.json and the tail of metrics.jsonl.
"""

from __future__ import annotations

import os
import socket
import stat
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from cpuaccel.errors import UsageError
from cpuaccel.jsonsource import loads, read_object
from cpuaccel.node.endings import STATES
from cpuaccel.node.supervisor import start_time
from cpuaccel.slurm import queue as jobs
from cpuaccel.slurm.queue import JobState

RUNS = "runs"
TAIL = 8192  # bytes of metrics.jsonl read for the last step
# run.json's reason (node/supervisor.py) as a state of the contract (status.json):
# node/endings.py's, and "stopped" as `cpuaccel stop` records it.
_REASONS = {**STATES, "stopped": "stopped"}
ENDED = tuple(dict.fromkeys(STATES.values()))


def read_json(path: Path, problems: list[str] | None = None) -> dict[str, Any] | None:
    """A JSON object of cpuaccel's own; None when missing, not a regular file, or bad
    (too large, nested too deep, not JSON: being rewritten, as an old cpuaccel may do),
    with the one line that says why appended to ``problems`` when given."""
    return read_object(path, problems if problems is not None else [])


def this_host() -> str:
    return socket.gethostname()


def _alive(supervisor: dict[str, Any]) -> bool:
    """Is the ``cpuaccel run`` that supervises a foreground run still there? The same
    pid and start time (status.json's), on this machine."""
    pid = supervisor.get("pid")
    if supervisor.get("host") != this_host() or not isinstance(pid, int):
        return True  # another machine's: as its status.json says
    return start_time(pid) == supervisor.get("start_time")


@dataclass
class RunRecord:
    run_id: str
    path: Path
    record: dict[str, Any]  # run.json
    status: dict[str, Any] | None  # status.json, when the run folder has one
    # A submitted run (run.json's "slurm"): its job as Slurm says now, when asked.
    slurm: JobState | None = None
    # Why a record was not read, a line each (``status.json: not read: ...``): the run
    # is shown from what could be read, with these lines beside it.
    problems: tuple[str, ...] = ()

    @property
    def job_id(self) -> str | None:
        """The Slurm job of a run that `cpuaccel submit` queued."""
        block = self.record.get("slurm")
        job = block.get("job_id") if isinstance(block, dict) else None
        return job if isinstance(job, str) and job.isdigit() else None

    @property
    def detached(self) -> bool:
        return bool(self.record.get("detached") or (self.status or {}).get("detached"))

    @property
    def hosts(self) -> list[str]:
        return [str(h) for h in self.record.get("hosts") or []]

    def nodes_named(self, name: str) -> list[str]:
        """The run's nodes ``name`` names: its inventory name, else the nodes whose own
        hostname it is (run.json's ``hostnames``: several nodes may be one machine)."""
        if name in self.hosts:
            return [name]
        hostnames = self.record.get("hostnames")
        if not isinstance(hostnames, dict):
            return []
        return [h for h in self.hosts if hostnames.get(h) == name]

    @property
    def head(self) -> str | None:
        head = self.record.get("head") or (self.hosts[0] if self.hosts else None)
        return str(head) if head else None

    @property
    def head_run_dir(self) -> str | None:
        found = self.record.get("head_run_dir")
        return str(found) if found else None

    @property
    def local(self) -> bool:
        """The head's run folder is this one (a run on this machine)."""
        where = self.head_run_dir
        return where is None or Path(where).resolve() == self.path.resolve()

    def state(self) -> str:
        if self.job_id is not None:
            return self._submitted_state()
        return self._own_state()

    def _submitted_state(self) -> str:
        """The run's own word once it has ended; else Slurm's (the batch job killed
        before its `cpuaccel run` wrote an end, or not started yet); "submitted" when
        Slurm was not asked or has forgotten the job."""
        own = self._own_state() if self.status else None
        if own in ENDED:
            return own
        if self.slurm is not None:
            return self.slurm.run_state()
        return own or "submitted"

    def _own_state(self) -> str:
        if self.status and self.status.get("state"):
            state = str(self.status["state"])
            supervisor = self.status.get("supervisor") or {}
            if state == "running" and not self.detached and supervisor:
                # A foreground run is supervised by `cpuaccel run` on the controller.
                return "running" if _alive(supervisor) else "lost"
            return state
        if self.record.get("exit_code") is not None or self.record.get("reason"):
            return _REASONS.get(str(self.record.get("reason")), "failed")
        # A detached run's status is on its head (ps asks it); a foreground run without
        # status.json nor an end in its record lost its `cpuaccel run` (an older one).
        return "running" if self.detached else "lost"

    def exit_code(self) -> int | None:
        code = (self.status or {}).get("exit_code", self.record.get("exit_code"))
        if code is None and self.slurm is not None and self.slurm.ended:
            code = self.slurm.exit_code  # killed before its `cpuaccel run` said
        return code if isinstance(code, int) else None

    def rank_host(self, rank: int) -> str:
        """The node of ``rank``: MPI places ranks by blocks of ppn, head first."""
        ppn = int(self.record.get("ppn") or 1)
        hosts = self.hosts or ["?"]
        return hosts[min(rank // ppn, len(hosts) - 1)]

    @property
    def world(self) -> int:
        return int(self.record.get("world") or 0)


def with_slurm(runs: list[RunRecord], states: Any = jobs.states) -> list[RunRecord]:
    """``runs`` with each submitted run's Slurm state (one squeue, and one sacct for
    the jobs squeue no longer lists). SlurmError when Slurm does not answer."""
    asked = [r.job_id for r in runs if r.job_id is not None]
    if not asked:
        return runs
    found: dict[str, JobState] = states([j for j in asked if j is not None])
    return [replace(r, slurm=found[r.job_id]) if r.job_id in found else r for r in runs]


def runs_folder(base: Path | None = None) -> Path:
    return (base or Path.cwd()) / RUNS


def run_ids(runs: Path | None = None) -> list[str]:
    """The ids of the runs recorded in ``runs`` (default ./runs), oldest first (ids
    begin with their time)."""
    folder = runs or runs_folder()
    try:
        names = os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(n for n in names if os.path.isfile(folder / n / "run.json"))


def known_hostnames(runs: Path | None = None, newest: int = 50) -> dict[str, list[str]]:
    """A node's own hostname -> the inventory names the ``newest`` runs in ``runs``
    (default ./runs) recorded for it (run.json's ``hostnames``), newest run first: how a
    host can be asked for by its hostname before any node is contacted."""
    folder = runs or runs_folder()
    known: dict[str, list[str]] = {}
    for run_id in reversed(run_ids(folder)[-newest:]):
        record = read_json(folder / run_id / "run.json") or {}
        hostnames = record.get("hostnames")
        if not isinstance(hostnames, dict):
            continue
        for name, hostname in hostnames.items():
            if isinstance(name, str) and isinstance(hostname, str) and hostname != name:
                names = known.setdefault(hostname, [])
                if name not in names:
                    names.append(name)
    return known


def find_run(spec: str, runs: Path | None = None) -> Path:
    """The run folder RUN names: ``last`` (the newest in ``runs``, default ./runs), an
    id, a prefix only one run has, or a path to a run folder. Every verb that takes a
    run (report, logs, fetch, stop) reads RUN here."""
    where = runs or runs_folder()
    ids = run_ids(where)
    if spec != "last" and (os.sep in spec or spec in (".", "..") or not ids):
        return _run_path(spec, where)
    if not ids:
        raise UsageError(
            f"no run {spec!r} in {where}: no runs recorded there",
            hint="run cpuaccel from the project folder where cpuaccel run was started",
        )
    if spec == "last":
        return where / ids[-1]
    if spec in ids:
        return where / spec
    found = [i for i in ids if i.startswith(spec)]
    if len(found) == 1:
        return where / found[0]
    if not found:
        if Path(spec).is_dir():
            return Path(spec)
        raise UsageError(
            f"no run {spec!r} in {where}",
            hint=f"give an id from cpuaccel ps, last (the newest: {ids[-1]}), or a run folder",
        )
    shown = ", ".join(found[:10]) + (f" and {len(found) - 10} more" if len(found) > 10 else "")
    raise UsageError(
        f"run {spec!r} is ambiguous: {shown}", hint="give more of the id, or the whole id"
    )


def _run_path(spec: str, where: Path) -> Path:
    """RUN given as a folder (it has a slash, or ./runs has no runs to match)."""
    path = Path(spec).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise UsageError(
            f"{spec}: not a directory",
            hint="give a run folder, runs/<id>/, an id from cpuaccel ps, or last",
        )
    if os.sep in spec:
        raise UsageError(
            f"{spec}: no such run directory",
            hint="give a run folder, runs/<id>/, an id from cpuaccel ps, or last",
        )
    raise UsageError(
        f"no run {spec!r} in {where}: no runs recorded there",
        hint="run cpuaccel from the project folder where cpuaccel run was started, "
        "or give the run's folder",
    )


def load(path: Path) -> RunRecord:
    problems: list[str] = []
    record = read_json(path / "run.json", problems) or {}
    status = read_json(path / "status.json", problems)
    return RunRecord(path.name, path, record, status, problems=tuple(problems))


def last_metrics(path: Path) -> tuple[Any, Any]:
    """(step, loss) of the last whole line of metrics.jsonl; (None, None) without one."""
    try:
        fd = os.open(path / "metrics.jsonl", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None, None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None, None
        os.lseek(fd, max(0, info.st_size - TAIL), os.SEEK_SET)
        tail = os.read(fd, TAIL)
    finally:
        os.close(fd)
    for line in reversed(tail.split(b"\n")):
        try:
            value = loads(line)
        except ValueError:
            continue  # cut by the tail's start, being written, or refused (too deep)
        if isinstance(value, dict) and "step" in value:
            return value.get("step"), value.get("loss")
    return None, None


# ---------------------------------------------------------------- a run as one row
# One recorded run as a row: what ``cpuaccel ps --json`` prints and the dashboard's
# ``/api/runs`` serves (one home, so the two never disagree).
def script_of(record: dict[str, Any]) -> str:
    """The script (or -m module) a run ran: the words after rank.sh in its command (a
    submitted run that has not started yet: the script `cpuaccel submit` was given)."""
    words = [str(w) for w in record.get("command") or []]
    if not words and isinstance(record.get("script"), list) and record["script"]:
        return str(record["script"][0])
    for i, word in enumerate(words):
        if word.endswith("/rank.sh") or word == "rank.sh":
            rest = words[i + 1 :]
            return " ".join(rest[:2] if rest[:1] == ["-m"] else rest[:1]) or "?"
    return "?"


def number(value: Any) -> float | None:
    """``value`` as a float when it is a JSON number (not a bool), else None."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def row(run: RunRecord, now: float) -> dict[str, Any]:
    status, record = run.status or {}, run.record
    state = run.state()
    started = number(status.get("started")) or number(record.get("started"))
    ended = number(status.get("ended"))
    if ended is None and state in ENDED and started is not None:
        seconds = number(record.get("seconds"))
        ended = started + seconds if seconds is not None else number(record.get("updated"))
    step, loss = last_metrics(run.path)
    hosts = run.hosts
    return {
        "id": run.run_id,
        "script": script_of(record),
        "nodes": len(hosts) or int(number(record.get("nodes")) or 0),  # submitted: asked
        "ppn": record.get("ppn"),
        "hosts": hosts,
        "state": state,
        "exit_code": run.exit_code(),
        "detached": run.detached,
        "started": started,
        "ended": ended,
        "seconds": round((ended or now) - started, 1) if started is not None else None,
        "step": step,
        "loss": number(loss),
        "restarts": restarts(record, state, run.status),
        "slurm": slurm_of(run),
        "problems": list(run.problems),
    }


def slurm_of(run: RunRecord) -> dict[str, Any] | None:
    """A submitted run's Slurm job: its id, and its state when Slurm was asked."""
    if run.job_id is None:
        return None
    known = run.slurm
    return {
        "job_id": run.job_id,
        "state": known.state if known else None,
        "exit_code": known.exit_code if known else None,
        "reason": known.reason if known else None,
    }


def restarts(record: dict[str, Any], state: str, status: dict[str, Any] | None = None) -> int:
    """How many times run --max-restarts restarted it: run.json's attempts (a detached
    run's: status.json's, its supervisor's record) are those that ended (a running run
    is in the one after them)."""
    ended = record.get("attempts", (status or {}).get("attempts"))
    count = len(ended) if isinstance(ended, list) else 0
    return count if state == "running" else max(0, count - 1)
