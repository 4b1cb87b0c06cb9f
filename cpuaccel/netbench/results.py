"""What ``cpuaccel bench net`` measured, read from the head's ``net.json`` and turned
into rates.

The ranks report seconds (``cpuaccel.netbench.job``); here they become:

- per pair of nodes: the latency (the median half round trip of a small message) and
  the bandwidth (bytes / the median half round trip of a large one), as the Intel MPI
  Benchmarks' PingPong reports them; the rate in Gbit/s against the slower end's
  interface speed, where the kernel knows it;
- per backend and size: the allreduce's time (the mean over the ranks of each rank's
  median iteration, as nccl-tests averages its ranks), its algorithm bandwidth
  (bytes / time) and its bus bandwidth (algbw x 2(n-1)/n for n ranks, nccl-tests'
  busbw: what each rank's link carried, comparable with the link's rate).

The file comes from a node: every value is checked where it is read (types, finite
positive numbers, ranks and sizes in range), and a bad one is one NetbenchError line
naming it.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from cpuaccel.errors import EXIT_NODE_FAILED, CpuaccelError

VERSION = 1
GB = 1e9  # bytes: GB/s as nccl-tests and the Intel MPI Benchmarks print them (decimal)
MAX_WORLD = 100_000
MAX_BYTES = 1 << 40
MAX_SECONDS = 86_400.0
BACKENDS = ("gloo", "mpi")
_HINT = "the file is written by cpuaccel.netbench.job: run the bench again, or check the node"


class NetbenchError(CpuaccelError):
    exit_code = EXIT_NODE_FAILED


def _bad(what: str, value: Any) -> NetbenchError:
    return NetbenchError(f"net.json: {what} is {value!r:.80}", hint=_HINT)


def _number(value: Any, what: str, high: float = MAX_SECONDS) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(what, value)
    number = float(value)
    if not (math.isfinite(number) and 0 < number <= high):
        raise _bad(what, value)
    return number


def _whole(value: Any, what: str, low: int, high: int) -> int:
    if type(value) is not int or not low <= value <= high:
        raise _bad(what, value)
    return value


def _text(value: Any, what: str, limit: int = 255) -> str:
    if not isinstance(value, str) or len(value) > limit or not value.isprintable():
        raise _bad(what, value)
    return value


def _list(value: Any, what: str, length: int | None = None) -> list[Any]:
    if not isinstance(value, list) or (length is not None and len(value) != length):
        raise _bad(what, value)
    return value


# ---------------------------------------------------------------- the rates


def algbw(size: int, seconds: float) -> float:
    """Algorithm bandwidth in GB/s: the message's bytes over the operation's time."""
    return size / seconds / GB


def busbw(size: int, seconds: float, ranks: int) -> float:
    """Bus bandwidth of an allreduce in GB/s, as nccl-tests defines it: algbw x
    2(n-1)/n, the bytes each rank sends and receives in a ring allreduce over its time."""
    return algbw(size, seconds) * 2 * (ranks - 1) / ranks


def link_share(bandwidth_gbs: float, speed_mbit: int | None) -> float | None:
    """The measured rate as a share of the interface's speed (Mbit/s); None unknown."""
    if not speed_mbit:
        return None
    return bandwidth_gbs * GB * 8 / (speed_mbit * 1e6)


@dataclass(frozen=True)
class Node:
    rank: int
    host: str
    address: str
    interface: str | None
    speed_mbit: int | None


@dataclass(frozen=True)
class Pair:
    a: Node
    b: Node
    latency_s: float
    bandwidth_s: float  # the half round trip of pair_bytes
    pair_bytes: int

    @property
    def bandwidth(self) -> float:
        """GB/s, one way."""
        return self.pair_bytes / self.bandwidth_s / GB

    @property
    def speed_mbit(self) -> int | None:
        """The slower end's interface speed, when both ends know theirs."""
        speeds = [self.a.speed_mbit, self.b.speed_mbit]
        return min(speeds) if all(speeds) else None  # type: ignore[type-var]

    @property
    def share(self) -> float | None:
        return link_share(self.bandwidth, self.speed_mbit)

    def label(self) -> str:
        return f"{self.a.host} - {self.b.host}"

    def to_json(self) -> dict[str, Any]:
        return {
            "a": self.a.host,
            "b": self.b.host,
            "latency_us": self.latency_s * 1e6,
            "bandwidth_gbs": self.bandwidth,
            "gbit_s": self.bandwidth * 8,
            "interface_mbit": self.speed_mbit,
            "of_interface": self.share,
        }


@dataclass(frozen=True)
class Point:
    """One size of an allreduce sweep."""

    size: int
    seconds: float  # the mean over the ranks of each one's median
    ranks: int

    @property
    def algbw(self) -> float:
        return algbw(self.size, self.seconds)

    @property
    def busbw(self) -> float:
        return busbw(self.size, self.seconds, self.ranks)

    def to_json(self) -> dict[str, Any]:
        return {
            "bytes": self.size,
            "time_us": self.seconds * 1e6,
            "algbw_gbs": self.algbw,
            "busbw_gbs": self.busbw,
        }


@dataclass
class Sweep:
    backend: str
    points: list[Point] = field(default_factory=list)
    skipped: str | None = None  # why the backend was not measured

    def to_json(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "skipped": self.skipped,
            "points": [p.to_json() for p in self.points],
        }


@dataclass
class NetReport:
    nodes: list[Node]
    pairs: list[Pair]
    sweeps: list[Sweep]
    latency_bytes: int
    pair_bytes: int

    @property
    def slowest(self) -> Pair | None:
        """The pair of the least bandwidth (the first of equals)."""
        return min(self.pairs, key=lambda p: p.bandwidth, default=None)

    def to_json(self) -> dict[str, Any]:
        slowest = self.slowest
        return {
            "nodes": [n.__dict__ for n in self.nodes],
            "latency_bytes": self.latency_bytes,
            "pair_bytes": self.pair_bytes,
            "pairs": [p.to_json() for p in self.pairs],
            "slowest": slowest.to_json() if slowest else None,
            "allreduce": [s.to_json() for s in self.sweeps],
        }


# ---------------------------------------------------------------- reading net.json


def _node(rank: int, raw: Any) -> Node:
    where = f"nodes[{rank}]"
    if not isinstance(raw, dict):
        raise _bad(where, raw)
    interface = raw.get("interface")
    speed = raw.get("speed_mbit")
    return Node(
        rank,
        _text(raw.get("host"), f"{where}.host"),
        _text(raw.get("address"), f"{where}.address") if raw.get("address") else "",
        _text(interface, f"{where}.interface", 15) if interface is not None else None,
        _whole(speed, f"{where}.speed_mbit", 1, 10**9) if speed is not None else None,
    )


def _pairs(raw: Any, nodes: list[Node], pair_bytes: int) -> list[Pair]:
    world = len(nodes)
    found: dict[tuple[int, int], Pair] = {}
    for i, item in enumerate(_list(raw, "pairs")):
        where = f"pairs[{i}]"
        a, b, latency, bandwidth = _list(item, where, 4)
        a = _whole(a, f"{where}'s first rank", 0, world - 1)
        b = _whole(b, f"{where}'s second rank", a + 1, world - 1)
        if (a, b) in found:
            raise _bad(f"{where} (a second measure of ranks {a} and {b})", item)
        pair = Pair(
            nodes[a],
            nodes[b],
            _number(latency, f"{where}'s latency"),
            _number(bandwidth, f"{where}'s bandwidth time"),
            pair_bytes,
        )
        found[(a, b)] = pair
    missing = [(a, b) for a in range(world) for b in range(a + 1, world) if (a, b) not in found]
    if missing:
        raise _bad("the pairs measured", f"no ranks {missing[0][0]} and {missing[0][1]}")
    return [found[key] for key in sorted(found)]


def _sweep(backend: str, raw: Any, sizes: list[int], world: int) -> Sweep:
    where = f"allreduce.{backend}"
    if not isinstance(raw, dict):
        raise _bad(where, raw)
    if "skipped" in raw:
        return Sweep(backend, skipped=_text(raw["skipped"], f"{where}.skipped", 1000))
    ranks = _list(raw.get("seconds"), f"{where}.seconds", world)
    medians = []
    for r, row in enumerate(ranks):
        cells = _list(row, f"{where}.seconds[{r}]", len(sizes))
        medians.append([_number(t, f"{where}.seconds[{r}][{i}]") for i, t in enumerate(cells)])
    points = [
        Point(size, statistics.fmean(m[i] for m in medians), world) for i, size in enumerate(sizes)
    ]
    return Sweep(backend, points)


def parse(data: Any) -> NetReport:
    """The report of ``net.json``'s content (already read as JSON)."""
    if not isinstance(data, dict):
        raise _bad("its content", data)
    if data.get("version") != VERSION:
        raise NetbenchError(
            f"net.json: version {data.get('version')!r:.20}, not {VERSION}",
            hint="the nodes' cpuaccel differs from this one's: install the same version",
        )
    world = _whole(data.get("world"), "world", 2, MAX_WORLD)
    raw_nodes = _list(data.get("nodes"), "nodes", world)
    nodes = [_node(rank, raw) for rank, raw in enumerate(raw_nodes)]
    latency_bytes = _whole(data.get("latency_bytes"), "latency_bytes", 1, MAX_BYTES)
    pair_bytes = _whole(data.get("pair_bytes"), "pair_bytes", 1, MAX_BYTES)
    sizes = [
        _whole(s, f"sizes[{i}]", 4, MAX_BYTES)
        for i, s in enumerate(_list(data.get("sizes"), "sizes"))
    ]
    if not sizes or sizes != sorted(set(sizes)):
        raise _bad("sizes", sizes)
    allreduce = data.get("allreduce")
    if not isinstance(allreduce, dict) or any(k not in BACKENDS for k in allreduce):
        raise _bad("allreduce", allreduce)
    sweeps = [_sweep(b, allreduce[b], sizes, world) for b in BACKENDS if b in allreduce]
    pairs = _pairs(data.get("pairs"), nodes, pair_bytes)
    return NetReport(nodes, pairs, sweeps, latency_bytes, pair_bytes)
