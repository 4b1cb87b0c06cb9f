"""Modules loaded with the cyclic garbage collector paused, their heap then frozen.

A command's start-up allocates tens of thousands of objects that live as long as the
process (classes, functions, dataclasses' generated methods, compiled regexes): the
collections those allocations set off find nothing to free, yet cost a visible part of a
one-node check, whose time is mostly start-up; and the exit's collections would walk
them all again. Frozen, every later collection skips them; finalizers, atexit hooks and
flushes still run at exit.

Only the command's own process freezes (``start_command``, from ``cli.main.main``): a
test that drives the click group in its own process keeps its heap collectable, as a
frozen object left over from one test would never be freed.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

_command = False  # this process is one command, whose heap ends with it


def start_command() -> None:
    """Marks this process as the command's and freezes what is alive (click's modules,
    loaded paused); later pauses freeze what loaded in them."""
    global _command
    _command = True
    gc.freeze()


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Pauses the cyclic GC for the block (if it was on); then, in the command's own
    process, freezes what is alive."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if _command:
            gc.freeze()
        if enabled:
            gc.enable()
