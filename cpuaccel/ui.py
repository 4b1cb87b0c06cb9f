"""Terminal output: colour only on a TTY (NO_COLOR honoured), progress on stderr."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


def _color_allowed(stream: Any) -> bool:
    if os.environ.get("NO_COLOR"):
        return False
    return bool(getattr(stream, "isatty", lambda: False)())


def _console(stream: Any) -> Console:
    colour = _color_allowed(stream)
    return Console(
        file=stream,
        # No styles at all off a terminal or under NO_COLOR (bold is an escape code too).
        color_system="auto" if colour else None,
        # highlight=False: rich would otherwise colour numbers and paths in plain output.
        highlight=False,
        soft_wrap=True,
        # Piped output is read by scripts and people's pagers: never truncate a table.
        width=None if stream.isatty() else 250,
    )


def stdout() -> Console:
    return _console(sys.stdout)


def stderr() -> Console:
    return _console(sys.stderr)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str))
    sys.stdout.write("\n")


class Tracker:
    """Counts finished hosts; draws a bar on a terminal, stays silent otherwise."""

    def __init__(self, progress: Progress | None, task: Any) -> None:
        self._progress = progress
        self._task = task

    def advance(self, label: str = "") -> None:
        if self._progress is not None:
            self._progress.update(self._task, advance=1, detail=label)


@contextmanager
def progress(description: str, total: int) -> Iterator[Tracker]:
    console = stderr()
    if not console.is_terminal:
        yield Tracker(None, None)
        return
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[detail]}"),
        console=console,
        transient=True,
    )
    with bar:
        task = bar.add_task(description, total=total, detail="")
        yield Tracker(bar, task)
