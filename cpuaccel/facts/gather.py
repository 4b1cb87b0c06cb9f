"""Gather facts: one round trip per host, the probe's source sent on stdin."""

from __future__ import annotations

import functools
import ipaddress
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cpuaccel.connectors.base import Connector
from cpuaccel.errors import HostError
from cpuaccel.inventory.host import Host

Facts = dict[str, Any]
PROBE_TIMEOUT = 60.0


@functools.cache
def probe_source() -> bytes:
    return (Path(__file__).with_name("probe.py")).read_bytes()


def is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def names_to_resolve(host: Host, peers: Sequence[Host]) -> list[str]:
    """The names of the other nodes that this node must resolve for MPI to work."""
    if host.is_local:
        return []
    return [p.name for p in peers if p.name != host.name and not p.is_local and not is_ip(p.name)]


def gather(
    conn: Connector,
    resolve: Sequence[str] = (),
    port: int | None = None,
    python: str | None = None,
) -> Facts:
    """Run the probe with ``python`` (default: the host's ``cpuaccel_python``).

    ``clock_skew`` is the node's clock minus the controller's, taken at the middle of
    the round trip so that network and start-up time do not count as skew.
    """
    host = conn.host
    python = python or host.python
    argv = [python, "-", host.workdir, host.setvars or "", str(port or ""), *resolve]
    sent = time.time()
    result = conn.run(argv, stdin=probe_source(), timeout=PROBE_TIMEOUT)
    received = time.time()
    last = (result.stderr.strip().splitlines() or ["no output"])[-1]
    if result.exit_code in (126, 127):  # the shell's "not found" / "not executable"
        raise HostError(
            host.name,
            f"the interpreter {python!r} cannot be run on the node: {last}",
            hint="set cpuaccel_python to the node's interpreter, or run cpuaccel provision",
        )
    if not result.ok:
        raise HostError(
            host.name,
            f"the fact probe failed with exit code {result.exit_code}: {last}",
            hint=f"check that {python} is Python 3.8 or newer",
        )
    try:
        facts = json.loads(result.stdout)
        if not isinstance(facts, dict):
            raise ValueError("not an object")
    except ValueError:
        raise HostError(
            host.name,
            "the fact probe printed something that is not its report "
            f"(first bytes: {result.stdout[:80]!r})",
            hint="a login script on the node may print text; make it quiet for "
            "non-interactive shells",
        ) from None
    return settle(facts, sent, received)


def settle(facts: Facts, sent: float, received: float) -> Facts:
    """Add ``clock_skew`` (the node's clock minus ours, at the round trip's middle, so
    that network and start-up time do not count) and ``probe_seconds``."""
    facts["clock_skew"] = facts["time"] - (sent + received) / 2
    facts["probe_seconds"] = received - sent
    return facts
