"""ctx.prepare in a world of one: model/optimizer pairs train together, paired by their
parameters, one object given back alone; and gradient accumulation syncing every nth
micro-step."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import cpuaccel
from cpuaccel.runtime.context import Context
from cpuaccel.runtime.data import ShardedLoader
from cpuaccel.runtime.prepare import pair


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
