"""Links of one rate for the test cluster: a token bucket on each side of every link.

Namespace nodes on one bridge move bytes at memory speed, so a transfer bench shapes
every link to the rate a real network has. A ``tbf`` qdisc goes on:

- the bridge device, which shapes what the controller sends into the bridge;
- each host-side veth, which shapes that node's downlink;
- ``eth0`` inside each node's namespace (``tc -n NS``, tc's own ``ip -n``), which
  shapes its uplink.

Forwarding between nodes does not pass the bridge's own qdisc, so the result is a star
of equal links through a non-blocking switch: the controller and every node can each
send and receive at the rate at once. Used as a context manager, which removes every
qdisc it set, even when the block raises::

    with Cluster(4, cluster_id=61) as cluster, shaped(cluster, "200mbit"):
        ...
"""

from __future__ import annotations

import re
import shlex
import subprocess
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cpuaccel.testbed.netns import ClusterError, bridge_name, namespace_name, veth_name

if TYPE_CHECKING:
    from cpuaccel.testbed.cluster import Cluster

BURST = "256kb"
LATENCY = "50ms"
_RATE = re.compile(r"(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps|tbps)")
_BITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}
_BITS |= {"bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9, "tbps": 8e12}

Runner = Callable[[Sequence[str]], subprocess.CompletedProcess[str]]


def rate_bits(rate: str) -> float:
    """Bits per second of a tc rate such as ``200mbit`` (ValueError for anything else:
    tc's own units only, so that the rate printed is the rate set)."""
    match = _RATE.fullmatch(rate.strip().lower())
    if match is None or float(match.group(1)) <= 0:
        raise ValueError(f"not a tc rate: {rate!r} (e.g. 200mbit, 1gbit, 25mbps)")
    return float(match.group(1)) * _BITS[match.group(2)]


@dataclass(frozen=True)
class Link:
    """One side of a link: a device, on the host or inside a node's namespace."""

    device: str
    namespace: str | None = None  # None: the host's own

    def _tc(self, *words: str) -> list[str]:
        where = ["-n", self.namespace] if self.namespace else []
        return ["tc", *where, "qdisc", *words, "dev", self.device, "root"]

    def shape_argv(self, rate: str) -> list[str]:
        return [*self._tc("replace"), "tbf", "rate", rate, "burst", BURST, "latency", LATENCY]

    def unshape_argv(self) -> list[str]:
        return self._tc("del")

    def show_argv(self) -> list[str]:
        return self._tc("show")

    def __str__(self) -> str:
        return f"{self.device} in {self.namespace}" if self.namespace else self.device


def links(cluster_id: int, indices: Iterable[int]) -> list[Link]:
    """Every side of the cluster's links: the bridge, each host-side veth, each eth0."""
    found = [Link(bridge_name(cluster_id))]
    for index in indices:
        found += [
            Link(veth_name(cluster_id, index)),
            Link("eth0", namespace_name(cluster_id, index)),
        ]
    return found


def _run(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, check=False, timeout=30)


def shape(targets: Sequence[Link], rate: str, run: Runner = _run) -> None:
    """Set the token bucket on every link (``replace``: a qdisc left by an earlier run
    is overwritten, not an error)."""
    rate_bits(rate)
    for link in targets:
        proc = run(link.shape_argv(rate))
        if proc.returncode != 0:
            argv = shlex.join(link.shape_argv(rate))
            raise ClusterError(f"{argv} failed ({proc.returncode}): {proc.stderr.strip()}")


def unshape(targets: Sequence[Link], run: Runner = _run) -> list[str]:
    """Remove the token bucket from every link; what could not be removed.

    Every link is tried, whatever failed before it. A link whose device is gone (its
    namespace deleted) or that holds no tbf (never shaped) is not a failure.
    """
    left = []
    for link in targets:
        proc = run(link.unshape_argv())
        if proc.returncode == 0:
            continue
        shown = run(link.show_argv())
        if shown.returncode == 0 and " tbf " in f" {shown.stdout} ":
            left.append(f"{link}: {proc.stderr.strip()}")
    return left


@contextmanager
def shaped(cluster: Cluster, rate: str, run: Runner = _run) -> Iterator[list[Link]]:
    """Every link of the running cluster at `rate` within the block; removed after it,
    on error or Ctrl-C too. A qdisc that cannot be removed raises ClusterError, unless
    the block is already raising (its error is the one to see)."""
    targets = links(cluster.cluster_id, [node.index for node in cluster.nodes])
    rate_bits(rate)  # a bad rate is refused before any link changes
    raising = False
    try:
        shape(targets, rate, run)
        yield targets
    except BaseException:
        raising = True
        raise
    finally:
        left = unshape(targets, run)
        if left and not raising:
            raise ClusterError("qdiscs left on the cluster's links: " + "; ".join(left))
