"""Gather facts: one round trip per host, the probe (cpuaccel.node.facts) sent on stdin."""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Sequence
from typing import Any

from cpuaccel.connectors import programs
from cpuaccel.connectors.base import Connector
from cpuaccel.errors import HostError
from cpuaccel.inventory.host import Host

Facts = dict[str, Any]
PROBE_TIMEOUT = 60.0


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
    """Run the fact probe (the node program ``facts``) with ``python`` (default: the
    host's ``cpuaccel_python``)."""
    host = conn.host
    words = [host.workdir, host.setvars or "", str(port or ""), *resolve]
    sent = time.time()
    facts = programs.call(
        conn, "facts", words, what="the fact probe", timeout=PROBE_TIMEOUT, python=python
    )
    return settle(facts, sent, time.time())


def settle(facts: Facts, sent: float, received: float) -> Facts:
    """Add ``clock_skew`` (the node's clock minus ours, at the round trip's middle, so
    that network and start-up time do not count) and ``probe_seconds``."""
    facts["clock_skew"] = facts["time"] - (sent + received) / 2
    facts["probe_seconds"] = received - sent
    return facts


def gather_and_look(
    conn: Connector, resolve: Sequence[str], port: int | None, look: Sequence[str]
) -> tuple[Facts, dict[str, Any]]:
    """The fact probe and the ``tree`` program's request ``look`` (its words after the
    mode) in one round trip and one interpreter (the ``prelaunch`` node program):
    (facts, the look's answer)."""
    words = _preflight_words(conn, resolve, port, look, 0)
    sent = time.time()
    found = programs.call(conn, "prelaunch", words, what="the fact probe", timeout=PROBE_TIMEOUT)
    return settle(found["facts"], sent, time.time()), found["look"]


def gather_look_and_keep(
    conn: Connector,
    resolve: Sequence[str],
    port: int | None,
    look: Sequence[str],
    idle: int,
    heartbeat: float | None,
) -> tuple[Facts, dict[str, Any], programs.Kept]:
    """``gather_and_look``, its program kept open after the answer for the run's later
    requests to the node (node/prelaunch.serve), waiting at most ``idle`` s for each
    line, a heartbeat sent every ``heartbeat`` s among them."""
    words = _preflight_words(conn, resolve, port, look, idle)
    sent = time.time()
    found, kept = programs.start(
        conn, "prelaunch", words, what="the fact probe", timeout=PROBE_TIMEOUT,
        heartbeat=heartbeat,
    )  # fmt: skip
    try:
        return settle(found["facts"], sent, time.time()), found["look"], kept
    except (KeyError, TypeError):  # an answer of another form: no program kept for it
        kept.close()
        raise HostError(conn.host.name, "the fact probe's answer was not understood") from None


def _preflight_words(
    conn: Connector, resolve: Sequence[str], port: int | None, look: Sequence[str], idle: int
) -> list[str]:
    host = conn.host
    fact_words = [host.workdir, host.setvars or "", str(port or ""), *resolve]
    return [f"--keep={idle}", *fact_words, "--look", *look]
