"""The master port of a run on this machine alone, picked free as ``torchrun --standalone``
picks it, when no one gave one.

The port is reserved, not probed: a socket bound to port 0 (the kernel's choice of a
free one) and never listened on is kept open for the whole run. While it is bound, the
kernel gives the port to no other ``bind(port 0)`` and to no outgoing connection, so
two runs started at the same moment get two ports; and as it never listens, rank 0's
store (torch's TCPStore, which binds with SO_REUSEADDR as this socket does) can still
listen on it. The port is handed over without a moment in which it is free for
another to take.

A run with a node elsewhere keeps the fixed default: the head's port cannot be held
from here, and the preflight reports it taken, with the fix.
"""

from __future__ import annotations

import dataclasses
import errno
import socket
from collections.abc import Iterator
from contextlib import contextmanager

from cpuaccel.config.settings import DEFAULT, LaunchSettings, Setting
from cpuaccel.errors import CpuaccelError

# Where a picked port's setting says it came from (run.json's settings, `--dry-run`).
PICKED_WHERE = "picked free on this machine"
ATTEMPTS = 20  # ports tried before giving up: each is refused only if something listens


def wants_own_port(settings: LaunchSettings) -> bool:
    """Whether a run picks its own master port: every chosen host is this machine and no
    one gave a port (flag, project file, inventory, -e or MASTER_PORT)."""
    return settings.master_port.source == DEFAULT and all(h.is_local for h in settings.chosen)


def reserve() -> socket.socket:
    """A socket holding a free TCP port of this machine (bound, not listening). A port
    on which something already listens (bound with SO_REUSEADDR by another program
    since the kernel chose it) is let go and another is chosen."""
    for _ in range(ATTEMPTS):
        held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            held.bind(("", 0))
            if _listenable(held.getsockname()[1]):
                return held
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                held.close()
                raise CpuaccelError(f"no free port for the run's rendezvous: {exc}") from exc
        held.close()
    raise CpuaccelError(
        f"no free port for the run's rendezvous in {ATTEMPTS} tries",
        hint="pass --master-port PORT",
    )


def _listenable(port: int) -> bool:
    """Whether rank 0's store could listen on the port now (as port_free tests it)."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("", port))
        probe.listen(1)
        return True
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return False
        raise
    finally:
        probe.close()


@contextmanager
def held_for(settings: LaunchSettings) -> Iterator[LaunchSettings]:
    """The settings the run uses, with a free port of this machine held for the
    ``with`` block when the run picks its own (:func:`wants_own_port`); else as given."""
    if not wants_own_port(settings):
        yield settings
        return
    held = reserve()
    try:
        port = int(held.getsockname()[1])
        picked = Setting("master_port", port, DEFAULT, PICKED_WHERE)
        yield dataclasses.replace(settings, master_port=picked)
    finally:
        held.close()
