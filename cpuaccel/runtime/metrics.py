"""metrics.jsonl: one JSON object per ``ctx.log`` call, written by rank 0.

Besides what the script passes (``step``, ``loss``, ...), each line gets:

- ``time``: Unix time of the call;
- ``step_time``: seconds per training step since the previous call (the interval
  divided by the steps taken in it; with a call every step, the time since the last);
- ``samples_per_s``: when ``samples=`` was passed (samples since the previous call, all
  ranks together) or the context knows ``samples_per_step``;
- ``sync_time``: seconds per step spent in gradient sync in the interval, and
  ``sync_share``, its fraction of the step time (``cpuaccel report`` reads ``sync_time``);
- on the first line a process writes: ``precision`` (``bf16`` or ``fp32``) and
  ``world_size``, which ``cpuaccel report`` puts in its title.

Each line also goes to the trackers asked for (TensorBoard, :mod:`.trackers`).

Each line is appended and flushed at once, so a killed job keeps every line it logged.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cpuaccel.runtime.trackers import Tracker

FILENAME = "metrics.jsonl"


def default_path(run_dir: str | None) -> Path:
    return Path(run_dir or ".") / FILENAME


def plain(value: Any) -> Any:
    """Tensors and numpy scalars as Python numbers, so that json can write them."""
    if hasattr(value, "item") and callable(value.item):
        try:
            return value.item()
        except (ValueError, RuntimeError):  # more than one element
            return value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


class MetricsLog:
    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        enabled: bool,
        header: Mapping[str, Any] | None = None,
        trackers: list[Tracker] | None = None,
    ) -> None:
        self.path = Path(path)
        self.enabled = enabled
        # Said once, on the first line: what the whole run shares (its precision, ...).
        self._header = dict(header or {})
        self.trackers = trackers or []
        self.reset()

    def reset(self, *, steps_done: int = 0, sync_seconds: float = 0.0) -> None:
        """Start a new interval now (at the start of training)."""
        self._since = time.perf_counter()
        self._steps_at = steps_done
        self._sync_at = sync_seconds
        self._last_step: int | None = None

    def record(
        self,
        values: Mapping[str, Any],
        *,
        steps_done: int,
        sync_seconds: float,
        samples: float | None,
        samples_per_step: float | None,
    ) -> dict[str, Any]:
        """The line for this call (written when enabled); starts the next interval.

        ``steps_done`` is the context's count of optimizer steps so far; when the
        script does not go through ``ctx.backward``, the ``step`` values tell.
        """
        now = time.perf_counter()
        elapsed = max(now - self._since, 1e-9)
        steps = steps_done - self._steps_at
        step = values.get("step")
        if steps <= 0:
            last = self._last_step
            steps = step - last if isinstance(step, int) and last is not None else 1
            steps = max(steps, 1)
        synced = max(0.0, sync_seconds - self._sync_at)
        line: dict[str, Any] = {key: plain(value) for key, value in values.items()}
        line["time"] = round(time.time(), 3)
        line["step_time"] = elapsed / steps
        if samples is None and samples_per_step:
            samples = samples_per_step * steps
        if samples is not None:
            line["samples_per_s"] = samples / elapsed
        line["sync_time"] = synced / steps
        line["sync_share"] = min(1.0, synced / elapsed)
        tracked = dict(line)  # the header is for report's title, not a chart of one point
        for key, value in self._header.items():
            line.setdefault(key, value)
        self._header = {}
        if self.enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as out:
                out.write(json.dumps(line) + "\n")
            for tracker in self.trackers:
                tracker.log(tracked, step if isinstance(step, int) else steps_done)
        self._since = now
        self._steps_at = steps_done
        self._sync_at = sync_seconds
        self._last_step = step if isinstance(step, int) else None
        return line

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.close()
        self.trackers = []
