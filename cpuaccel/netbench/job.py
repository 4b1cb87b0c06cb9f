"""The rank side of ``cpuaccel bench net``: ``python -m cpuaccel.worker -m
cpuaccel.netbench.job ARGS``, one rank on each node.

Every rank joins a gloo group (the worker set RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT), says which host, address and interface it is and the interface's speed
as the kernel knows it, then:

1. every pair of nodes plays ping-pong with send/recv, in rounds where each node is in
   one pair at a time (the circle method), the rest waiting at a barrier: a small
   message for the latency and a large one for the bandwidth, each the median half
   round trip, as the Intel MPI Benchmarks' PingPong reports it;
2. allreduce (a sum of float32) at each size of the sweep with gloo, then with MPI
   through mpi4py when every rank has it and an MPI launcher started the job: the
   median time of an iteration on each rank. The sum is checked once at the first size.

Rank 0 writes what was measured, raw seconds by rank, as ``net.json`` in the run
folder; the controller (``cpuaccel.netbench.results``) computes the rates. torch and
mpi4py are imported in the functions that use them: the pure parts (rounds, sizes,
iterations) import with the standard library alone.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import fcntl
import functools
import json
import os
import socket
import statistics
import struct
import sys
import time
from array import array
from collections.abc import Callable, Sequence
from typing import Any

RESULT = "net.json"
VERSION = 1
LATENCY_BYTES = 8
WARMUP = 2  # iterations left out of each measure
MIN_ITERS = 3
BUDGET = 512 * 1024 * 1024  # bytes one size may move in its iterations, at most
# Variables an MPI launcher sets in each rank (Intel MPI/MPICH, Open MPI, PMIx).
MPI_RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")
SIOCGIFADDR = 0x8915  # Linux: an interface's IPv4 address


def rounds(count: int) -> list[list[tuple[int, int]]]:
    """Every pair of ``count`` nodes once, in rounds where each node is in one pair at
    most (the circle method: node 0 stays, the others turn; an odd count adds a bye)."""
    nodes: list[int | None] = list(range(count))
    if count % 2:
        nodes.append(None)
    size = len(nodes)
    out = []
    for _ in range(size - 1):
        pairs = []
        for i in range(size // 2):
            a, b = nodes[i], nodes[size - 1 - i]
            if a is not None and b is not None:
                pairs.append((min(a, b), max(a, b)))
        out.append(sorted(pairs))
        nodes = [nodes[0], nodes[-1], *nodes[1:-1]]
    return out


def sweep_sizes(max_size: int, min_size: int = 8) -> list[int]:
    """``min_size`` x 4^k bytes up to ``max_size``, and ``max_size`` itself (whole
    float32s) when the powers of 4 miss it."""
    sizes = []
    size = min_size
    while size <= max_size:
        sizes.append(size)
        size *= 4
    last = max_size - max_size % 4
    if last >= min_size and (not sizes or sizes[-1] != last):
        sizes.append(last)
    return sizes


def iterations(size: int, wanted: int) -> int:
    """The timed iterations at ``size`` bytes: ``wanted``, fewer for large messages (at
    most BUDGET bytes moved), never fewer than MIN_ITERS."""
    return max(MIN_ITERS, min(wanted, BUDGET // max(1, size)))


def launched_by_mpi(env: dict[str, str] | os._Environ[str]) -> bool:
    return any(name in env for name in MPI_RANK_VARS)


# ---------------------------------------------------------------- this node


def local_address(peer: str) -> str:
    """The address this node sends from towards ``peer`` (no packet leaves: a UDP
    socket's connect only picks the route)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((peer, 9))
            return str(s.getsockname()[0])
    except OSError:
        return ""


def interface_of(address: str) -> str | None:
    """The interface holding the IPv4 ``address``, or None."""
    if not address:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(
                    s.fileno(), SIOCGIFADDR, struct.pack("256s", name[:15].encode())
                )
            except OSError:
                continue
            if socket.inet_ntoa(packed[20:24]) == address:
                return name
    return None


def interface_speed(name: str | None, root: str = "/sys/class/net") -> int | None:
    """The interface's speed in Mbit/s as the kernel reports it; None where it does not
    know (missing, -1, or an error, as for lo or a virtual device)."""
    if not name:
        return None
    try:
        with open(os.path.join(root, name, "speed")) as f:
            speed = int(f.read().strip())
    except (OSError, ValueError):
        return None
    return speed if speed > 0 else None


def describe_node() -> dict[str, Any]:
    chosen = os.environ.get("GLOO_SOCKET_IFNAME", "").split(",")[0] or None
    address = local_address(os.environ.get("MASTER_ADDR", "127.0.0.1"))
    interface = chosen or interface_of(address)
    return {
        "host": socket.gethostname(),
        "address": address,
        "interface": interface,
        "speed_mbit": interface_speed(interface),
    }


# ---------------------------------------------------------------- the measures


def timed(step: Callable[[], object], count: int) -> list[float]:
    """Seconds of each of ``count`` calls of ``step``, after WARMUP untimed ones."""
    times = []
    for i in range(WARMUP + count):
        start = time.perf_counter()
        step()
        if i >= WARMUP:
            times.append(time.perf_counter() - start)
    return times


def ping_pong(dist: Any, torch: Any, peer: int, first: bool, size: int, count: int) -> float:
    """The median half round trip of ``size`` bytes with ``peer`` (as the initiator)."""
    buf = torch.zeros(size, dtype=torch.uint8)

    def there_and_back() -> None:
        if first:
            dist.send(buf, peer)
            dist.recv(buf, peer)
        else:
            dist.recv(buf, peer)
            dist.send(buf, peer)

    return statistics.median(timed(there_and_back, count)) / 2


def pairs(dist: Any, torch: Any, rank: int, world: int, options: argparse.Namespace) -> list[Any]:
    """This rank's pairs as initiator: [a, b, latency seconds, bandwidth seconds]."""
    mine = []
    for pairing in rounds(world):
        for a, b in pairing:
            if rank in (a, b):
                peer, first = (b, True) if rank == a else (a, False)
                lat = ping_pong(dist, torch, peer, first, LATENCY_BYTES, options.iters)
                big = iterations(options.pair_size, options.iters)
                bw = ping_pong(dist, torch, peer, first, options.pair_size, big)
                if first:
                    mine.append([a, b, lat, bw])
        dist.barrier()  # the next round's pairs start together
    return mine


def gloo_sweep(dist: Any, torch: Any, world: int, sizes: Sequence[int], iters: int) -> list[float]:
    """The median seconds of one allreduce at each size, on this rank."""
    check = torch.full((sizes[0] // 4,), float(dist.get_rank() + 1))
    dist.all_reduce(check)
    if not bool((check == world * (world + 1) / 2).all()):
        raise RuntimeError(f"gloo allreduce summed wrong: {check.tolist()[:4]}")
    out = []
    for size in sizes:
        buf = torch.zeros(size // 4, dtype=torch.float32)  # a sum of zeros stays zeros
        step = functools.partial(dist.all_reduce, buf)
        out.append(statistics.median(timed(step, iterations(size, iters))))
    return out


def mpi_sweep(comm: Any, op: Any, sizes: Sequence[int], iters: int) -> list[float]:
    world, rank = comm.Get_size(), comm.Get_rank()
    check, got = array("f", [rank + 1.0] * (sizes[0] // 4)), array("f", bytes(sizes[0]))
    comm.Allreduce(check, got, op=op)
    if any(v != world * (world + 1) / 2 for v in got):
        raise RuntimeError(f"MPI allreduce summed wrong: {list(got)[:4]}")
    out = []
    for size in sizes:
        send, recv = array("f", bytes(size)), array("f", bytes(size))
        comm.Barrier()
        step = functools.partial(comm.Allreduce, send, recv, op=op)
        out.append(statistics.median(timed(step, iterations(size, iters))))
    return out


def mpi_state() -> tuple[Any, str | None]:
    """(mpi4py's MPI module, None) when MPI can be used here, else (None, why not)."""
    if not launched_by_mpi(os.environ):
        return None, "the job was not started by an MPI launcher"
    try:
        from mpi4py import MPI
    except ImportError as exc:
        return None, f"mpi4py does not import ({exc})"
    except Exception as exc:  # MPI's own start failed (a library missing, ...)
        return None, f"mpi4py failed to start MPI ({type(exc).__name__}: {exc})"
    return MPI, None


def measure(options: argparse.Namespace) -> dict[str, Any] | None:
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    timeout = datetime.timedelta(seconds=options.timeout)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timeout)
    try:
        nodes: list[Any] = [None] * world
        dist.all_gather_object(nodes, describe_node())
        measured = pairs(dist, torch, rank, world, options)
        found: list[Any] = [None] * world
        dist.all_gather_object(found, measured)
        sizes = sweep_sizes(options.max_size)
        sweeps: dict[str, Any] = {}
        if "gloo" in options.backends:
            sweeps["gloo"] = gloo_sweep(dist, torch, world, sizes, options.iters)
        mpi, why = (None, "not asked for") if "mpi" not in options.backends else mpi_state()
        reasons: list[Any] = [None] * world
        dist.all_gather_object(reasons, why)
        why = next((f"{nodes[r]['host']}: {w}" for r, w in enumerate(reasons) if w), None)
        if mpi is not None and why is None and mpi.COMM_WORLD.Get_size() != world:
            why = f"MPI's world is {mpi.COMM_WORLD.Get_size()} ranks, gloo's {world}"
        if "mpi" in options.backends:
            if why is None and mpi is not None:
                sweeps["mpi"] = mpi_sweep(mpi.COMM_WORLD, mpi.SUM, sizes, options.iters)
            else:
                sweeps["mpi"] = why
        timings: list[Any] = [None] * world
        dist.all_gather_object(timings, sweeps)
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
    if rank != 0:
        return None
    allreduce: dict[str, Any] = {}
    for backend in options.backends:
        first = timings[0].get(backend)
        if isinstance(first, str):
            allreduce[backend] = {"skipped": first}
        elif first is not None:
            allreduce[backend] = {"seconds": [t[backend] for t in timings]}
    return {
        "version": VERSION,
        "world": world,
        "nodes": nodes,
        "latency_bytes": LATENCY_BYTES,
        "pair_bytes": options.pair_size,
        "pairs": [p for ranks in found for p in ranks],
        "sizes": sizes,
        "allreduce": allreduce,
    }


def write(run_dir: str, result: dict[str, Any]) -> None:
    """``net.json`` whole or not at all: written under a hidden name and renamed."""
    hidden = os.path.join(run_dir, f".{RESULT}.{os.getpid()}")
    with open(hidden, "w") as f:
        json.dump(result, f, indent=1)
    os.replace(hidden, os.path.join(run_dir, RESULT))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cpuaccel.netbench.job")
    p.add_argument("--max-size", type=int, required=True)
    p.add_argument("--pair-size", type=int, required=True)
    p.add_argument("--iters", type=int, required=True)
    p.add_argument("--timeout", type=float, required=True)
    p.add_argument("--backends", type=lambda t: t.split(","), required=True)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    options = parser().parse_args(argv)
    run_dir = os.environ.get("CPUACCEL_RUN_DIR")
    if not run_dir:
        print("cpuaccel.netbench.job: CPUACCEL_RUN_DIR is not set", file=sys.stderr)
        return 2
    result = measure(options)
    if result is not None:
        write(run_dir, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
