"""The broadcast's rules, in one place: when files go by broadcast rather than in one
direct copy a node, in which order the nodes pass the stream on, and when a node falls
back to the direct path. Every user of the broadcast (sync, run's files, a playbook's
copy and synchronize) and its loop (cpuaccel.connectors.broadcast) ask here.

When: a file of at least FILE_BYTES (``large``) that two nodes or more need, when such
files add up to MIN_BYTES, each counted once (``worth``, ``choose``): below that the
set-up of the node-to-node pipeline costs more than the copies it saves. Only a node
the others reach over ssh takes part (``relays``).

The order: the nodes as given, node i fed by node (i-1)//fanout, the first by the
controller (``feeders``; a fan-out of 1 is a chain).

The fall-back: a node cut out (its relay failed, or it is ``slow``: LAG bytes behind
the node feeding it, or still for SLOW s while that node has bytes for it) has the
nodes it fed served directly by the controller. A node the broadcast failed gets its
files on its user's direct path, with one line saying so (``fall_back``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Protocol

from cpuaccel.inventory.host import Host

CHAIN = 1  # each node passes the stream to one other: the default fan-out
FILE_BYTES = 1 << 20
MIN_BYTES = 16 << 20
# A node is slow when it falls LAG bytes behind the node feeding it (which holds up to
# the relay's WINDOW for it), or takes nothing for SLOW s while that node has bytes for it.
LAG = 48 << 20
SLOW = 10.0


def relays(host: Host) -> bool:
    """Whether the host can take part in a chain (reached over ssh by the other nodes)."""
    return not host.is_local and host.vars.get("ansible_connection") != "slurm"


def large(size: int) -> bool:
    """Whether a file of ``size`` bytes is one a broadcast carries."""
    return size >= FILE_BYTES


def worth(needs: Mapping[str, Collection[str]], sizes: Mapping[str, int]) -> bool:
    """Whether one broadcast pays for ``needs`` (node -> the names it needs), ``sizes``
    giving each name's bytes: two nodes or more need files, adding up (each once) to
    MIN_BYTES."""
    wanting = [names for names in needs.values() if names]
    if len(wanting) < 2:
        return False
    return sum(sizes[name] for name in set().union(*wanting)) >= MIN_BYTES


def choose(
    needs: Mapping[str, Collection[str]], sizes: Mapping[str, int]
) -> dict[str, frozenset[str]]:
    """What goes by broadcast: each node's ``large`` files among those it needs (a name
    without a size is no file to send), nodes that need none left out; nothing when the
    broadcast would not be ``worth`` it."""
    chosen = {
        node: frozenset(name for name in names if name in sizes and large(sizes[name]))
        for node, names in needs.items()
    }
    chosen = {node: names for node, names in chosen.items() if names}
    return chosen if worth(chosen, sizes) else {}


def feeders(chain: Sequence[str], fanout: int = CHAIN) -> dict[str, str]:
    """The node that feeds each node of ``chain`` another node feeds: node i is fed by
    node (i-1)//fanout. The first, and every node when fanout < 1, is fed by the
    controller (not in the answer)."""
    if fanout < 1:
        return {}
    return {name: chain[(i - 1) // fanout] for i, name in enumerate(chain) if i}


def slow(behind: int, still: float) -> bool:
    """Whether a node ``behind`` bytes behind its feeder, its bytes ``still`` for that
    many seconds, is cut out (the nodes it feeds then served directly)."""
    return behind > LAG or (behind > 0 and still > SLOW)


class Outcome(Protocol):
    """A node's outcome of a broadcast, as ``fall_back`` reads it."""

    error: str | None

    @property
    def ok(self) -> bool: ...


def fall_back(done: Mapping[str, Outcome], note: Callable[[str], None], then: str) -> list[str]:
    """The nodes the broadcast failed, in ``done``'s order; those with an error are
    said in one line each, ``then`` naming the direct path its user takes instead."""
    failed = []
    for name, outcome in done.items():
        if not outcome.ok:
            failed.append(name)
            if outcome.error:
                note(f"{name}: the broadcast failed ({outcome.error}): {then}")
    return failed
