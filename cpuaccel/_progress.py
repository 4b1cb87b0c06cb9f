"""The rank side of hang detection: cpuaccel's progress markers (``run --hang-timeout``).

``cpuaccel run --hang-timeout T`` exports CPUACCEL_PROGRESS (the marker interval, in
seconds) to every rank. The worker then announces the script's pid once (``announce``:
the process py-spy dumps on a hang); the runtime's ``ctx.backward`` and ``ctx.log``, and
each optimizer ``ctx.prepare`` saw (after its ``step()``), call ``beat(step)``: a marker
with the step counter at most once an interval, so that a step costs one clock read.
Without the variable (no hang detection asked, or a script run outside cpuaccel)
nothing is written and no hook is added. The lines' form and their parsing:
cpuaccel/node/progress.py; they travel through the labeller's own pipe (_labels.control).

Stdlib only, no torch: the worker imports it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from cpuaccel import _labels
from cpuaccel.node.progress import ENV, marker


class Heartbeat:
    """Rate-limited progress markers of one rank."""

    def __init__(
        self, run_id: str, interval: float, write: Callable[[str], None] = _labels.control
    ) -> None:
        self.run_id = run_id
        self.interval = interval
        self.write = write
        self._next = 0.0  # monotonic time from which the next marker may go

    @classmethod
    def from_environ(cls, env: Mapping[str, str]) -> Heartbeat | None:
        run_id = env.get("CPUACCEL_RUN_ID")
        try:
            interval = float(env.get(ENV, ""))
        except ValueError:
            return None
        return cls(run_id, interval) if run_id and interval > 0 else None

    def beat(self, step: int | None, now: float | None = None) -> bool:
        """A marker with ``step`` if the last one is an interval old; whether one went."""
        now = time.monotonic() if now is None else now
        if now < self._next:
            return False
        self._next = now + self.interval
        self.write(marker(self.run_id, step=step) if step is not None else self._bare())
        return True

    def _bare(self) -> str:
        return marker(self.run_id, pid=os.getpid())

    def announce(self) -> None:
        """The script's pid, once, as it starts: also its first progress."""
        self.write(self._bare())


_UNSET = object()
_beat: Heartbeat | object | None = _UNSET


def heartbeat() -> Heartbeat | None:
    """This process's heartbeat, read from the environment once."""
    global _beat
    if _beat is _UNSET:
        _beat = Heartbeat.from_environ(os.environ)
    return _beat if isinstance(_beat, Heartbeat) else None


def beat(step: int | None) -> None:
    """Progress at ``step`` (the runtime calls it every step; it costs a clock read)."""
    found = _beat if isinstance(_beat, Heartbeat) else heartbeat()
    if found is not None:
        found.beat(step)


def watch_optimizer(optimizer: Any, steps_done: Callable[[], int]) -> None:
    """Beat after each ``optimizer.step()`` too (a script that calls ``loss.backward()``
    itself, not ``ctx.backward``), with its count of steps or the context's, whichever
    is further. No hook at all unless the run asked for hang detection."""
    if heartbeat() is None:
        return
    taken = [0]

    def after_step(*_: Any) -> None:
        taken[0] += 1
        beat(max(taken[0], steps_done()))

    optimizer.register_step_post_hook(after_step)


def announce() -> None:
    """The worker's word as the script starts, when hang detection is on."""
    found = heartbeat()
    if found is not None:
        found.announce()
