"""Synthetic run folders for the dashboard's tests and its load bench.

``make_run(runs, nodes=16, ppn=4, metrics=100_000)`` writes ``runs/<id>/`` as a real
run leaves it (run.json, status.json, rank-R.log, metrics.jsonl in the runtime's line
format: step, loss, lr, time, step_time, samples_per_s, sync_time, sync_share, the
first line also precision and world_size), running or ended. The returned ``FakeRun``
appends metric and log lines (a live run) and ends the run. Lines are formatted by
hand and written in one call: 64 ranks x 100k lines take well under a second.
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cpuaccel.node.supervisor import start_time, status_doc

SAMPLES_PER_STEP = 256


def metric_line(step: int, when: float, first: bool = False, world: int = 1) -> str:
    """One metrics.jsonl line as ``ctx.log`` writes it (values made up, smooth)."""
    loss = 2.5 * math.exp(-step / 20000.0) + 0.1 + 0.05 * math.sin(step / 7.0)
    step_time = 0.05 + 0.005 * math.sin(step / 13.0)
    sync_time = step_time * (0.2 + 0.05 * math.cos(step / 11.0))
    head = f'"precision": "bf16", "world_size": {world}, ' if first else ""
    return (
        f'{{{head}"step": {step}, "loss": {loss:.6f}, "lr": {1e-3 * (1 - step / 1e6):.6g}, '
        f'"time": {when:.3f}, "step_time": {step_time:.6f}, '
        f'"samples_per_s": {SAMPLES_PER_STEP / step_time:.3f}, '
        f'"sync_time": {sync_time:.6f}, "sync_share": {sync_time / step_time:.6f}}}\n'
    )


def _append(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _write_json(path: Path, doc: dict[str, Any]) -> None:
    temp = path.with_name(f".{path.name}.tmp")
    temp.write_text(json.dumps(doc, indent=2) + "\n")
    temp.replace(path)  # readers never see half a file, as with the real writers


@dataclass
class FakeRun:
    path: Path
    run_id: str
    hosts: list[str]
    ppn: int
    steps: int = 0  # metric lines written
    log_lines: int = 0  # lines written to each rank's log

    @property
    def world(self) -> int:
        return len(self.hosts) * self.ppn

    def append_metrics(self, count: int) -> None:
        """``count`` more metric lines (steps continue from the last)."""
        now = time.time()
        lines = [
            metric_line(s, now - (count - i) * 0.05, first=s == 0, world=self.world)
            for i, s in enumerate(range(self.steps, self.steps + count))
        ]
        _append(self.path / "metrics.jsonl", "".join(lines))
        self.steps += count

    def append_logs(self, count: int, ranks: list[int] | None = None) -> None:
        """``count`` more lines in each rank's log (or only ``ranks``')."""
        for rank in range(self.world) if ranks is None else ranks:
            text = "".join(
                f"rank {rank} line {n}: step {self.steps} ok\n"
                for n in range(self.log_lines, self.log_lines + count)
            )
            _append(self.path / f"rank-{rank}.log", text)
        self.log_lines += count

    def status(self) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads((self.path / "status.json").read_text())
        return doc

    def end(self, state: str = "succeeded", codes: dict[int, int | None] | None = None) -> None:
        """The run ended: status.json says ``state``, each rank's code (0 by default
        when succeeded, else ``codes``), and run.json its exit code."""
        doc = self.status()
        default = 0 if state == "succeeded" else None
        ranks = {str(r): (codes or {}).get(r, default) for r in range(self.world)}
        failed = [c for c in ranks.values() if c]
        code = 0 if state == "succeeded" else (failed[0] if failed else 143)
        doc.update(state=state, exit_code=code, ended=time.time(), ranks=ranks, ended_by=state)
        _write_json(self.path / "status.json", doc)
        record = json.loads((self.path / "run.json").read_text())
        record.update(exit_code=code, reason="completed" if state == "succeeded" else state)
        _write_json(self.path / "run.json", record)


def make_run(
    runs: Path,
    run_id: str | None = None,
    *,
    nodes: int = 2,
    ppn: int = 2,
    metrics: int = 100,
    log_lines: int = 20,
    state: str = "running",
    detached: bool = True,
    hosts: list[str] | None = None,
    script: str = "train.py",
) -> FakeRun:
    """A run folder ``runs/<run_id>`` (default: a fresh time-based id). ``hosts``
    defaults to node0, node1, ...; a foreground (not detached) running run names this
    process as its supervisor, so that ps calls it running while the caller lives."""
    started = time.time() - max(metrics, 1) * 0.05
    run_id = (
        run_id or time.strftime("%Y%m%d-%H%M%S-", time.localtime(started)) + os.urandom(3).hex()
    )
    path = runs / run_id
    path.mkdir(parents=True, exist_ok=False)
    names = hosts or [f"node{i}" for i in range(nodes)]
    run = FakeRun(path, run_id, names, ppn)
    record = {
        "run_id": run_id,
        "hosts": names,
        "ppn": ppn,
        "world": run.world,
        "command": ["mpirun", "-n", str(run.world), "/bin/sh", f"{path}/rank.sh", script],
        "started": started,
        "detached": detached,
        "head": names[0],
        "head_run_dir": str(path),
    }
    _write_json(path / "run.json", record)
    pid = os.getpid()
    supervisor = {"host": socket.gethostname(), "pid": pid, "start_time": start_time(pid)}
    status = status_doc(run_id, started, detached, supervisor, run.world)
    _write_json(path / "status.json", status)
    run.append_metrics(metrics)
    run.append_logs(log_lines)
    if state != "running":
        run.end(state)
    return run
