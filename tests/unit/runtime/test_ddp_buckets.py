"""prepare's DDP wrapping: gradients as views into DDP's buckets (``init``'s default).

A world of one (gloo) stands in for the job: DDP's reducer, its buckets and the comm
hook run as they do with more ranks; the averages are over one rank.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

import cpuaccel
from cpuaccel.runtime import gradsync
from cpuaccel.runtime.context import Context
from cpuaccel.runtime.prepare import wrap_ddp
from tests.unit.runtime.world import LAUNCH_VARS


@pytest.fixture
def ctx(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Context]:
    for name in LAUNCH_VARS:
        monkeypatch.delenv(name, raising=False)
    assert not dist.is_initialized()
    context = cpuaccel.init("no", seed=0, metrics_path=tmp_path / "metrics.jsonl")
    yield context
    context.close()


def train(
    model: nn.Module, *, bucket_view: bool, set_to_none: bool
) -> tuple[list[torch.Tensor], int]:
    """Three AdamW steps through DDP; (the parameters after, gradient storages seen)."""
    ddp = wrap_ddp(
        model, gradsync.PgState(world_size=1), gradsync.pg_hook,
        find_unused=False, bucket_view=bucket_view,
    )  # fmt: skip
    assert ddp.gradient_as_bucket_view is bucket_view
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    storages: set[int] = set()
    for step in range(3):
        x = torch.randn(4, 6, generator=torch.Generator().manual_seed(step))
        ddp(x).pow(2).sum().backward()
        grads = [p.grad for p in model.parameters()]
        storages = {g.untyped_storage().data_ptr() for g in grads if g is not None}
        optimizer.step()
        optimizer.zero_grad(set_to_none=set_to_none)
    return [p.detach().clone() for p in model.parameters()], len(storages)


@pytest.mark.parametrize("set_to_none", [True, False])
def test_bucket_views_train_bit_for_bit_as_ddp_copies(ctx: Context, set_to_none: bool) -> None:
    """Views skip DDP's copy of each bucket back into the grads, nothing else: the same
    parameters after three steps, bit for bit, as DDP's default (each grad its own
    storage), whether zero_grad sets None or zeros."""
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))
    viewed, view_storages = train(copy.deepcopy(base), bucket_view=True, set_to_none=set_to_none)
    copied, copy_storages = train(copy.deepcopy(base), bucket_view=False, set_to_none=set_to_none)
    assert (view_storages, copy_storages) == (1, 4)  # one bucket; four separate grads
    for a, b in zip(viewed, copied, strict=True):
        assert torch.equal(a, b)


def test_prepare_uses_bucket_views_unless_init_says_not(ctx: Context) -> None:
    """A world of one needs no DDP; posing as two, prepare wraps with views by default,
    and ``init(gradient_as_bucket_view=False)`` (the context's flag) turns them off."""
    assert ctx.gradient_as_bucket_view is True
    ctx.world_size = 2  # the process group stays one rank: DDP averages over it alone
    ctx._pg.world_size = 1
    wrapped = ctx.prepare(nn.Linear(3, 2))
    assert isinstance(wrapped, nn.parallel.DistributedDataParallel)
    assert wrapped.gradient_as_bucket_view is True
    ctx.gradient_as_bucket_view = False
    assert ctx.prepare(nn.Linear(3, 2)).gradient_as_bucket_view is False


def test_init_takes_the_opt_out(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in LAUNCH_VARS:
        monkeypatch.delenv(name, raising=False)
    with cpuaccel.init("no", gradient_as_bucket_view=False, metrics_path=tmp_path / "m") as ctx:
        assert ctx.gradient_as_bucket_view is False
