"""Gradient averaging for DDP: through MPI (mpi4py) or through the process group, timed.

When the job was started by an MPI launcher, the MPI library that started it is right
there, and its collectives (Intel MPI's shared-memory and tuned network paths) are
several times faster than gloo's on CPUs. :func:`mpi_hook` is a DDP communication hook
that averages each gradient bucket in place through MPI; it returns a future that is
already complete. :func:`pg_hook` does the same through the torch process group. Both
record the time spent in gradient sync in a :class:`SyncTimer`, for the metrics.

How a bucket is summed (``grad_reduce``, $CPUACCEL_GRAD_REDUCE):

- ``ordered`` (the default): every element is summed in rank order,
  ``((g0 + g1) + g2) + ...``, whatever the bucket layout, the message size or the
  library's algorithm. Each rank owns a shard of the bucket: an all-to-all brings it
  every rank's copy of its shard, it adds them in rank order, and an all-gather hands
  the sums back. Both collectives only move data, so the library's choice of algorithm
  for them cannot change a bit of the result; they move as much data as a ring
  allreduce. This is what makes a resumed run exact: DDP lays out its buckets in one
  order for an attempt's first backward and rebuilds them in gradient-ready order after
  it, so a parameter sits at another offset of the bucket in a resumed attempt's first
  step than in the uninterrupted run's same step, and the allreduce algorithms that cut
  a buffer into segments (ring, reduce-scatter based; Intel MPI picks them on Intel
  CPUs, gloo and the other MPIs for large buffers) sum each segment starting from
  another rank. With one or two ranks a sum has only one order (``a + b == b + a``
  exactly), so those worlds use the library's allreduce as it is.
- ``library``: the MPI library's (or process group's) own allreduce. Can be faster on
  three or more ranks; the result then depends on the algorithm and on the offsets, so
  a resumed run can drift from an uninterrupted one by rounding.

numpy (and so mpi4py's buffer path) has no bfloat16: bf16 and fp16 buckets are
converted to float32 for the sum and back, so that the sum is computed on values, not
on reinterpreted bits.

No ``from __future__ import annotations`` here: DDP checks the hooks' annotations
(``bucket: dist.GradBucket``, returning ``torch.futures.Future[torch.Tensor]``) as
objects when they are registered.
"""

import itertools
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import GradBucket

from cpuaccel.rank_settings import GRAD_REDUCE_ENV, GRAD_SYNC_ENV, check, forced_value
from cpuaccel.runtime.env import DistEnv

# Buckets of these dtypes go to MPI as they are (numpy and MPI have them).
NATIVE = (torch.float32, torch.float64)


class Comm(Protocol):
    """What is used of an mpi4py communicator."""

    def Allreduce(self, sendbuf: Any, recvbuf: Any, op: Any = ...) -> None: ...

    def Alltoallv(self, sendbuf: Any, recvbuf: Any) -> None: ...

    def Allgatherv(self, sendbuf: Any, recvbuf: Any) -> None: ...

    def Get_size(self) -> int: ...

    def Get_rank(self) -> int: ...


class SyncTimer:
    """Seconds spent in gradient sync; intervals that overlap are counted once."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0
        self.bytes = 0
        self._last_end = 0.0
        self._lock = threading.Lock()

    def add(self, start: float, end: float, nbytes: int) -> None:
        with self._lock:
            begin = max(start, self._last_end)
            if end > begin:
                self.seconds += end - begin
            self._last_end = max(self._last_end, end)
            self.calls += 1
            self.bytes += nbytes


@dataclass
class MpiState:
    comm: Comm
    world_size: int
    sum_op: Any
    in_place: Any
    rank: int = 0
    ordered: bool = True  # grad_reduce "ordered"; False: the library's allreduce
    types: Mapping[torch.dtype, Any] = field(default_factory=dict)  # MPI datatypes
    timer: SyncTimer = field(default_factory=SyncTimer)
    # Working buffers kept across steps, by shape and dtype: a fresh tensor as large as a
    # bucket costs its page faults again every step.
    kept: dict[tuple[tuple[int, ...], torch.dtype], torch.Tensor] = field(default_factory=dict)

    @property
    def in_rank_order(self) -> bool:
        return self.ordered and self.world_size > 2

    def buffer(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A working tensor of this shape and dtype, the same one at every call."""
        key = (shape, dtype)
        if key not in self.kept:
            self.kept[key] = torch.empty(shape, dtype=dtype)
        return self.kept[key]


@dataclass
class PgState:
    world_size: int
    group: Any = None
    rank: int = 0
    ordered: bool = True
    timer: SyncTimer = field(default_factory=SyncTimer)

    @property
    def in_rank_order(self) -> bool:
        return self.ordered and self.world_size > 2


def shards(n: int, world_size: int) -> tuple[list[int], list[int]]:
    """Each rank's element count and offset in a flat buffer of ``n`` elements: equal
    parts, the first ``n % world_size`` ranks one element more."""
    base, extra = divmod(n, world_size)
    counts = [base + (rank < extra) for rank in range(world_size)]
    return counts, list(itertools.accumulate([0, *counts[:-1]]))


def sum_in_rank_order_(out: torch.Tensor, parts: torch.Tensor) -> torch.Tensor:
    """``out = ((parts[0] + parts[1]) + parts[2]) + ...``, element by element.

    One addition at a time over whole rows, never a reduction kernel (whose order over
    the rows is the kernel's to choose): each element's rounding is the same wherever
    it sits in the buffer."""
    out.copy_(parts[0])
    for row in parts[1:]:
        out.add_(row)
    return out


def mpi_allreduce_mean_(tensor: torch.Tensor, state: MpiState) -> torch.Tensor:
    """Average ``tensor`` (flat, contiguous) across the MPI ranks, in place; return it."""
    if tensor.dtype in NATIVE and tensor.is_contiguous():
        _mpi_sum_(tensor, state)
        tensor.div_(state.world_size)
        return tensor
    wide = state.buffer((tensor.numel(),), torch.float32)
    wide.copy_(tensor.reshape(-1))  # the same values
    _mpi_sum_(wide, state)
    wide.div_(state.world_size)
    tensor.copy_(wide.view_as(tensor))
    return tensor


def _mpi_sum_(tensor: torch.Tensor, state: MpiState) -> None:
    """Sum ``tensor`` (float32 or float64, contiguous) over the ranks, in place."""
    if not state.in_rank_order:
        state.comm.Allreduce(state.in_place, tensor.numpy(), op=state.sum_op)
        return
    world, rank = state.world_size, state.rank
    counts, offsets = shards(tensor.numel(), world)
    mine = counts[rank]
    parts = state.buffer((world, mine), tensor.dtype)
    kind = state.types[tensor.dtype]
    array = tensor.numpy()
    state.comm.Alltoallv(
        [array, counts, offsets, kind],
        [parts.numpy(), [mine] * world, [mine * r for r in range(world)], kind],
    )
    sum_in_rank_order_(tensor[offsets[rank] : offsets[rank] + mine], parts)
    state.comm.Allgatherv(state.in_place, [array, counts, offsets, kind])


def mpi_hook(state: MpiState, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: the bucket averaged with MPI_Allreduce, done on return."""
    buffer = bucket.buffer()
    start = time.perf_counter()
    mpi_allreduce_mean_(buffer, state)
    state.timer.add(start, time.perf_counter(), buffer.numel() * buffer.element_size())
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(buffer)
    return future


def pg_hook(state: PgState, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: the bucket averaged by the process group (the last
    collective asynchronously, as DDP's default hook does)."""
    buffer = bucket.buffer()
    start = time.perf_counter()
    if state.in_rank_order:
        return _pg_ordered_mean(buffer, state, start)
    buffer.div_(state.world_size)
    work = dist.all_reduce(buffer, group=state.group, async_op=True)
    assert work is not None
    nbytes = buffer.numel() * buffer.element_size()

    def done(fut: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
        state.timer.add(start, time.perf_counter(), nbytes)
        return fut.value()[0]

    future: torch.futures.Future[torch.Tensor] = work.get_future().then(done)
    return future


def _pg_ordered_mean(
    buffer: torch.Tensor, state: PgState, start: float
) -> torch.futures.Future[torch.Tensor]:
    """The bucket's mean, each element summed in rank order: an all-to-all of equal
    shards (the buffer padded to a multiple of the world size), this rank's shard
    summed, then an all-gather whose future hands the buffer back."""
    world, n = state.world_size, buffer.numel()
    shard = -(-n // world)
    wide = buffer.dtype not in NATIVE
    flat = buffer.to(torch.float32) if wide else buffer
    if shard * world != n or not flat.is_contiguous():
        padded = torch.zeros(shard * world, dtype=flat.dtype)
        padded[:n] = flat
        flat = padded
    parts = torch.empty((world, shard), dtype=flat.dtype)
    dist.all_to_all_single(parts, flat, group=state.group)
    mine = sum_in_rank_order_(torch.empty(shard, dtype=flat.dtype), parts)
    mine.div_(world)
    work = _all_gather_single(flat, mine, state.group)  # the all-to-all has read flat
    nbytes = n * buffer.element_size()

    def done(_: torch.futures.Future[Any]) -> torch.Tensor:
        if flat is not buffer:
            buffer.copy_(flat[:n])
        state.timer.add(start, time.perf_counter(), nbytes)
        return buffer

    future: torch.futures.Future[torch.Tensor] = work.get_future().then(done)
    return future


def _all_gather_single(output: torch.Tensor, mine: torch.Tensor, group: Any) -> Any:
    """Every rank's ``mine`` into ``output`` in rank order, asynchronously: the list form,
    which every backend (gloo, ccl, mpi) implements."""
    parts = list(output.view(-1, mine.numel()))
    work = dist.all_gather(parts, mine, group=group, async_op=True)
    assert work is not None
    return work


@dataclass(frozen=True)
class SyncChoice:
    mode: str  # "mpi", "pg", or "none" (a world of one)
    reason: str
    comm: Any = None  # the mpi4py communicator for "mpi"
    library: str = ""


def choose_grad_sync(requested: str | None, env: DistEnv, environ: Mapping[str, str]) -> SyncChoice:
    """MPI when launched by MPI and mpi4py's world is torch's; else the process group.

    ``requested`` (init's argument) wins over $CPUACCEL_GRAD_SYNC; a forced ``mpi``
    that cannot work is an error, not a silent fallback.
    """
    forced, source = forced_value(GRAD_SYNC_ENV, "grad_sync", requested, environ)
    if env.world_size == 1:
        return SyncChoice("none", "a single process has no gradients to sync")
    if forced == "pg":
        return SyncChoice("pg", f"forced by {source}")
    if forced != "mpi" and not env.launched_by_mpi:
        return SyncChoice("pg", "the job was not started by an MPI launcher")
    comm, library, problem = _mpi_world(env.world_size)
    if comm is None:
        if forced == "mpi":
            raise RuntimeError(f"{source}=mpi, but {problem}")
        return SyncChoice("pg", problem)
    why = f"forced by {source}" if forced else "the job was started by MPI"
    return SyncChoice("mpi", f"{why}; {library}", comm, library)


def _mpi_world(world_size: int) -> tuple[Any, str, str]:
    """(communicator, library, "") when mpi4py works with ``world_size`` ranks."""
    try:
        from mpi4py import MPI
    except Exception as exc:  # ImportError, or a libmpi that does not load
        return None, "", f"mpi4py does not import ({type(exc).__name__}: {exc})"
    size = MPI.COMM_WORLD.Get_size()
    if size != world_size:
        return None, "", f"MPI's world has {size} rank(s), torch's {world_size}"
    library = MPI.Get_library_version().strip().splitlines()[0].strip()
    return MPI.COMM_WORLD.Dup(), library, ""


def reduce_in_order(requested: str | None, environ: Mapping[str, str]) -> bool:
    """``init(grad_reduce=...)``, else $CPUACCEL_GRAD_REDUCE: True for ``ordered`` (the
    default), False for ``library``."""
    origin = "init(grad_reduce=...)" if requested is not None else f"${GRAD_REDUCE_ENV}"
    text = requested if requested is not None else environ.get(GRAD_REDUCE_ENV, "")
    check(GRAD_REDUCE_ENV, text, origin)
    return (text.strip().lower() or "ordered") == "ordered"


def mpi_state(comm: Any, world_size: int, *, ordered: bool = True) -> MpiState:
    from mpi4py import MPI

    return MpiState(
        comm=comm,
        world_size=world_size,
        sum_op=MPI.SUM,
        in_place=MPI.IN_PLACE,
        rank=comm.Get_rank(),
        ordered=ordered,
        types={torch.float32: MPI.FLOAT, torch.float64: MPI.DOUBLE},
    )
