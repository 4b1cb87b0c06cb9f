"""What a trial measured, from its run's metrics.jsonl, and the best of the trials.

The script's own ``ctx.log`` lines give ``samples_per_s``; without it, steps/s from the
lines' ``step_time`` (the runtime's), else from their ``step`` and ``time``. The
warm-up is left out as report leaves it out (:func:`cpuaccel.history.metrics.steady`): the
first line holds the start-up, which is not what a longer run would see.
"""

from __future__ import annotations

import math
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cpuaccel.errors import SourceError
from cpuaccel.history import metrics
from cpuaccel.jsonsource import loads
from cpuaccel.sourcefile import read_source
from cpuaccel.tuning.grid import Trial

METRICS = "metrics.jsonl"
SAMPLES, STEPS = "samples/s", "steps/s"
OK = "ok"


@dataclass(frozen=True)
class Rates:
    samples_per_s: float | None
    steps_per_s: float | None


@dataclass
class Row:
    """One trial as the table shows it."""

    trial: Trial
    status: str = "skipped"  # ok, failed, timeout, preflight, no metrics, interrupted, ...
    reason: str | None = None
    rates: Rates | None = None
    run_id: str | None = None
    folder: str | None = None
    seconds: float = 0.0
    value: float | None = None  # in the table's unit (set by rank_rows)
    ratio: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "ppn": self.trial.ppn,
            "threads": self.trial.threads,
            "allocator": self.trial.allocator,
            "value": self.value,
            "ratio": self.ratio,
            "status": self.status,
            "reason": self.reason,
            "samples_per_s": self.rates.samples_per_s if self.rates else None,
            "steps_per_s": self.rates.steps_per_s if self.rates else None,
            "run_id": self.run_id,
            "folder": self.folder,
            "seconds": round(self.seconds, 3),
        }


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return number if math.isfinite(number) and number > 0 else None


def _records(text: str) -> list[dict[str, Any]]:
    found = []
    for line in text.splitlines():
        try:
            record = loads(line)
        except ValueError:
            continue  # cut by the trial's end, the script's own odd line, or too deep
        if isinstance(record, dict):
            found.append(record)
    return found


def read_rates(folder: str | os.PathLike[str]) -> Rates | None:
    """The trial's throughput; None when its metrics.jsonl holds no usable line."""
    path = Path(folder) / METRICS
    if not os.path.lexists(path):
        return None
    try:
        text = read_source(path, SourceError, "metrics file", "", limit=None)
    except SourceError:
        return None
    records = _records(text)
    steady, _ = metrics.steady(records)
    samples = [v for v in (_finite(r.get("samples_per_s")) for r in steady) if v]
    times = [v for v in (_finite(r.get("step_time")) for r in steady) if v]
    steps = 1 / statistics.median(times) if times else _span_rate(steady)
    if not samples and steps is None:
        return None
    return Rates(statistics.median(samples) if samples else None, steps)


def _span_rate(records: list[dict[str, Any]]) -> float | None:
    """Steps/s from the first and last lines' ``step`` and ``time``."""
    points = [(_finite(r.get("step")), _finite(r.get("time"))) for r in records]
    usable = [(s, t) for s, t in points if s is not None and t is not None]
    if len(usable) < 2 or usable[-1][1] <= usable[0][1]:
        return None
    return (usable[-1][0] - usable[0][0]) / (usable[-1][1] - usable[0][1]) or None


@dataclass
class Ranking:
    unit: str
    best: Row | None
    rows: list[Row] = field(default_factory=list)


def rank_rows(rows: list[Row]) -> Ranking:
    """The table's unit (samples/s when every measured trial logged it, else steps/s),
    each row's value and ratio to the best; the best is the first of the fastest."""
    measured = [r for r in rows if r.status == OK and r.rates is not None]
    unit = SAMPLES
    if any(r.rates and r.rates.samples_per_s is None for r in measured):
        unit = STEPS
    for row in rows:
        rates = row.rates
        row.value = None
        if row.status == OK and rates is not None:
            row.value = rates.samples_per_s if unit == SAMPLES else rates.steps_per_s
    valued = [r for r in rows if r.value is not None]
    best = max(valued, key=lambda r: r.value or 0.0, default=None)
    for row in rows:
        if best is not None and best.value and row.value is not None:
            row.ratio = row.value / best.value
    return Ranking(unit, best, rows)
