"""Terminal output: colour only on a TTY (NO_COLOR honoured), progress on stderr, and
the one verbosity level (-v, -vv, -vvv) every verb shares."""

from __future__ import annotations

import contextvars
import io
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, ParamSpec, TextIO, TypeVar

from cpuaccel.visible import visible

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress

# rich is imported where it is first used, not with this module: its import is most of
# a one-node `check`'s start-up, which check spends while its probes are out.


def escape(markup: str) -> str:
    """rich's ``escape``: user text (a host name, a path, a message, a rank's line)
    printed as given, never read as markup, nor as a terminal's control: every control
    character but the newline and the tab is shown as its code (cpuaccel.visible)."""
    from rich.markup import escape as rich_escape

    return rich_escape(visible(markup))


def _maybe_terminal(stream: Any) -> bool:
    """False only where rich's Console.is_terminal is False for sure (no TTY, and
    neither TTY_COMPATIBLE=1 nor FORCE_COLOR set): decided without importing rich."""
    if os.environ.get("TTY_COMPATIBLE") == "1" or "FORCE_COLOR" in os.environ:
        return True
    try:
        return bool(getattr(stream, "isatty", lambda: False)())
    except ValueError:  # a closed stream
        return False


def _color_allowed(stream: Any) -> bool:
    if os.environ.get("NO_COLOR"):
        return False
    return bool(getattr(stream, "isatty", lambda: False)())


def _console(stream: Any) -> Console:
    from rich.console import Console

    colour = _color_allowed(stream)
    return Console(
        file=stream,
        # No styles at all off a terminal or under NO_COLOR (bold is an escape code too).
        color_system="auto" if colour else None,
        # highlight=False: rich would otherwise colour numbers and paths in plain output.
        highlight=False,
        # emoji=False: a value such as `1:x:` or a host `a:smile:b` is printed as given,
        # not turned into a picture (escape() guards markup, not emoji codes).
        emoji=False,
        soft_wrap=True,
        # In a Jupyter kernel rich would show its output as the cell's display data,
        # whatever the stream: the stream chosen (ui.streams: none at all) holds.
        force_jupyter=False,
        # Piped output is read by scripts and people's pagers: never truncate a table.
        width=None if getattr(stream, "isatty", lambda: False)() else 250,
    )


# -v: each host's result and time (and its connection); -vv: also every command sent to
# a host (as commandline.shell_line renders it, environment values hidden) with its exit
# code and time; -vvv: also paramiko's debug log. Set once by the shared options.
VERBOSITY_HELP = (
    "More detail on stderr (repeatable): -v each host's result and time, -vv also every "
    "command sent to a host, -vvv also the SSH library's debug log. Secret values are "
    "never shown."
)
verbosity = 0


def set_verbosity(level: int) -> None:
    global verbosity
    verbosity = level
    if level >= 3:
        import logging  # -vvv's alone: logging's import would slow every command's start-up

        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        for name in ("paramiko", "cpuaccel"):
            logger = logging.getLogger(name)
            logger.setLevel(logging.DEBUG)
            if not logger.handlers:
                logger.addHandler(handler)


def detail(level: int, host: str, text: str) -> None:
    """One line about ``host`` on stderr when -v was given ``level`` times (plain text:
    escaped here, so names and commands are never read as markup)."""
    if verbosity >= level:
        stderr().print(f"[dim]{escape(host)}: {escape(text)}[/]")


# ---------------------------------------------------------------- where output goes
# The process's stdout and stderr, unless the caller's context says otherwise: the
# Python API (cpuaccel/api/) runs each call with its own streams (``streams``), silent
# unless asked, so that two calls in two threads never print into each other. Threads
# the controller starts for a call carry the call's context (``carried``).
P = ParamSpec("P")
R = TypeVar("R")


class _Discard(io.TextIOBase):
    """A text stream that keeps nothing (the API's default: no output)."""

    def write(self, text: str) -> int:
        return len(text)

    def isatty(self) -> bool:
        return False


DISCARD: TextIO = _Discard()  # type: ignore[assignment]
_streams: contextvars.ContextVar[tuple[TextIO, TextIO] | None] = contextvars.ContextVar(
    "cpuaccel_streams", default=None
)


def out_stream() -> TextIO:
    given = _streams.get()
    return sys.stdout if given is None else given[0]


def err_stream() -> TextIO:
    given = _streams.get()
    return sys.stderr if given is None else given[1]


@contextmanager
def streams(out: TextIO, err: TextIO) -> Iterator[None]:
    """Output of this context (and the threads it carries into) goes to ``out`` and
    ``err`` instead of the process's stdout and stderr."""
    token = _streams.set((out, err))
    try:
        yield
    finally:
        _streams.reset(token)


def carried(func: Callable[P, R]) -> Callable[P, R]:
    """``func`` to be run in another thread with this context's output streams: a copy
    of the context is taken now, one a call (a context is entered by one thread at a
    time)."""
    context = contextvars.copy_context()
    return lambda *args, **kwargs: context.run(func, *args, **kwargs)


def stdout() -> Console:
    return _console(out_stream())


def stderr() -> Console:
    return _console(err_stream())


def print_json(data: Any) -> None:
    out = out_stream()
    out.write(json.dumps(data, indent=2, sort_keys=False, default=str))
    out.write("\n")


class Tracker:
    """Counts finished hosts; draws a bar on a terminal, stays silent otherwise."""

    def __init__(self, progress: Progress | None, task: Any) -> None:
        self._progress = progress
        self._task = task

    def advance(self, label: str = "") -> None:
        if self._progress is not None:
            self._progress.update(self._task, advance=1, detail=label)

    def transfer(self, description: str) -> Callable[[int, int], None]:
        """A second bar for bytes on their way: called with (bytes so far, of total), it
        shows the share, the bytes and their rate, as rsync's --info=progress2 does."""
        progress = self._progress
        if progress is None:
            return lambda done, total: None
        task = progress.add_task(description, total=100, detail="")
        start = time.monotonic()

        def moved(done: int, total: int) -> None:
            seconds = max(time.monotonic() - start, 1e-3)
            rate = done / seconds / 2**20
            detail = f"{done / 2**20:,.0f}/{total / 2**20:,.0f} MiB  {rate:,.1f} MiB/s"
            share = 100 * done // total if total else 100
            progress.update(task, completed=share, detail=detail)

        return moved


@contextmanager
def progress(description: str, total: int) -> Iterator[Tracker]:
    # -v's lines instead of a bar; and no bar, nor rich, off a terminal.
    if verbosity > 0 or not _maybe_terminal(err_stream()) or not stderr().is_terminal:
        yield Tracker(None, None)
        return
    console = stderr()
    # Imported only to draw a bar (rich is slow to import): scripts, benches and -v never
    # need it.
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    # markup=False: the description ("TASK [name]") and the detail (a host name) are
    # user text, which rich would otherwise read as markup and eat.
    bar = Progress(
        TextColumn("{task.description}", markup=False),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[detail]}", markup=False),
        console=console,
        transient=True,
    )
    with bar:
        task = bar.add_task(description, total=total, detail="")
        yield Tracker(bar, task)
