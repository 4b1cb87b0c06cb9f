"""A local run folder as the dashboard's JSON (its routes: dashboard/server.py).

Polled every second by each open page, so each poll must cost what changed, not the
run's size: metrics.jsonl is parsed incrementally (``Metrics`` keeps the parsed columns
and the byte offset reached; only new bytes are read; a file that shrank or was
replaced starts again), responses carry at most MAX_POINTS points (every k-th line, the
last always), and each rank's log tail is read from its end (seek, at most TAIL_BYTES)
and reused while the file is unchanged. Only stdlib and cpuaccel's records: the server
(Starlette) is a layer above.
"""

from __future__ import annotations

import math
import os
import stat
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cpuaccel.history.metrics import WARMUP
from cpuaccel.history.records import ENDED, RunRecord, load, row
from cpuaccel.jsonsource import lines as json_lines

MAX_POINTS = 2000  # points per response, whatever the run's length
MAX_TAIL = 50  # log lines per rank a page may ask for
DEFAULT_TAIL = 5
TAIL_BYTES = 8192  # read from the end of each rank log: bounded, whatever its size
LINE_CHARS = 400  # a longer log line is cut (a progress bar without newlines)
COLUMNS = ("step", "loss", "samples_per_s", "sync_share", "lr")
READ_CHUNK = 8 << 20  # new metric bytes read at once
SIGNALLED = ("stopped", "timeout", "interrupted")  # runs whose ranks cpuaccel signalled


def _open_regular(path: Path) -> int | None:
    """A read descriptor on a regular file (no link followed, no FIFO); None if not."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def _finite(value: Any) -> float | None:
    """A JSON number kept as it came (a step stays an int); None for anything else
    (ctx.log writes a NaN loss as the string "nan")."""
    kind = type(value)
    if kind is int or (kind is float and math.isfinite(value)):
        return value  # type: ignore[no-any-return]
    return None


@dataclass
class Metrics:
    """metrics.jsonl parsed so far: one list a column, one entry a line with a step."""

    path: Path
    offset: int = 0  # bytes consumed (whole lines only)
    base: int = 0  # the index of this file's first line (0 until a file is replaced)
    identity: tuple[int, int] = (0, 0)  # (device, inode) of the file parsed
    precision: str | None = None
    columns: dict[str, list[float | None]] = field(
        default_factory=lambda: {name: [] for name in COLUMNS}
    )
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def count(self) -> int:
        return len(self.columns["step"])

    def _reset(self, identity: tuple[int, int]) -> None:
        if self.count or self.offset:
            # Indices go on past the old file's (with a gap): a page whose ``since``
            # came from the old file is below ``base`` and told to start again, even
            # when the new file has more lines than it had.
            self.base += self.count + 1
        self.offset, self.identity, self.precision = 0, identity, None
        self.columns = {name: [] for name in COLUMNS}

    def refresh(self) -> None:
        """Parse the bytes added since the last call (whole lines only)."""
        fd = _open_regular(self.path / "metrics.jsonl")
        if fd is None:
            if self.count or self.offset:
                self._reset((0, 0))  # removed: its points are gone
            return
        try:
            info = os.fstat(fd)
            identity = (info.st_dev, info.st_ino)
            if identity != self.identity or info.st_size < self.offset:
                self._reset(identity)  # replaced or rewritten: start again
            os.lseek(fd, self.offset, os.SEEK_SET)
            while self.offset < info.st_size:
                data = os.read(fd, min(READ_CHUNK, info.st_size - self.offset))
                end = data.rfind(b"\n") + 1
                if not data or end == 0:
                    break  # a line being written: next time
                self._parse(data[:end])
                self.offset += end
                os.lseek(fd, self.offset, os.SEEK_SET)
        finally:
            os.close(fd)

    def _parse(self, data: bytes) -> None:
        """Whole lines, through the bounded JSON reader (one parse for all of them; a
        line that is not one of ctx.log's, or is nested too deep, is left out)."""
        values = json_lines(data)
        lines = [v for v in values if isinstance(v, dict) and _finite(v.get("step")) is not None]
        if self.precision is None:
            self.precision = next(
                (v["precision"] for v in lines if isinstance(v.get("precision"), str)), None
            )
        for name in COLUMNS:
            self.columns[name].extend([_finite(v.get(name)) for v in lines])

    def since(self, start: int) -> dict[str, Any]:
        """The points after index ``start`` (at most MAX_POINTS, the last kept); all of
        this file's, with ``reset``, when ``start`` is not one of its indices."""
        total = self.count
        reset = not self.base <= start <= self.base + total
        first = 0 if reset else start - self.base
        size = total - first
        if size <= MAX_POINTS:
            picked: range | list[int] = range(first, total)
        else:
            step = math.ceil((size - 1) / (MAX_POINTS - 1))
            picked = [*range(first, total - 1, step), total - 1]
        out: dict[str, Any] = {
            "next": self.base + total,
            "reset": reset,
            "decimated": len(picked) < size,
            # The file's first lines that are the warm-up (report's rule): the
            # throughput chart fits its axis without them.
            "warmup": WARMUP,
        }
        for name, values in self.columns.items():
            out[name] = [values[i] for i in picked]
        return out


@dataclass
class _Tail:
    key: tuple[int, int, int]  # inode, size, mtime_ns: the file as last read
    lines: list[str]


def tail_lines(path: Path, count: int, cache: dict[Path, _Tail]) -> tuple[list[str], float | None]:
    """The last ``count`` lines of a log (newest last) and its mtime, read from its end."""
    fd = _open_regular(path)
    if fd is None:
        return [], None
    try:
        info = os.fstat(fd)
        key = (info.st_ino, info.st_size, info.st_mtime_ns)
        known = cache.get(path)
        if known is None or known.key != key or len(known.lines) < count:
            start = max(0, info.st_size - TAIL_BYTES)
            os.lseek(fd, start, os.SEEK_SET)
            data = os.read(fd, info.st_size - start)
            lines = data.decode("utf-8", "replace").splitlines()
            if start > 0 and lines:
                lines = lines[1:]  # cut by the window's start
            known = _Tail(key, [line[:LINE_CHARS] for line in lines[-MAX_TAIL:]])
            cache[path] = known
        return known.lines[-count:] if count else [], info.st_mtime
    finally:
        os.close(fd)


def _rank_state(run: RunRecord, state: str, rank: int) -> tuple[str, int | None]:
    codes = (run.status or {}).get("ranks") or {}
    code = codes.get(str(rank)) if isinstance(codes, dict) else None
    if isinstance(code, int) and not isinstance(code, bool):
        if code == 0:
            return "succeeded", code
        if state in SIGNALLED and (code > 128 or code < 0):
            return state, code  # ended by the stop's (or timeout's) signal, not failed
        return "failed", code
    return ("running" if state == "running" else state), None


class RunView:
    """One run's snapshot state: its metrics parsed so far and its log tails."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.metrics = Metrics(path)
        self.tails: dict[Path, _Tail] = {}
        self.lock = threading.Lock()

    def snapshot(self, since: int = 0, tail: int = DEFAULT_TAIL) -> dict[str, Any]:
        run = load(self.path)
        now = time.time()
        state = run.state()
        ppn = max(1, int(run.record.get("ppn") or 1))
        hosts = run.hosts
        world = run.world or len(hosts) * ppn
        nodes = [
            {"host": host, "ranks": list(range(i * ppn, min((i + 1) * ppn, world)))}
            for i, host in enumerate(hosts)
        ]
        with self.lock:
            self.metrics.refresh()
            metrics = self.metrics.since(since)
            precision = self.metrics.precision
            ranks = []
            for rank in range(world):
                lines, mtime = tail_lines(self.path / f"rank-{rank}.log", tail, self.tails)
                rank_state, code = _rank_state(run, state, rank)
                ranks.append(
                    {
                        "rank": rank,
                        "host": run.rank_host(rank),
                        "state": rank_state,
                        "exit_code": code,
                        "last_output": mtime,
                        "log_tail": lines,
                    }
                )
        return {
            "run": row(run, now),
            "precision": precision,
            "nodes": nodes,
            "ranks": ranks,
            "metrics": metrics,
            "ended": state in ENDED,
            "updated": now,
        }
