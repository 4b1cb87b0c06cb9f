"""Gradient sync (runtime/gradsync.py): MPI's allreduce (a stand-in communicator here; the
real one across nodes is tests/cluster/test_runtime.py) and the process group's, as DDP
comm hooks, the choice between them, and the timer of the time spent syncing."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from cpuaccel.runtime import gradsync
from cpuaccel.runtime.context import Context
from cpuaccel.runtime.env import DistEnv


class StandinComm:
    """A stand-in for an mpi4py communicator: another rank holds ``peer``."""

    def __init__(self, peer: np.ndarray[Any, Any]) -> None:
        self.peer = peer
        self.seen: list[np.dtype[Any]] = []

    def Allreduce(self, sendbuf: Any, recvbuf: np.ndarray[Any, Any], op: Any = None) -> None:
        assert sendbuf == "IN_PLACE" and op == "SUM"
        self.seen.append(recvbuf.dtype)
        recvbuf += self.peer.astype(recvbuf.dtype)

    def Get_size(self) -> int:
        return 2


def mpi_state(peer: np.ndarray[Any, Any]) -> gradsync.MpiState:
    return gradsync.MpiState(StandinComm(peer), world_size=2, sum_op="SUM", in_place="IN_PLACE")


def test_mpi_allreduce_averages_fp32_in_place() -> None:
    mine = torch.tensor([1.0, 2.0, 3.0])
    state = mpi_state(np.array([3.0, 2.0, -3.0]))
    out = gradsync.mpi_allreduce_mean_(mine, state)
    assert out is mine and mine.tolist() == [2.0, 2.0, 0.0]


def test_mpi_allreduce_sums_bf16_as_values_not_bits() -> None:
    mine = torch.tensor([1.5, -2.0, 1000.0, 0.01], dtype=torch.bfloat16)
    peer = torch.tensor([0.5, 4.0, 24.0, 0.03], dtype=torch.bfloat16)
    state = mpi_state(peer.float().numpy())
    expected = ((mine.float() + peer.float()) / 2).to(torch.bfloat16)
    out = gradsync.mpi_allreduce_mean_(mine, state)
    assert out is mine and out.dtype == torch.bfloat16
    assert torch.equal(out, expected)
    assert state.comm.seen == [np.dtype("float32")]  # type: ignore[attr-defined]


class DoublingComm:
    """Stand-in MPI of two ranks holding the same values: the sum is twice one's own."""

    def __init__(self) -> None:
        self.dtypes: list[np.dtype[Any]] = []

    def Allreduce(self, sendbuf: Any, recvbuf: np.ndarray[Any, Any], op: Any = None) -> None:
        self.dtypes.append(recvbuf.dtype)
        recvbuf *= 2

    def Get_size(self) -> int:
        return 2


class Mixed(nn.Module):
    """An fp32 layer then a bf16 one: DDP makes a bucket of each dtype."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(6, 5)
        self.b = nn.Linear(5, 3).to(torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x).to(torch.bfloat16)).float()


def test_mpi_hook_in_ddp_averages_every_bucket(ctx: Context) -> None:
    """The hook as DDP calls it (fp32 and bf16 buckets), with a stand-in MPI."""
    torch.manual_seed(0)
    model, plain = Mixed(), Mixed()
    plain.load_state_dict(model.state_dict())
    x = torch.randn(4, 6)
    plain(x).pow(2).sum().backward()
    # World of one, posing as two whose other rank has the same gradients: mean = own.
    ddp = nn.parallel.DistributedDataParallel(model)
    comm = DoublingComm()
    state = gradsync.MpiState(comm, world_size=2, sum_op="SUM", in_place="IN_PLACE")
    ddp.register_comm_hook(state, gradsync.mpi_hook)
    ddp(x).pow(2).sum().backward()
    for p, q in zip(model.parameters(), plain.parameters(), strict=True):
        assert p.grad is not None and q.grad is not None
        assert p.grad.dtype == q.grad.dtype
        torch.testing.assert_close(p.grad, q.grad)
    assert state.timer.calls >= 2 and state.timer.seconds > 0
    assert set(comm.dtypes) == {np.dtype("float32")}  # the bf16 bucket went as float32


def test_pg_hook_in_ddp(ctx: Context) -> None:
    model = nn.Linear(3, 2)
    ddp = nn.parallel.DistributedDataParallel(model)
    state = gradsync.PgState(world_size=1)
    ddp.register_comm_hook(state, gradsync.pg_hook)
    ddp(torch.ones(2, 3)).sum().backward()
    assert model.weight.grad is not None
    torch.testing.assert_close(model.weight.grad, torch.full((2, 3), 2.0))
    assert state.timer.calls >= 1


def env_of(**values: str) -> DistEnv:
    return DistEnv.from_environ(values)


def test_grad_sync_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    choose = gradsync.choose_grad_sync
    by_mpi = env_of(PMI_RANK="1", PMI_SIZE="4")
    by_torchrun = env_of(RANK="1", WORLD_SIZE="4")
    assert by_mpi.launched_by_mpi and by_mpi.world_size == 4
    assert not by_torchrun.launched_by_mpi
    assert choose(None, env_of(), {}).mode == "none"
    assert choose(None, by_torchrun, {}) == gradsync.SyncChoice(
        "pg", "the job was not started by an MPI launcher"
    )
    comm = object()
    monkeypatch.setattr(gradsync, "_mpi_world", lambda n: (comm, "Stand-in MPI 1.0", ""))
    auto = choose(None, by_mpi, {})
    assert (auto.mode, auto.comm) == ("mpi", comm)
    assert auto.reason == "the job was started by MPI; Stand-in MPI 1.0"
    assert choose(None, by_mpi, {"CPUACCEL_GRAD_SYNC": "pg"}).reason == (
        "forced by $CPUACCEL_GRAD_SYNC"
    )
    assert choose("mpi", by_torchrun, {"CPUACCEL_GRAD_SYNC": "pg"}).mode == "mpi"
    monkeypatch.setattr(
        gradsync, "_mpi_world", lambda n: (None, "", "MPI's world has 1 rank(s), torch's 4")
    )
    assert choose(None, by_mpi, {}) == gradsync.SyncChoice(
        "pg", "MPI's world has 1 rank(s), torch's 4"
    )
    with pytest.raises(RuntimeError, match="CPUACCEL_GRAD_SYNC=mpi, but MPI's world"):
        choose(None, by_mpi, {"CPUACCEL_GRAD_SYNC": "mpi"})
    expected = r"^\$CPUACCEL_GRAD_SYNC: 'nccl' is not .*; use mpi or pg$"
    with pytest.raises(ValueError, match=expected):
        choose(None, by_mpi, {"CPUACCEL_GRAD_SYNC": "nccl"})


def test_sync_timer_counts_overlapping_intervals_once() -> None:
    timer = gradsync.SyncTimer()
    timer.add(0.0, 2.0, 10)
    timer.add(1.0, 3.0, 10)  # overlaps the first by one second
    timer.add(5.0, 6.0, 10)
    assert timer.seconds == pytest.approx(4.0)
    assert (timer.calls, timer.bytes) == (3, 30)
