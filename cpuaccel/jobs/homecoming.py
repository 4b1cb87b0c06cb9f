"""Results brought home: a run's files on its head copied into the controller's
``runs/<id>/``, so that ``cpuaccel report runs/<id>`` and ``--resume <id>`` work after
multi-node runs.

What comes home: metrics.jsonl (append-only: only what was added since the copy's
size), the rank logs and status.json when the head supervises the run (detached), and
checkpoints.json, a listing (name, size, mtime) of the checkpoint files, which
themselves come only when asked (``cpuaccel fetch --checkpoints``): written to a
temporary file, size-checked, then renamed into place. Nothing comes when the head's
run folder is the controller's (a run on this machine).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from cpuaccel import ui
from cpuaccel.connectors import programs, runfiles
from cpuaccel.connectors.base import Connector
from cpuaccel.connectors.runfiles import RemoteFile
from cpuaccel.errors import CpuaccelError
from cpuaccel.executor import ConnectionPool
from cpuaccel.inventory.host import Host
from cpuaccel.ui import escape

INTERVAL = 5.0  # seconds between two copies while a run runs
CHECKPOINT_SUFFIXES = (".pt", ".pth", ".ckpt", ".bin", ".safetensors")
LISTING = "checkpoints.json"
APPENDED = ("metrics.jsonl",)  # only ever appended to: copied from the copy's size on
LOGS = ("launcher.log",)  # with rank-R.log: the supervisor's, when it is the head's


def is_checkpoint(name: str) -> bool:
    return name.endswith(CHECKPOINT_SUFFIXES)


def _is_log(name: str) -> bool:
    return "/" not in name and (
        name in LOGS or (name.startswith("rank-") and name.endswith(".log"))
    )


@dataclass
class Fetched:
    """What one pass brought: names and bytes."""

    files: list[str] = field(default_factory=list)
    bytes: int = 0

    def add(self, name: str, count: int) -> None:
        if name not in self.files:
            self.files.append(name)
        self.bytes += count


def _open_home(path: Path, append: bool) -> int:
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.open(path, flags | (os.O_APPEND if append else os.O_TRUNC), 0o600)


class Homecoming:
    """Copies what changed in one run folder on the head into the controller's."""

    def __init__(
        self,
        conn: Callable[[], Connector],
        head_run_dir: str,
        home: Path,
        *,
        supervised_there: bool,
        timeout: float = runfiles.CALL_TIMEOUT,
        kept: Callable[[], programs.Kept | None] = lambda: None,
    ) -> None:
        self.conn = conn
        self.kept = kept  # a foreground run's: the head's kept prelaunch program
        self.head_run_dir = head_run_dir
        self.home = home
        # The head writes the logs and status.json only when it supervises the job;
        # otherwise the controller's own are the run's, never replaced.
        self.supervised_there = supervised_there
        self.timeout = timeout
        # One pass at a time: two appending the same new bytes would double them.
        self.lock = threading.Lock()

    def once(self, checkpoints: bool = False) -> Fetched | None:
        """One pass; None when the head has no such run folder."""
        with self.lock:
            return self._pass(checkpoints)

    def _pass(self, checkpoints: bool) -> Fetched | None:
        listing = runfiles.list_files(self.conn(), self.head_run_dir, self.timeout, self.kept())
        if listing is None:
            return None
        fetched = Fetched()
        for item in listing:
            if item.name in APPENDED or (self.supervised_there and _is_log(item.name)):
                self._append(item, fetched)
            elif self._whole_wanted(item.name, checkpoints):
                self._whole(item, fetched)
        self._listing([i for i in listing if is_checkpoint(i.name)], fetched)
        return fetched

    def _whole_wanted(self, name: str, checkpoints: bool) -> bool:
        if self.supervised_there and name in ("status.json", "attempts.jsonl"):
            return True  # attempts.jsonl: a detached run's restarts (node/detached.py)
        plain = "/" not in name  # directly in the run folder, as every file copied home
        if self.supervised_there and plain and name.startswith("hang-") and name.endswith(".txt"):
            return True  # run --hang-timeout's stack dumps (cpuaccel/node/progress.py)
        return checkpoints and is_checkpoint(name) and plain

    def _append(self, item: RemoteFile, fetched: Fetched) -> None:
        target = self.home / item.name
        have = target.stat().st_size if target.exists() else 0
        if have == item.size:
            return
        if have > item.size:  # rewritten on the head: start again
            target.unlink()
            have = 0
        fd = _open_home(target, append=True)
        try:
            while have < item.size:
                data, new = runfiles.read_new(
                    self.conn(), self.head_run_dir, item.name, have, self.timeout, self.kept()
                )
                if not data or new <= have:
                    break  # nothing new, or rewritten meanwhile (read from its start): next pass
                os.write(fd, data)
                fetched.add(item.name, len(data))
                have = new
        finally:
            os.close(fd)

    def _whole(self, item: RemoteFile, fetched: Fetched) -> None:
        """A file replaced as a whole: when its size or mtime changed, copied to a
        temporary file, checked against the listed size, renamed into place."""
        target = self.home / item.name
        if target.exists():
            mine = target.stat()
            if mine.st_size == item.size and abs(mine.st_mtime - item.mtime) < 1e-3:
                return
        temp = self.home / f".{item.name}.part"
        fd = _open_home(temp, append=False)
        got = 0
        try:
            while True:
                data, new, size = runfiles.read(
                    self.conn(), self.head_run_dir, item.name, got, timeout=self.timeout,
                    kept=self.kept(),
                )  # fmt: skip
                if not data or new != got + len(data):
                    break  # the end, or rewritten meanwhile (read from its start): next time
                os.write(fd, data)
                got = new
                if got > item.size or (size is not None and got >= size):
                    break
        finally:
            os.close(fd)
        if got != item.size:  # changed while read (a checkpoint being saved): next time
            temp.unlink()
            return
        os.utime(temp, (item.mtime, item.mtime))
        temp.replace(target)
        fetched.add(item.name, got)

    def _listing(self, found: list[RemoteFile], fetched: Fetched) -> None:
        rows = [{"name": f.name, "size": f.size, "mtime": f.mtime} for f in found]
        text = json.dumps({"head_run_dir": self.head_run_dir, "checkpoints": rows}, indent=2)
        target = self.home / LISTING
        if target.exists() and target.read_text() == text + "\n":
            return
        temp = self.home / f".{LISTING}.part"
        fd = _open_home(temp, append=False)
        try:
            os.write(fd, (text + "\n").encode())
        finally:
            os.close(fd)
        temp.replace(target)
        fetched.add(LISTING, 0)


class RunPlan(Protocol):
    """What a run's homecoming needs of its plan (jobs/plan.py's ``RunPlan``)."""

    run_id: str
    run_dir: str  # the run's folder on its nodes

    @property
    def head(self) -> Host: ...


class RunDir(Protocol):
    """What it needs of the run's folder here (jobs/rundir.py's ``RunDir``)."""

    path: Path

    def record(self, **fields: Any) -> None: ...


def is_local(plan: RunPlan, run_dir: RunDir) -> bool:
    return plan.head.is_local and Path(plan.run_dir).resolve() == run_dir.path.resolve()


@contextmanager
def brought_home(
    plan: RunPlan,
    run_dir: RunDir,
    pool: ConnectionPool,
    kept: Callable[[], programs.Kept | None] = lambda: None,
) -> Iterator[None]:
    """Around a foreground job's supervision: copy what changed on the head every
    INTERVAL s while it runs, and everything at its end; each call through ``kept``
    (the head's kept prelaunch program) while it lives."""
    if is_local(plan, run_dir):
        yield
        return
    home = Homecoming(
        lambda: pool.get(plan.head), plan.run_dir, run_dir.path, supervised_there=False,
        kept=kept,
    )  # fmt: skip
    stop = threading.Event()

    def periodically() -> None:
        while not stop.wait(INTERVAL):
            if pool.lost([plan.head]):
                return
            try:
                home.once()
            except (CpuaccelError, OSError):
                continue  # the next pass, or the one at the end, tries again

    thread = threading.Thread(target=ui.carried(periodically), name="results-home", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(1.0)  # a pass under way ends within its calls' timeout; not waited for
        _last_pass(plan, run_dir, pool, home)


def _last_pass(plan: RunPlan, run_dir: RunDir, pool: ConnectionPool, home: Homecoming) -> None:
    if pool.lost([plan.head]) or not home.lock.acquire(timeout=runfiles.CALL_TIMEOUT):
        return  # the head is gone, or a pass is stuck on it: cpuaccel fetch later
    try:
        home.lock.release()
        home.once()
    except KeyboardInterrupt:  # a second Ctrl-C: the record of the run must still be kept
        ui.stderr().print(
            f"[yellow]results not brought home[/] (cpuaccel fetch {escape(plan.run_id)} does it)"
        )
    except (CpuaccelError, OSError) as exc:
        ui.stderr().print(
            f"[yellow]could not bring the run's results home from {escape(plan.head.name)}: "
            f"{escape(str(exc))}[/] (cpuaccel fetch {escape(plan.run_id)} tries again)"
        )
    else:
        run_dir.record(fetched=time.time())
