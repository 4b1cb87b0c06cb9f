"""A run folder's metrics.jsonl and record, read for ``cpuaccel report``.

``read_metrics`` parses metrics.jsonl column by column (each bad line named with its
file and line); ``read_run_info`` takes what the title needs from ``run.json`` and
``status.json`` when they are there (nodes × ppn, wall time) and the metrics' first line
(precision); ``summarize`` is the summary ``report`` prints and gives as ``--json``.
"""

from __future__ import annotations

import collections
import itertools
import json
import math
import os
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from cpuaccel.errors import CpuaccelError, SourceError, UsageError
from cpuaccel.jsonsource import describe, loads
from cpuaccel.sourcefile import read_source

METRICS = "metrics.jsonl"
T = TypeVar("T")
# What the runtime (or a script of one's own) may call the seconds spent in gradient sync.
SYNC_KEYS = ("sync_time", "grad_sync_seconds")
# The learning rate, under Accelerate's/transformers' and PyTorch's usual names.
LR_KEYS = ("lr", "learning_rate")

Point = tuple[float, float]  # (step, value)
# The warm-up: a run's first metrics line holds its start-up (imports, the first step's
# allocations), which a longer run does not see. Throughput medians (report's, tune's)
# leave it out when there are more lines, and the dashboard's chart fits its axis
# without it.
WARMUP = 1


def steady(values: Sequence[T]) -> tuple[list[T], int]:
    """``values`` without the warm-up (when more than it remain), and how many were left
    out."""
    left_out = WARMUP if len(values) > WARMUP else 0
    return list(values[left_out:]), left_out


class Metrics:
    """The records of one metrics.jsonl, column by column.

    A plain class, not a dataclass: dataclasses cost start-up time, and report is a verb.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.steps: list[float] = []
        self.loss: list[float] = []
        self.samples_per_s: list[Point] = []
        self.lr: list[Point] = []
        self.sync_share: list[Point] = []  # logged, or sync time / step time
        self.times: list[float | None] = []  # each line's "time" (epoch), for the restarts
        self.step_time: list[float] = []
        self.sync_of_timed_steps: list[float] = []  # of the steps whose both are known
        self.time_of_synced_steps: list[float] = []
        self.precision: str | None = None  # the runtime's first line says it
        self.world_size: int | None = None
        self.skipped_partial_last_line = False


class RunInfo:
    """What run.json and status.json say about the run (None: not known)."""

    def __init__(self) -> None:
        self.hosts: list[str] | None = None
        self.ppn: int | None = None
        self.world: int | None = None
        self.wall_seconds: float | None = None
        self.state: str | None = None
        self.warnings: list[str] = []
        self.restarts: list[tuple[int, float]] = []  # (attempt, the step it resumed from)
        # The first failing rank and its root cause (torch's @record), when it failed.
        self.failure: dict[str, Any] | None = None


def _number(record: dict[str, Any], key: str, where: str) -> float | None:
    """record[key] as a float; None when absent or null; UsageError when not a number."""
    value = record.get(key)
    if value is None:
        return None
    if isinstance(value, str) and value in ("nan", "inf", "-inf"):
        return float(value)  # how the runtime writes a loss that went NaN
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UsageError(f'{where}: "{key}" is {json.dumps(value)}, not a number')
    return float(value)


def read_metrics(run_dir: Path) -> Metrics:
    """Parse RUN_DIR/metrics.jsonl; an error naming the file (and line) when it is bad."""
    if not run_dir.exists():
        raise UsageError(f"{run_dir}: no such run directory", hint="pass a folder like runs/<id>")
    if not run_dir.is_dir():
        raise UsageError(
            f"{run_dir}: not a directory", hint="pass the run directory that holds metrics.jsonl"
        )
    path = run_dir / METRICS
    if not os.path.lexists(path):
        raise UsageError(
            f"{path}: no such file; this run logged no metrics",
            hint='the training script appends {"step": ..., "loss": ...} lines to '
            "$CPUACCEL_RUN_DIR/metrics.jsonl on rank 0",
        )
    # Unbounded: it grows with the run. A FIFO or device there is refused, not read.
    text = read_source(path, SourceError, "metrics file", "pass a run's folder", limit=None)
    metrics = Metrics(path)
    lines = text.split("\n")
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = loads(line)
        except ValueError as exc:
            bad = isinstance(exc, json.JSONDecodeError)  # else refused: too deep
            if bad and number == len(lines) and not text.endswith("\n"):
                # The last line of a job killed while writing it: keep the rest.
                metrics.skipped_partial_last_line = True
                continue
            why = f"not valid JSON ({exc.msg})" if isinstance(exc, json.JSONDecodeError) else exc
            raise UsageError(
                f"{path}:{number}: {why}", hint="remove or fix that line of the metrics file"
            ) from None
        if not isinstance(record, dict):
            raise UsageError(f"{path}:{number}: expected a JSON object, got {line.strip()[:60]}")
        _add(metrics, record, f"{path}:{number}")
    if not metrics.steps:
        raise UsageError(f"{path}: holds no metrics (no line with a record)")
    return metrics


def _first_number(record: dict[str, Any], keys: tuple[str, ...], where: str) -> float | None:
    values = (_number(record, key, where) for key in keys)
    return next((value for value in values if value is not None), None)


def _add(metrics: Metrics, record: dict[str, Any], where: str) -> None:
    step, loss = _number(record, "step", where), _number(record, "loss", where)
    if step is None or loss is None:
        raise UsageError(f'{where}: no "{"step" if step is None else "loss"}" in this record')
    rate = _number(record, "samples_per_s", where)
    seconds = _number(record, "step_time", where)
    sync = _first_number(record, SYNC_KEYS, where)
    share = _number(record, "sync_share", where)
    lr = _first_number(record, LR_KEYS, where)
    metrics.steps.append(step)
    metrics.loss.append(loss)
    metrics.times.append(_number(record, "time", where))
    if rate is not None:
        metrics.samples_per_s.append((step, rate))
    if lr is not None:
        metrics.lr.append((step, lr))
    if seconds is not None:
        metrics.step_time.append(seconds)
        if sync is not None:
            metrics.sync_of_timed_steps.append(sync)
            metrics.time_of_synced_steps.append(seconds)
            if share is None and seconds > 0:
                share = min(1.0, sync / seconds)
    if share is not None:
        metrics.sync_share.append((step, share))
    if isinstance(record.get("precision"), str):
        metrics.precision = record["precision"]
    world = record.get("world_size")
    if isinstance(world, int) and not isinstance(world, bool):
        metrics.world_size = world


def steps_trained(steps: list[float]) -> float:
    """How many steps the metrics span, whatever the logging interval.

    The interval is the most common gap between logged steps. Lines from step 1 (or from
    within the first interval) count from the start: 10, 20 ... 100 are 100 steps, not 10
    lines, and 1, 5, 10 ... 30 are 30. Otherwise (from step 0, or a resumed run) the span
    plus one interval: 0 ... 99 are 100 steps, 510 ... 1000 by tens are 500.
    """
    distinct = sorted(set(steps))
    if len(distinct) == 1:
        return max(distinct[0], 1.0)
    gaps = collections.Counter(b - a for a, b in itertools.pairwise(distinct))
    most = max(gaps.values())
    interval = min(gap for gap, count in gaps.items() if count == most)
    first, last = distinct[0], distinct[-1]
    if 1 <= first <= interval:
        return last
    return last - first + interval


def read_run_info(run_dir: Path) -> RunInfo:
    """run.json's nodes × ppn and status.json's (else run.json's) wall time, when present."""
    info = RunInfo()
    record = _json_object(run_dir / "run.json", info)
    status = _json_object(run_dir / "status.json", info)
    hosts = record.get("hosts")
    if isinstance(hosts, list) and all(isinstance(h, str) for h in hosts) and hosts:
        info.hosts = hosts
    info.ppn = _positive_int(record.get("ppn"))
    info.world = _positive_int(record.get("world"))
    started, ended = status.get("started"), status.get("ended")
    state = status.get("state")
    info.state = state if isinstance(state, str) else None
    if isinstance(started, (int, float)) and isinstance(ended, (int, float)):
        info.wall_seconds = max(0.0, float(ended) - float(started))
    elif _is_number(record.get("seconds")):
        info.wall_seconds = float(record["seconds"])
    elif info.state == "running" and isinstance(started, (int, float)):
        info.wall_seconds = max(0.0, time.time() - float(started))  # so far
    attempts = status.get("attempts")
    last = attempts[-1] if isinstance(attempts, list) and attempts else None
    info.failure = _failure(record.get("first_failure")) or _failure(last)
    return info


CAUSE_SHOWN = 500  # characters of a root cause shown: one line


def _failure(found: Any) -> dict[str, Any] | None:
    """The failing rank of run.json's first_failure (or a detached run's last attempt
    in status.json), checked: a node wrote it. None when there is none with a cause."""
    if not isinstance(found, dict):
        return None
    rank, host, cause = found.get("rank"), found.get("host"), found.get("cause")
    code = found.get("code", found.get("exit_code"))
    if not (isinstance(rank, int) and isinstance(cause, str) and cause.strip()):
        return None
    printable = " ".join("".join(c if c.isprintable() else " " for c in cause).split())
    return {
        "rank": rank,
        "host": host if isinstance(host, str) and host.isprintable() else None,
        "exit_code": code if isinstance(code, int) else None,
        "cause": printable[:CAUSE_SHOWN],
    }


def read_restarts(run_dir: Path, metrics: Metrics, info: RunInfo) -> None:
    """info.restarts from attempts.jsonl (run --max-restarts): each attempt after the
    first, at the step of the checkpoint it resumed from (checkpoints.jsonl, when this
    folder has it), else at the first step it logged (metrics' "time" after its start)."""
    steps = {}
    for record in _json_lines(run_dir / "checkpoints.jsonl", info):
        if isinstance(record.get("path"), str) and _is_number(record.get("step")):
            steps[record["path"]] = float(record["step"])
    for record in _json_lines(run_dir / "attempts.jsonl", info):
        attempt, started = record.get("attempt"), record.get("started")
        if not (isinstance(attempt, int) and attempt > 0 and isinstance(started, (int, float))):
            continue
        begun = float(started)
        step = steps.get(str(record.get("resume")))
        if step is None:
            timed = zip(metrics.times, metrics.steps, strict=True)
            step = next((s for t, s in timed if t is not None and t >= begun), None)
        if step is not None:
            info.restarts.append((attempt, step))


def _json_lines(path: Path, info: RunInfo) -> list[dict[str, Any]]:
    """The objects of a JSON-lines file of the run; [] when absent; bad lines left out."""
    if not os.path.lexists(path):
        return []
    try:
        text = read_source(path, SourceError, "run record", "rerun the job", limit=None)
    except CpuaccelError as exc:
        info.warnings.append(f"{path}: left out, not readable ({exc})")
        return []
    found = []
    for line in text.splitlines():
        try:
            record = loads(line)
        except ValueError:
            continue  # cut short by a job killed while writing it, or refused (too deep)
        if isinstance(record, dict):
            found.append(record)
    return found


def _json_object(path: Path, info: RunInfo) -> dict[str, Any]:
    """The object in PATH; {} when absent, with a warning when unreadable or not one."""
    if not os.path.lexists(path):
        return {}
    try:
        data = loads(read_source(path, SourceError, "run record", "rerun the job"))
    except CpuaccelError as exc:
        info.warnings.append(f"{path}: left out, not readable JSON ({exc})")
        return {}
    except ValueError as exc:
        info.warnings.append(f"{path}: left out, {describe(exc)}")
        return {}
    if not isinstance(data, dict):
        info.warnings.append(f"{path}: left out, not a JSON object")
        return {}
    return data


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _int_if_whole(value: float) -> float | int:
    return int(value) if value.is_integer() else value


def summarize(metrics: Metrics, info: RunInfo, png: Path) -> dict[str, Any]:
    pairs = zip(metrics.steps, metrics.loss, strict=True)
    finite = [(loss, step) for step, loss in pairs if math.isfinite(loss)]
    best = min(finite) if finite else (math.nan, math.nan)
    rates, warmup = steady([rate for _, rate in metrics.samples_per_s])
    step_times, step_warmup = steady(metrics.step_time)
    synced_time = sum(metrics.time_of_synced_steps)
    return {
        "run_dir": str(metrics.path.parent),
        "metrics": str(metrics.path),
        "png": str(png),
        "steps": _int_if_whole(steps_trained(metrics.steps)),
        "lines": len(metrics.steps),
        "first_step": _int_if_whole(metrics.steps[0]),
        "last_step": _int_if_whole(metrics.steps[-1]),
        "loss_first": metrics.loss[0],
        "loss_last": metrics.loss[-1],
        "loss_min": best[0] if finite else None,
        "loss_min_step": _int_if_whole(best[1]) if finite else None,
        # Medians of the steady steps: the warm-up (the first line) left out.
        "samples_per_s_median": statistics.median(rates) if rates else None,
        "samples_per_s_warmup": warmup,
        "step_time_median": statistics.median(step_times) if step_times else None,
        "step_time_warmup": step_warmup,
        "sync_share": sum(metrics.sync_of_timed_steps) / synced_time if synced_time > 0 else None,
        "lr_first": metrics.lr[0][1] if metrics.lr else None,
        "lr_last": metrics.lr[-1][1] if metrics.lr else None,
        "nodes": len(info.hosts) if info.hosts else None,
        "ppn": info.ppn,
        "world": info.world or metrics.world_size,
        "precision": metrics.precision,
        "wall_seconds": info.wall_seconds,
        "state": info.state,
        "skipped_partial_last_line": metrics.skipped_partial_last_line,
        # the first failing rank's root cause (torch's @record): only when there is one
        **({"root_cause": info.failure} if info.failure else {}),
        # run --max-restarts: only when the run was restarted (attempts.jsonl)
        **(
            {"restarts": [{"attempt": a, "step": _int_if_whole(s)} for a, s in info.restarts]}
            if info.restarts
            else {}
        ),
    }
