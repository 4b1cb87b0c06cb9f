"""One-line notes from the runtime, written to stderr by rank 0 only."""

from __future__ import annotations

import sys

PREFIX = "cpuaccel: "


def note(message: str, *, rank: int, enabled: bool = True) -> None:
    """Print ``cpuaccel: MESSAGE`` on rank 0 (the launcher labels it with the rank)."""
    if enabled and rank == 0:
        print(f"{PREFIX}{message}", file=sys.stderr, flush=True)
