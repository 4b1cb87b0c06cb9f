"""The training runtime (cpuaccel.init) in one process, plus one local two-rank job.

IPEX and oneCCL's bindings cannot be installed beside this torch: their decisions are
tested with stand-in modules put into sys.modules (fixtures named ``*_standin``).
MPI is replaced by a stand-in communicator here; the real one is tested across nodes in
test_runtime_cluster.py.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

import cpuaccel
from cpuaccel.runtime import backend as backend_mod
from cpuaccel.runtime import checkpoint, gradsync
from cpuaccel.runtime.backend import choose_backend, find_extension
from cpuaccel.runtime.context import Context
from cpuaccel.runtime.data import ShardedLoader, shard_loader
from cpuaccel.runtime.env import DistEnv
from cpuaccel.runtime.metrics import MetricsLog
from cpuaccel.runtime.prepare import pair

REPO = Path(__file__).resolve().parent.parent
TORCH = torch.__version__
LAUNCH_VARS = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK",
    "SLURM_PROCID", "CPUACCEL_BACKEND", "CPUACCEL_GRAD_SYNC", "CPUACCEL_RUN_DIR",
)  # fmt: skip


def other_minor(version: str) -> str:
    major, minor = backend_mod.major_minor(version).split(".")
    return f"{major}.{int(minor) - 5}.0+cpu"


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in LAUNCH_VARS:
        monkeypatch.delenv(name, raising=False)


def _standin(
    monkeypatch: pytest.MonkeyPatch, name: str, version: str, **attrs: Any
) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(STANDIN=True, __version__=version, **attrs)
    monkeypatch.setitem(sys.modules, name, module)
    return module


@pytest.fixture
def fake_ccl_standin(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], types.ModuleType]:
    """A stand-in for oneccl_bindings_for_pytorch of the given version (not the real one)."""
    return lambda version: _standin(monkeypatch, backend_mod.CCL_MODULE, version)


class IpexCalls:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def optimize(self, model: nn.Module, optimizer: Any = None, **kwargs: Any) -> Any:
        self.calls.append({"model": model, "optimizer": optimizer, **kwargs})
        model.ipex_optimized = True  # type: ignore[assignment]
        return model if optimizer is None else (model, optimizer)


@pytest.fixture
def fake_ipex_standin(
    monkeypatch: pytest.MonkeyPatch,
) -> Callable[[str], tuple[types.ModuleType, IpexCalls]]:
    """A stand-in for intel_extension_for_pytorch that records its optimize() calls."""

    def make(version: str) -> tuple[types.ModuleType, IpexCalls]:
        calls = IpexCalls()
        module = _standin(monkeypatch, backend_mod.IPEX_MODULE, version, optimize=calls.optimize)
        return module, calls

    return make


@pytest.fixture
def ctx(clean_env: None, tmp_path: Path) -> Iterator[Context]:
    """A world of one (gloo), as a script run with plain `python` gets."""
    assert not dist.is_initialized()
    context = cpuaccel.init("bf16", seed=0, metrics_path=tmp_path / "metrics.jsonl")
    yield context
    context.close()
    assert not dist.is_initialized()


# ---------------------------------------------------------------- package import


def test_importing_cpuaccel_stays_cheap_and_exports_init_lazily() -> None:
    code = (
        "import sys, cpuaccel\n"
        "assert 'torch' not in sys.modules, 'torch imported by import cpuaccel'\n"
        "init = cpuaccel.init\n"
        "assert 'torch' in sys.modules and callable(init) and cpuaccel.Context\n"
        "from cpuaccel import init as again\n"
        "assert again is init\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr
    with pytest.raises(AttributeError):
        cpuaccel.no_such_name  # noqa: B018


# ---------------------------------------------------------------- backend choice


def test_backend_is_gloo_without_ccl_bindings() -> None:
    assert backend_mod.CCL_MODULE not in sys.modules
    choice = choose_backend(None, {}, TORCH)
    assert choice.name == "gloo"
    assert choice.reason == "oneccl_bindings_for_pytorch is not installed"


def test_backend_is_ccl_when_the_standin_matches_torch(
    fake_ccl_standin: Callable[[str], types.ModuleType],
) -> None:
    fake_ccl_standin(TORCH)
    choice = choose_backend(None, {}, TORCH)
    assert choice.name == "ccl"
    assert f"matches torch {TORCH}" in choice.reason


def test_backend_is_gloo_when_the_standin_is_built_for_another_torch(
    fake_ccl_standin: Callable[[str], types.ModuleType],
) -> None:
    old = other_minor(TORCH)
    fake_ccl_standin(old)
    choice = choose_backend(None, {}, TORCH)
    assert choice.name == "gloo"
    assert choice.reason == (
        f"oneccl_bindings_for_pytorch {old} is built for torch "
        f"{backend_mod.major_minor(old)}, this is torch {TORCH}"
    )


def test_forced_backend_wins_and_says_so(
    fake_ccl_standin: Callable[[str], types.ModuleType],
) -> None:
    fake_ccl_standin(TORCH)  # ccl would be chosen otherwise
    forced = choose_backend(None, {"CPUACCEL_BACKEND": "gloo"}, TORCH)
    assert (forced.name, forced.reason) == ("gloo", "forced by $CPUACCEL_BACKEND")
    # init's own argument wins over the environment.
    argument = choose_backend("ccl", {"CPUACCEL_BACKEND": "gloo"}, TORCH)
    assert (argument.name, argument.reason) == ("ccl", "forced by init(backend=...)")


def test_forced_backend_that_cannot_work_is_an_error(
    fake_ccl_standin: Callable[[str], types.ModuleType],
) -> None:
    with pytest.raises(RuntimeError, match=r"CPUACCEL_BACKEND=ccl, but .* not installed"):
        choose_backend(None, {"CPUACCEL_BACKEND": "ccl"}, TORCH)
    fake_ccl_standin(other_minor(TORCH))
    with pytest.raises(RuntimeError, match="is built for torch"):
        choose_backend(None, {"CPUACCEL_BACKEND": "ccl"}, TORCH)
    with pytest.raises(RuntimeError, match="not built with MPI"):
        choose_backend(None, {"CPUACCEL_BACKEND": "mpi"}, TORCH, mpi_available=False)
    with pytest.raises(ValueError, match=r"^\$CPUACCEL_BACKEND: 'nccl' is not a choice"):
        choose_backend(None, {"CPUACCEL_BACKEND": "nccl"}, TORCH)
    with pytest.raises(ValueError, match=r"^init\(backend=\.\.\.\): '-gloo' is not a choice"):
        choose_backend("-gloo", {}, TORCH)


def test_a_build_for_another_torch_is_not_even_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading a binary extension built for another torch can crash: metadata is enough."""
    installed = {"oneccl_bind_pt": "2.7.0+cpu"}

    def version(dist_name: str) -> str:
        if dist_name in installed:
            return installed[dist_name]
        raise backend_mod.importlib.metadata.PackageNotFoundError(dist_name)

    def no_import(name: str) -> None:
        raise AssertionError(f"{name} was imported")

    monkeypatch.setattr(backend_mod.importlib.metadata, "version", version)
    monkeypatch.setattr(backend_mod.importlib, "import_module", no_import)
    found = find_extension(backend_mod.CCL_MODULE, backend_mod.CCL_DISTS, "2.13.0+cpu")
    assert found.module is None
    assert found.reason == (
        "oneccl_bindings_for_pytorch 2.7.0+cpu is built for torch 2.7, this is torch 2.13.0+cpu"
    )


def test_world_of_one_without_a_launcher(ctx: Context, capsys: pytest.CaptureFixture[str]) -> None:
    assert (ctx.rank, ctx.world_size, ctx.backend, ctx.grad_sync) == (0, 1, "gloo", "none")
    assert dist.is_initialized() and dist.get_world_size() == 1
    assert ctx.dtype is torch.bfloat16
    assert ctx.mean(torch.tensor(3.0)) == 3.0
    # The pg is ready for collectives in a world of one.
    ctx.barrier()


def test_init_logs_its_choices_once_on_rank_0(
    clean_env: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with cpuaccel.init("bf16", metrics_path=tmp_path / "m.jsonl"):
        pass
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "cpuaccel: backend gloo: a single process (1 rank(s))"
    assert err[1].startswith("cpuaccel: mixed precision bf16")
    assert len(err) == 2
    with pytest.raises(ValueError, match="fp16"):
        cpuaccel.init("fp16")
    assert not dist.is_initialized()


def test_precision_defaults_to_what_run_exported(
    clean_env: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CPUACCEL_MIXED_PRECISION", "bf16")
    with cpuaccel.init(verbose=False, metrics_path=tmp_path / "m.jsonl") as ctx:
        assert ctx.dtype == torch.bfloat16
    with cpuaccel.init("no", verbose=False, metrics_path=tmp_path / "m.jsonl") as ctx:
        assert ctx.dtype is None  # an explicit argument wins


# ---------------------------------------------------------------- IPEX


def test_ipex_standin_matching_torch_is_applied_per_pair(
    ctx: Context,
    fake_ipex_standin: Callable[[str], tuple[types.ModuleType, IpexCalls]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, ipex = fake_ipex_standin(TORCH)
    a, b = nn.Linear(3, 3), nn.Linear(3, 2)
    opt_a, opt_b = torch.optim.SGD(a.parameters(), lr=0.1), torch.optim.SGD(b.parameters())
    # Optimizers are matched to their models by parameters, not by position.
    out = ctx.prepare(opt_b, a, b, opt_a)
    assert out == (opt_b, a, b, opt_a)
    assert [(c["model"], c["optimizer"], c["dtype"]) for c in ipex.calls] == [
        (a, opt_a, torch.bfloat16),
        (b, opt_b, torch.bfloat16),
    ]
    assert "cpuaccel: IPEX optimize applied to 2 model(s)" in capsys.readouterr().err


def test_ipex_standin_for_another_torch_is_skipped_with_a_reason(
    ctx: Context,
    fake_ipex_standin: Callable[[str], tuple[types.ModuleType, IpexCalls]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    old = other_minor(TORCH)
    _, ipex = fake_ipex_standin(old)
    model = nn.Linear(3, 3)
    prepared = ctx.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))[0]
    assert ipex.calls == [] and not hasattr(prepared, "ipex_optimized")
    skipped = [line for line in capsys.readouterr().err.splitlines() if "IPEX" in line]
    assert skipped == [
        f"cpuaccel: IPEX skipped: intel_extension_for_pytorch {old} is built for torch "
        f"{backend_mod.major_minor(old)}, this is torch {TORCH}"
    ]


def test_ipex_absent_or_disabled_is_skipped(
    clean_env: None,
    tmp_path: Path,
    fake_ipex_standin: Callable[[str], tuple[types.ModuleType, IpexCalls]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    with cpuaccel.init(metrics_path=tmp_path / "m.jsonl") as absent:
        absent.prepare(nn.Linear(2, 2))
    assert "IPEX skipped: intel_extension_for_pytorch is not installed" in capsys.readouterr().err
    _, ipex = fake_ipex_standin(TORCH)
    with cpuaccel.init(ipex=False, metrics_path=tmp_path / "m.jsonl") as off:
        model = nn.Linear(2, 2)
        off.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert ipex.calls == []
    assert "IPEX skipped: init(ipex=False)" in capsys.readouterr().err


# ---------------------------------------------------------------- prepare


def test_prepare_two_model_optimizer_pairs_train_together(ctx: Context) -> None:
    torch.manual_seed(0)
    encoder, head = nn.Linear(8, 4), nn.Linear(4, 1)
    opt_e = torch.optim.AdamW(encoder.parameters(), lr=0.05)
    opt_h = torch.optim.SGD(head.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(32, 8), torch.randn(32, 1)), batch_size=8)
    before = [p.detach().clone() for m in (encoder, head) for p in m.parameters()]
    out = ctx.prepare(encoder, opt_e, head, opt_h, loader)
    assert len(out) == 5
    enc, oe, hd, oh, batches = out
    assert (enc, oe, hd, oh) == (encoder, opt_e, head, opt_h)  # in order (no DDP at 1 rank)
    assert isinstance(batches, ShardedLoader) and len(batches) == 4
    losses = []
    for _ in range(3):
        for x, y in batches:
            with ctx.autocast():
                loss = nn.functional.mse_loss(hd(enc(x)).float(), y)
            ctx.backward(loss)
            for opt in (oe, oh):
                opt.step()
                opt.zero_grad()
            losses.append(loss.item())
    after = [p.detach() for m in (encoder, head) for p in m.parameters()]
    assert all(not torch.equal(b, a) for b, a in zip(before, after, strict=True))
    assert losses[-1] < losses[0]
    assert ctx.steps_done == 12


def test_pairing_is_by_parameters() -> None:
    a, b, c = nn.Linear(2, 2), nn.Linear(2, 2), nn.Linear(2, 2)
    opt_b = torch.optim.SGD(b.parameters(), lr=1)
    opt_ac = torch.optim.SGD([*a.parameters(), *c.parameters()], lr=1)
    pairing = pair([a, opt_ac, b, "not a model", opt_b, c])
    assert pairing.optimizer_of == {2: 4}
    assert pairing.shared == [1]


def test_prepare_returns_one_object_alone_and_leaves_others(ctx: Context) -> None:
    model = nn.Linear(2, 2)
    assert ctx.prepare(model) is model
    assert ctx.prepare(model, 42, "x") == (model, 42, "x")


# ---------------------------------------------------------------- gradient accumulation


def test_accumulate_syncs_every_nth_micro_step(clean_env: None, tmp_path: Path) -> None:
    with cpuaccel.init(gradient_accumulation_steps=3, metrics_path=tmp_path / "m") as acc:
        model = nn.Linear(1, 1, bias=False)
        nn.init.ones_(model.weight)
        synced = []
        for _ in range(6):
            with acc.accumulate(model):
                acc.backward(model(torch.ones(1, 1)).sum())
                synced.append(acc.sync_gradients)
                if acc.sync_gradients:
                    assert model.weight.grad is not None
                    # three micro-steps of d/dw (w*1) = 1, each scaled by 1/3
                    assert model.weight.grad.item() == pytest.approx(1.0)
                    model.weight.grad = None
        assert synced == [False, False, True, False, False, True]
        assert acc.steps_done == 2
        big = nn.Linear(4, 1)
        big(torch.full((1, 4), 100.0)).sum().backward()
        norm = acc.clip_grad_norm_(big, 1.0)
        assert norm.item() > 1.0
        grads = [p.grad.flatten() for p in big.parameters() if p.grad is not None]
        assert torch.cat(grads).norm().item() == pytest.approx(1.0, rel=1e-4)


# ---------------------------------------------------------------- gradient sync


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


# ---------------------------------------------------------------- data


def shards(world: int, loader: DataLoader[Any], epoch: int | None = None) -> list[list[int]]:
    seen = []
    for rank in range(world):
        sharded = shard_loader(loader, rank=rank, world_size=world, seed=7)
        assert isinstance(sharded, ShardedLoader)
        if epoch is not None:
            sharded.set_epoch(epoch)
        seen.append([int(i) for (batch,) in sharded for i in batch])
    return seen


def test_two_ranks_read_disjoint_shards_and_set_epoch_reshuffles() -> None:
    loader = DataLoader(TensorDataset(torch.arange(24)), batch_size=4, shuffle=True)
    zero = shards(2, loader, epoch=0)
    assert len(zero[0]) == len(zero[1]) == 12
    assert not set(zero[0]) & set(zero[1])
    assert sorted(zero[0] + zero[1]) == list(range(24))
    assert shards(2, loader, epoch=0) == zero  # the same epoch: the same order everywhere
    one = shards(2, loader, epoch=1)
    assert one != zero and sorted(one[0] + one[1]) == list(range(24))
    # Without set_epoch, each new pass is the next epoch.
    auto = shard_loader(loader, rank=0, world_size=2, seed=7)
    passes = [[int(i) for (b,) in auto for i in b] for _ in range(2)]
    assert passes == [zero[0], one[0]] and auto.epoch == 1  # type: ignore[attr-defined]


def test_set_epoch_can_resume_part_way() -> None:
    loader = DataLoader(TensorDataset(torch.arange(24)), batch_size=4, shuffle=True)
    sharded = shard_loader(loader, rank=1, world_size=2, seed=7)
    assert isinstance(sharded, ShardedLoader)
    sharded.set_epoch(3)
    whole = [b.tolist() for (b,) in sharded]
    sharded.set_epoch(3, skip_batches=2)
    assert len(sharded) == 1
    assert [b.tolist() for (b,) in sharded] == whole[2:]
    assert len(sharded) == 3  # the skip is for one pass only


def test_sequential_loader_stays_in_order_and_odd_sizes_pad() -> None:
    loader = DataLoader(TensorDataset(torch.arange(7)), batch_size=2)
    assert shards(2, loader) == [[0, 2, 4, 6], [1, 3, 5, 0]]  # padded: same batches per rank


def test_loaders_that_cannot_be_sharded() -> None:
    class Stream(IterableDataset[int]):
        def __iter__(self) -> Iterator[int]:
            return iter(range(3))

    stream = DataLoader(Stream())
    assert shard_loader(stream, rank=0, world_size=2) is stream
    weighted = DataLoader(
        TensorDataset(torch.arange(4)),
        sampler=torch.utils.data.WeightedRandomSampler([1.0] * 4, 4),
    )
    with pytest.raises(TypeError, match="custom sampler"):
        shard_loader(weighted, rank=0, world_size=2)


# ---------------------------------------------------------------- checkpoints


def test_checkpoint_round_trip(ctx: Context, tmp_path: Path) -> None:
    torch.manual_seed(1)
    model = nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    path = ctx.save(tmp_path / "ckpt" / "state.pt", model=model, optimizer=opt, step=7, tag="a")
    assert path.is_file()
    other = nn.Linear(4, 2)
    other_opt = torch.optim.AdamW(other.parameters(), lr=0.1)
    state = ctx.load(path, model=other, optimizer=other_opt)
    assert state["step"] == 7 and state["tag"] == "a"
    for p, q in zip(model.parameters(), other.parameters(), strict=True):
        assert torch.equal(p, q)
    assert torch.equal(
        other_opt.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"]
    )
    with pytest.raises(KeyError, match="no scheduler"):
        ctx.load(path, scheduler=other_opt)


def test_interrupted_save_leaves_the_old_checkpoint_whole(
    ctx: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "state.pt"
    ctx.save(path, step=1, weights=torch.arange(1000.0))
    old = path.read_bytes()

    def killed(src: object, dst: object) -> None:
        raise KeyboardInterrupt("killed before the rename")

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        ctx.save(path, step=2, weights=torch.zeros(1000))
    monkeypatch.undo()
    assert path.read_bytes() == old
    assert ctx.load(path)["step"] == 1
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp file


def test_temp_file_of_a_killed_save_is_cleared_by_the_next(ctx: Context, tmp_path: Path) -> None:
    path = tmp_path / "state.pt"
    # The name carries host and pid (nodes sharing a folder never remove another's).
    host = socket.gethostname()
    stale = tmp_path / f".state.pt{checkpoint.TEMP_MARK}{host}-99999999"  # no such pid
    stale.write_bytes(b"half a checkpoint")
    running = tmp_path / f".state.pt{checkpoint.TEMP_MARK}{host}-1"  # init: a save under way
    running.write_bytes(b"another writer's")
    other = tmp_path / f".state.pt{checkpoint.TEMP_MARK}node9-123"
    other.write_bytes(b"another host's")
    ctx.save(path, step=3)
    assert not stale.exists() and running.exists() and other.exists()
    assert ctx.load(path) == {"step": 3}


def test_a_killed_writer_never_leaves_a_corrupt_file(tmp_path: Path) -> None:
    """SIGKILL a process that saves in a loop: the file always loads, whole."""
    path = tmp_path / "state.pt"
    writer = textwrap.dedent(
        f"""
        import torch
        from cpuaccel.runtime.checkpoint import to_bytes, write_atomic
        n = 0
        while True:
            n += 1
            write_atomic({str(path)!r}, to_bytes({{"n": n, "w": torch.full((300_000,), n)}}))
            print(n, flush=True)
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", writer], stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    try:
        assert proc.stdout is not None
        for _ in range(3):
            proc.stdout.readline()
    finally:
        proc.kill()
        proc.wait()
    state = checkpoint.from_bytes(path.read_bytes())
    assert state["n"] >= 3 and torch.equal(state["w"], torch.full((300_000,), state["n"]))


# ---------------------------------------------------------------- metrics


def read_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_metrics_lines(ctx: Context, tmp_path: Path) -> None:
    model = nn.Linear(2, 1)
    ctx.prepare(model)
    for step in (1, 2):
        time.sleep(0.05)
        ctx.backward(model(torch.ones(1, 2)).sum())
        line = ctx.log(step=step, loss=torch.tensor(2.5 / step), samples=10)
    lines = read_lines(tmp_path / "metrics.jsonl")
    assert [x["step"] for x in lines] == [1, 2]
    assert lines[1]["loss"] == 1.25 and line == lines[1]
    for x in lines:
        assert {"time", "step_time", "samples_per_s", "sync_time", "sync_share"} <= set(x)
        assert 0.05 <= x["step_time"] < 1.0
        assert x["samples_per_s"] == pytest.approx(10 / x["step_time"])
        assert x["sync_time"] == 0.0 and x["sync_share"] == 0.0  # one rank: nothing to sync
    # Logging every 3 steps: per-step times, samples from samples_per_step.
    ctx.samples_per_step = 8
    for _ in range(3):
        time.sleep(0.02)
        ctx.backward(model(torch.ones(1, 2)).sum())
    third = ctx.log(step=5, loss=1.0)
    assert 0.02 <= third["step_time"] < 0.5
    assert third["samples_per_s"] == pytest.approx(8 / third["step_time"])


def test_metrics_go_to_the_run_dir_or_the_working_folder(
    clean_env: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with cpuaccel.init(verbose=False) as here:
        here.log(step=1, loss=1.0)
    assert read_lines(tmp_path / "metrics.jsonl")[0]["loss"] == 1.0
    run_dir = tmp_path / "runs" / "r1"
    monkeypatch.setenv("CPUACCEL_RUN_DIR", str(run_dir))
    with cpuaccel.init(verbose=False) as in_run:
        in_run.log(step=1, loss=2.0, epoch=0)
    assert read_lines(run_dir / "metrics.jsonl")[0]["loss"] == 2.0


def test_metrics_report_time_in_gradient_sync() -> None:
    log = MetricsLog("unused.jsonl", enabled=False)  # as on ranks other than 0
    time.sleep(0.1)
    line = log.record(
        {"step": 2}, steps_done=2, sync_seconds=0.05, samples=None, samples_per_step=None
    )
    assert line["sync_time"] == pytest.approx(0.025)
    assert 0.2 < line["sync_share"] <= 0.5
    assert "samples_per_s" not in line
    assert not Path("unused.jsonl").exists()


# ---------------------------------------------------------------- two local ranks

TWO_RANKS = """\
import json, os, sys
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
import cpuaccel

ctx = cpuaccel.init(seed=0)
torch.manual_seed(0)
data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
a, b = nn.Linear(4, 3), nn.Linear(3, 1)
oa, ob = torch.optim.AdamW(a.parameters(), lr=0.05), torch.optim.SGD(b.parameters(), lr=0.1)
a, oa, b, ob, loader = ctx.prepare(a, oa, b, ob, DataLoader(data, batch_size=4, shuffle=True))
seen = []
for x, y in loader:
    seen += [round(v, 6) for v in x[:, 0].tolist()]
    ctx.backward(nn.functional.mse_loss(b(a(x)), y))
    for opt in (oa, ob):
        opt.step()
        opt.zero_grad()
ctx.save("ckpt.pt", a=a, b=b, step=len(loader))  # relative: rank 1 runs in another folder
saved_here = os.path.exists("ckpt.pt")  # each is its node's local rank 0: both save
if ctx.rank == 1:
    os.remove("ckpt.pt")  # a node without a copy: it gets rank 0's bytes
state = ctx.load("ckpt.pt")
params = [p.detach() for m in (a, b) for p in m.parameters()]
print(json.dumps({
    "rank": ctx.rank, "sync": ctx.grad_sync, "ddp": type(a).__name__,
    "same_optimizers": [oa.param_groups[0]["params"][0] is next(a.parameters())],
    "params": torch.cat([p.flatten() for p in params]).tolist(), "seen": seen,
    "loaded": all(torch.equal(state["a"][k], v) for k, v in ctx.unwrap(a).state_dict().items()),
    "step": state["step"], "has_file": os.path.exists("ckpt.pt"), "saved_here": saved_here,
    "sync_calls": ctx.timer.calls,
}))
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_two_ranks(script: Path, tmp_path: Path) -> list[tuple[int, str, str]]:
    """Run ``script`` as ranks 0 and 1 (each in its own folder); (code, out, err) each."""
    port = free_port()
    procs = []
    for rank in range(2):
        folder = tmp_path / f"rank{rank}"
        folder.mkdir(exist_ok=True)
        env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
        env.update(
            RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
            OMP_NUM_THREADS="1", PYTHONPATH=str(REPO),
        )  # fmt: skip
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script)],
                cwd=folder,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        results.append((proc.returncode, out, err))
    return results


def test_two_local_ranks_train_two_pairs_in_sync(tmp_path: Path) -> None:
    """Two ranks as torchrun would start them: DDP, process-group sync, sharded data,
    and a checkpoint saved by each (each is local rank 0), loaded by one that lost its copy."""
    script = tmp_path / "two.py"
    script.write_text(TWO_RANKS)
    results = start_two_ranks(script, tmp_path)
    if any("EADDRINUSE" in err or "address already in use" in err for _, _, err in results):
        results = start_two_ranks(script, tmp_path)  # the free port was taken meanwhile
    assert [code for code, _, _ in results] == [0, 0], results
    outs = [(json.loads(out), err) for _, out, err in results]
    (zero, err0), (one, err1) = outs
    assert "cpuaccel: gradient sync pg: the job was not started by an MPI launcher" in err0
    assert err1 == ""  # only rank 0 tells
    for seen in (zero, one):
        assert seen["sync"] == "pg" and seen["ddp"] == "DistributedDataParallel"
        assert seen["same_optimizers"] == [True]
        assert seen["loaded"] and seen["step"] == 4
        assert seen["sync_calls"] >= 8  # two models, four steps
    assert zero["params"] == one["params"]  # identical on both ranks, bit for bit
    assert len(zero["seen"]) == len(one["seen"]) == 16
    assert not set(zero["seen"]) & set(one["seen"])  # each rank its own shard
    assert (zero["has_file"], one["has_file"]) == (True, False)
