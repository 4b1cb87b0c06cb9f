"""The process group: the script's own or a new one, its backend, and leaving it at exit."""

from __future__ import annotations

import contextlib
import datetime
import os
from dataclasses import replace

import torch
import torch.distributed as dist
from torch.distributed import HashStore  # type: ignore[attr-defined]

from cpuaccel.rank_settings import BACKEND_ENV
from cpuaccel.runtime.backend import BackendChoice, choose_backend
from cpuaccel.runtime.env import DistEnv


def place(backend: str | None) -> tuple[DistEnv, BackendChoice, bool]:
    """This rank's place in the job, the group's backend, and whether ``init`` creates
    the group (False when the script initialized one itself: then it is used as it is)."""
    env = DistEnv.from_environ()
    owns = not (dist.is_available() and dist.is_initialized())
    if not owns:
        env = with_world(env, dist.get_rank(), dist.get_world_size())
        choice = BackendChoice(str(dist.get_backend()), "initialized by the script")
    elif env.world_size == 1 and not backend and not os.environ.get(BACKEND_ENV):
        choice = BackendChoice("gloo", "a single process")
    else:
        choice = choose_backend(backend, os.environ, torch.__version__, dist.is_mpi_available())
    return env, choice, owns


def with_world(env: DistEnv, rank: int, world_size: int) -> DistEnv:
    return replace(env, rank=rank, world_size=world_size)


def create(backend: str, env: DistEnv) -> None:
    if env.world_size == 1:
        dist.init_process_group(backend, store=HashStore(), rank=0, world_size=1)
        return
    host = env.master_addr
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    dist.init_process_group(
        backend,
        init_method=f"tcp://{host}:{env.master_port}",
        rank=env.rank,
        world_size=env.world_size,
    )


def leave(together: bool = True) -> None:
    """Destroy the group: ``Context.close()`` and, for a script that did not close it,
    at exit. ``together``: after the other ranks arrive (not for a rank leaving on an
    exception, whose peers may never come)."""
    if dist.is_initialized():
        with contextlib.suppress(Exception):
            if together and dist.get_backend() == "gloo":
                # Ranks leave together: a rank that tears down its gloo connections
                # while a peer still reads from them can abort that peer (SIGABRT at
                # exit). Bounded, in case a peer is gone.
                dist.monitored_barrier(timeout=datetime.timedelta(seconds=10))
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
