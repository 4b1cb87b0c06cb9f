"""When a failed job is restarted: the attempts' record and the rule, shared.

Part of cpuaccel's node package (see ``cpuaccel.node``): stdlib only, Python 3.8+. The
foreground loop on the controller (jobs/attempts.py) and a detached run's supervisor on
the head (node/reattempt.py) keep the same record (``attempts.jsonl``: one :class:`Attempt`
a line, ``attempt-<k>/`` copies of its logs, a ``--- attempt k ---`` line in each
top-level rank log) and follow the same rule, :func:`decide`: restart a failure while
restarts remain, except one that repeats identically (same reason, rank, node and exit
code) with no checkpoint before either, which would repeat forever.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

RETRIED = frozenset({"failed", "lost", "hang"})  # the reasons a restart may follow
RESTART_ENV, RESUME_ENV = "CPUACCEL_RESTART", "CPUACCEL_RESUME"
ATTEMPTS = "attempts.jsonl"
MARKER = "--- attempt {} ---"  # where attempt k starts in a top-level rank log


@dataclass
class Attempt:
    """One line of attempts.jsonl (the FT contract's fields)."""

    attempt: int
    started: float
    ended: float
    reason: str
    exit_code: int | None
    rank: int | None
    host: str | None
    hosts: list[str]
    resume: str | None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def why(self) -> str:
        """The failure in words: "exit code 3, rank 1 on node2"."""
        words = [f"exit code {self.exit_code}" if self.reason == "failed" else self.reason]
        if self.rank is not None:
            words.append(f"rank {self.rank} on {self.host}")
        elif self.host is not None:
            words.append(f"node {self.host}")
        return ", ".join(words)


@dataclass(frozen=True)
class Verdict:
    restart: bool
    why: str | None = None  # the one line said when it stops for a reason of its own


def decide(history: Sequence[Attempt], max_restarts: int, resume: str | None) -> Verdict:
    """Restart after the last attempt of ``history``? ``resume``: the checkpoint the next
    attempt would get (None: none complete)."""
    last = history[-1]
    if last.reason not in RETRIED:
        return Verdict(False)
    if len(history) > max_restarts:
        if not max_restarts:
            return Verdict(False)  # restarts were not asked for: nothing to say
        return Verdict(False, f"attempt {last.attempt} failed ({last.why()}): no restart left")
    if len(history) >= 2:
        before = history[-2]
        same = (before.reason, before.rank, before.host, before.exit_code) == (
            last.reason,
            last.rank,
            last.host,
            last.exit_code,
        )
        if same and last.resume is None and resume is None:
            return Verdict(
                False,
                f"attempt {last.attempt} failed as attempt {before.attempt} did "
                f"({last.why()}) before any checkpoint: not restarting it again",
            )
    return Verdict(True)
