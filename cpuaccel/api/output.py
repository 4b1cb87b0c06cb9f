"""What an API call prints: nothing, unless the caller asks for ``progress``.

The CLI prints as it goes; the same code called from Python runs under ``quiet_unless``,
which sends this call's output (and that of the threads the call starts, which carry
its context: ``ui.carried``) to nowhere, or to the process's stdout and stderr with
``progress=True``. Another thread's call is not affected.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from cpuaccel import ui
from cpuaccel.api.keywords import check_switches


@contextmanager
def quiet_unless(progress: bool) -> Iterator[None]:
    """The block's output: on stdout and stderr when ``progress``, else discarded."""
    check_switches(progress=progress)
    if progress:
        with ui.streams(sys.stdout, sys.stderr):
            yield
        return
    with ui.streams(ui.DISCARD, ui.DISCARD):
        yield
