"""Gradient averaging for DDP: through MPI (mpi4py) or through the process group, timed.

When the job was started by an MPI launcher, the MPI library that started it is right
there, and its allreduce (Intel MPI's shared-memory and tuned network paths) is several
times faster than gloo's on CPUs. :func:`mpi_hook` is a DDP communication hook that sums
each gradient bucket in place with ``MPI_Allreduce`` and divides by the world size; it
returns a future that is already complete. :func:`pg_hook` does the same through the
torch process group (asynchronously, as DDP's default hook does). Both record the time
spent in gradient sync in a :class:`SyncTimer`, for the metrics.

numpy (and so mpi4py's buffer path) has no bfloat16: bf16 and fp16 buckets are
converted to float32 for the sum and back, so that the sum is computed on values, not
on reinterpreted bits.

No ``from __future__ import annotations`` here: DDP checks the hooks' annotations
(``bucket: dist.GradBucket``, returning ``torch.futures.Future[torch.Tensor]``) as
objects when they are registered.
"""

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import GradBucket

from cpuaccel.rank_settings import GRAD_SYNC_ENV, check
from cpuaccel.runtime.env import DistEnv

# Buckets of these dtypes go to MPI as they are (numpy and MPI have them).
NATIVE = (torch.float32, torch.float64)


class Comm(Protocol):
    """What is used of an mpi4py communicator."""

    def Allreduce(self, sendbuf: Any, recvbuf: Any, op: Any = ...) -> None: ...

    def Get_size(self) -> int: ...


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
    timer: SyncTimer = field(default_factory=SyncTimer)


@dataclass
class PgState:
    world_size: int
    group: Any = None
    timer: SyncTimer = field(default_factory=SyncTimer)


def mpi_allreduce_mean_(tensor: torch.Tensor, state: MpiState) -> torch.Tensor:
    """Average ``tensor`` (flat, contiguous) across the MPI ranks, in place; return it."""
    if tensor.dtype in NATIVE and tensor.is_contiguous():
        state.comm.Allreduce(state.in_place, tensor.numpy(), op=state.sum_op)
        tensor.div_(state.world_size)
        return tensor
    wide = tensor.to(torch.float32).contiguous()  # a copy with the same values
    state.comm.Allreduce(state.in_place, wide.numpy(), op=state.sum_op)
    wide.div_(state.world_size)
    tensor.copy_(wide)
    return tensor


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
    """DDP communication hook: the bucket averaged by the process group, asynchronously."""
    buffer = bucket.buffer()
    start = time.perf_counter()
    buffer.div_(state.world_size)
    work = dist.all_reduce(buffer, group=state.group, async_op=True)
    assert work is not None
    nbytes = buffer.numel() * buffer.element_size()

    def done(fut: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
        state.timer.add(start, time.perf_counter(), nbytes)
        return fut.value()[0]

    future: torch.futures.Future[torch.Tensor] = work.get_future().then(done)
    return future


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
    forced, source = requested, "init(grad_sync=...)"
    if not forced and environ.get(GRAD_SYNC_ENV):
        forced, source = environ[GRAD_SYNC_ENV], f"${GRAD_SYNC_ENV}"
    if forced:
        check(GRAD_SYNC_ENV, forced, source)
        forced = forced.strip().lower()
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


def mpi_state(comm: Any, world_size: int) -> MpiState:
    from mpi4py import MPI

    return MpiState(comm=comm, world_size=world_size, sum_op=MPI.SUM, in_place=MPI.IN_PLACE)
