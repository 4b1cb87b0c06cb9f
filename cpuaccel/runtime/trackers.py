"""Trackers: where ``ctx.log`` sends its lines besides metrics.jsonl (TensorBoard).

``cpuaccel.init(trackers=["tensorboard"])`` (or ``CPUACCEL_TRACKERS=tensorboard``) writes
each line's numbers as TensorBoard scalars into ``<run dir>/tensorboard/`` on rank 0, as
Accelerate's ``log_with="tensorboard"`` does, so that ``tensorboard --logdir runs/`` keeps
working for people coming from Accelerate. The names are checked on every rank (an
unknown one, or tensorboard missing, fails every rank alike rather than leaving the
others waiting for rank 0), the writers are made on rank 0 only.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from cpuaccel.rank_settings import TRACKERS_ENV, check, split_names

TENSORBOARD_DIR = "tensorboard"
INSTALL_HINT = "pip install 'cpuaccel[tensorboard]'"
# What metrics.jsonl holds besides the script's values that a scalar chart would not show
# well: the step is the chart's x, the time its wall clock.
NOT_SCALARS = frozenset({"step", "time"})
NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


class Tracker(Protocol):
    def log(self, line: Mapping[str, Any], step: int) -> None: ...

    def close(self) -> None: ...


def choose_trackers(
    trackers: str | Sequence[str] | None, environ: Mapping[str, str]
) -> tuple[str, ...]:
    """The tracker names asked for (argument, else $CPUACCEL_TRACKERS), checked.

    A SettingError names the unknown ones and the supported list; a RuntimeError says how
    to install a supported tracker whose package is missing. "tensorboard",
    "TensorBoard", " tensorboard," all mean the one tracker, once.
    """
    if trackers is None:
        source, text = f"${TRACKERS_ENV}", environ.get(TRACKERS_ENV, "")
    else:
        source = "init(trackers=...)"
        text = trackers if isinstance(trackers, str) else ",".join(trackers)
    check(TRACKERS_ENV, text, source)
    names = tuple(split_names(text))
    if "tensorboard" in names and importlib.util.find_spec("tensorboard") is None:
        raise RuntimeError(
            f"{source} asks for tensorboard, but the tensorboard package is not installed: "
            f"{INSTALL_HINT}"
        )
    return names


def start_trackers(names: Iterable[str], log_dir: Path) -> list[Tracker]:
    """The writers of the chosen trackers (call on rank 0 only)."""
    wanted = set(names)
    return [TensorBoardTracker(log_dir / TENSORBOARD_DIR)] if "tensorboard" in wanted else []


class TensorBoardTracker:
    """Each number of a line as a scalar at its step; strings as text (like Accelerate)."""

    def __init__(self, log_dir: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:  # torch's own message says "requires TensorBoard"
            raise RuntimeError(f"tensorboard cannot be used ({exc}): {INSTALL_HINT}") from None
        self.log_dir = log_dir
        self.writer = SummaryWriter(log_dir=str(log_dir))

    def log(self, line: Mapping[str, Any], step: int) -> None:
        walltime = line.get("time")
        for key, value in line.items():
            if key in NOT_SCALARS:
                continue
            if isinstance(value, str) and value in NON_FINITE:
                value = NON_FINITE[value]  # metrics.jsonl spells a NaN loss "nan"
            if isinstance(value, (int, float)):
                self.writer.add_scalar(key, float(value), global_step=step, walltime=walltime)
            elif isinstance(value, str):
                self.writer.add_text(key, value, global_step=step, walltime=walltime)
        # Flushed each call, as metrics.jsonl is: a killed job keeps what it logged.
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
