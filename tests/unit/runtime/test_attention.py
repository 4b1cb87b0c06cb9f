"""Attention's precision under bf16 autocast (cpuaccel/runtime/attention.py).

The speed comparison itself is the CPU's: these tests pin what is decided from it
(by giving ``Call.time_both`` fixed times) and check the rest for real: the fp32 route's
values and gradients, the routing's scope, the measuring's bounds and its randomness.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cpuaccel
from cpuaccel.errors import SettingError
from cpuaccel.runtime import attention
from cpuaccel.runtime.attention import (
    AttentionChoice,
    Call,
    StoreAgreement,
    attention_policy,
    routed,
)


@pytest.fixture
def qkv() -> Iterator[tuple[torch.Tensor, ...]]:
    gen = torch.Generator().manual_seed(1)
    yield tuple(
        torch.randn(2, 3, 24, 16, generator=gen).bfloat16().requires_grad_() for _ in range(3)
    )


def fixed_times(monkeypatch: pytest.MonkeyPatch, bf16: float, fp32: float) -> list[Call]:
    measured: list[Call] = []

    def time_both(self: Call) -> tuple[float, float]:
        measured.append(self)
        return bf16, fp32

    monkeypatch.setattr(Call, "time_both", time_both)
    return measured


def test_the_policy_comes_from_init_then_the_environment_and_is_checked() -> None:
    assert attention_policy(None, {}) == "auto"
    assert attention_policy(None, {"CPUACCEL_ATTENTION": " FP32 "}) == "fp32"
    assert attention_policy("autocast", {"CPUACCEL_ATTENTION": "fp32"}) == "autocast"
    with pytest.raises(ValueError) as error:
        attention_policy(None, {"CPUACCEL_ATTENTION": "fp16"})
    assert str(error.value) == (
        "$CPUACCEL_ATTENTION: 'fp16' is not a choice (attention's precision under bf16); "
        "use auto, autocast or fp32"
    )
    with pytest.raises(ValueError, match=r"^init\(attention=\.\.\.\): 'bf32' is not"):
        attention_policy("bf32", {})


def test_init_refuses_a_bad_policy_before_joining(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.setenv("CPUACCEL_ATTENTION", "fastest")
    with pytest.raises(ValueError, match=r"^\$CPUACCEL_ATTENTION: 'fastest'"):
        cpuaccel.init(metrics_path=tmp_path / "m")
    assert not (tmp_path / "m").exists()


def test_only_bf16_autocast_calls_on_the_cpu_are_routed(qkv: tuple[torch.Tensor, ...]) -> None:
    q, k, v = qkv
    assert Call.of((q, k, v), {}) is None  # no autocast
    with torch.autocast("cpu", dtype=torch.float16):
        assert Call.of((q, k, v), {}) is None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        call = Call.of((q, k, v, None, 0.0, True), {"scale": 0.5})
        assert call is not None
        options = {"attn_mask": None, "dropout_p": 0.0, "is_causal": True, "scale": 0.5}
        assert call.options == options
        assert call.causal and call.grad
        # Lengths are rounded up to a power of two: 17-32 tokens are one kind.
        assert call.kind() == (16, 32, 32, True, False, True)
        assert Call.of((q.half(), k, v), {}) is None
        nested = torch.nested.nested_tensor([q[0].detach(), q[1].detach()], layout=torch.jagged)
        assert Call.of((nested, nested, nested), {}) is None
        assert Call.of((q, k), {}) is None
        with torch.no_grad():
            assert not call.grad


def test_fp32_route_matches_an_fp32_reference_and_gives_bf16_gradients(
    qkv: tuple[torch.Tensor, ...],
) -> None:
    q, k, v = qkv
    mask = torch.triu(torch.full((24, 24), float("-inf")), diagonal=1)
    reference = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask)
    choice = AttentionChoice("fp32")
    with torch.autocast("cpu", dtype=torch.bfloat16), routed(choice):
        out = F.scaled_dot_product_attention(q, k, v, mask.bfloat16())
    assert out.dtype == torch.bfloat16
    # bf16's own rounding of the output, not more: the kernel ran in fp32.
    assert torch.allclose(out.float(), reference, atol=1e-2, rtol=1e-2)
    out.float().sum().backward()
    assert q.grad is not None and q.grad.dtype == torch.bfloat16
    assert k.grad is not None and v.grad is not None


def test_routing_lasts_as_long_as_the_outermost_entry() -> None:
    original = F.scaled_dot_product_attention
    choice = AttentionChoice("fp32")
    with routed(choice):
        inside = F.scaled_dot_product_attention
        assert inside is not original
        with routed(choice):
            assert F.scaled_dot_product_attention is inside
        assert F.scaled_dot_product_attention is inside
    assert F.scaled_dot_product_attention is original
    with pytest.raises(RuntimeError), routed(choice):
        raise RuntimeError("a step that fails")
    assert F.scaled_dot_product_attention is original


def test_auto_measures_each_kind_once_and_takes_fp32_only_by_the_margin(
    monkeypatch: pytest.MonkeyPatch, qkv: tuple[torch.Tensor, ...]
) -> None:
    measured = fixed_times(monkeypatch, bf16=2.0, fp32=1.0)
    lines: list[str] = []
    choice = AttentionChoice("auto", report=lines.append)
    q, k, v = qkv
    with torch.autocast("cpu", dtype=torch.bfloat16), routed(choice):
        for _ in range(3):
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
        F.scaled_dot_product_attention(q[:, :, :20], k[:, :, :20], v[:, :, :20], is_causal=True)
    assert len(measured) == 1  # 20 and 24 tokens: the same kind
    assert choice.chosen == {(16, 32, 32, True, False, True): True}
    assert lines == [
        "attention [2, 3, 24, 16] causal: fp32 (forward+backward measured: bf16 2000.0 ms, "
        "fp32 1000.0 ms; CPUACCEL_ATTENTION=autocast or fp32 fixes the choice)"
    ]
    fixed_times(monkeypatch, bf16=1.0, fp32=0.95)  # faster, but inside the margin
    close = AttentionChoice("auto")
    with torch.autocast("cpu", dtype=torch.bfloat16), routed(close):
        F.scaled_dot_product_attention(q, k, v)
    assert close.chosen == {(16, 32, 32, False, False, True): False}


def test_auto_stops_measuring_after_its_bound_of_kinds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    measured = fixed_times(monkeypatch, bf16=2.0, fp32=1.0)
    choice = AttentionChoice("auto")
    with torch.autocast("cpu", dtype=torch.bfloat16), routed(choice), torch.no_grad():
        for dim in range(1, attention.KINDS + 5):
            q = torch.zeros(1, 1, 2, dim, dtype=torch.bfloat16)
            F.scaled_dot_product_attention(q, q, q)
    assert len(measured) == attention.KINDS == len(choice.chosen)


def test_measuring_is_real_bounded_and_draws_no_random_numbers(
    qkv: tuple[torch.Tensor, ...],
) -> None:
    q, k, v = qkv
    state = torch.get_rng_state()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        call = Call.of((q, k, v, None, 0.5), {})  # dropout: not used while timing
        assert call is not None
        bf16, fp32 = call.time_both()
    assert 0 < bf16 < attention.BUDGET_S and 0 < fp32 < attention.BUDGET_S
    assert torch.equal(torch.get_rng_state(), state)
    assert q.grad is None  # timed on copies


def test_a_context_routes_multi_head_attention_in_bf16_only(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.delenv("CPUACCEL_ATTENTION", raising=False)
    measured = fixed_times(monkeypatch, bf16=2.0, fp32=1.0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    x = torch.randn(2, 8, 16)
    before = list(attention._choices)  # contexts other tests left open, if any
    with cpuaccel.init(mixed_precision="no", metrics_path=tmp_path / "a", verbose=False) as ctx:
        assert attention._choices == before
        with ctx.autocast():
            layer(x)
    assert measured == []
    with cpuaccel.init(mixed_precision="bf16", metrics_path=tmp_path / "b", verbose=False) as ctx:
        assert attention._choices == [*before, ctx.attention]
        assert F.scaled_dot_product_attention is not attention.SDPA
        with ctx.autocast():
            out = layer(x)  # nn.MultiheadAttention, through F.multi_head_attention_forward
        assert len(measured) == 1 and list(ctx.attention.chosen.values()) == [True]
        out.float().sum().backward()
    assert attention._choices == before  # closed: its routing is gone
    if not before:
        assert F.scaled_dot_product_attention is attention.SDPA
    with cpuaccel.init(
        mixed_precision="bf16", attention="autocast", metrics_path=tmp_path / "c", verbose=False
    ):
        assert attention._choices == before


def test_a_recomputed_forward_takes_the_forwards_route(tmp_path: Any) -> None:
    """Activation checkpointing recomputes the forward during backward, outside the
    script's autocast block: the routing lasts the context's life, so the recomputation
    saves fp32 tensors as the forward did (checkpoint checks they match)."""
    from torch.utils.checkpoint import checkpoint

    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    x = torch.randn(2, 8, 16, requires_grad=True)
    init = dict(mixed_precision="bf16", attention="fp32", verbose=False)
    with cpuaccel.init(metrics_path=tmp_path / "m", **init) as ctx:  # type: ignore[arg-type]
        with ctx.autocast():
            out = checkpoint(layer, x, use_reentrant=False)
        out.float().sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_measuring_inside_a_checkpointed_forward_leaves_its_count_alone(
    tmp_path: Any,
) -> None:
    """The first call of a kind measured inside a checkpointed region: the timing's own
    graphs must not be counted with the region's saved tensors (checkpoint compares the
    count with its recomputation's, which measures nothing)."""
    from torch.utils.checkpoint import checkpoint

    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    x = torch.randn(2, 8, 16, requires_grad=True)
    with cpuaccel.init(mixed_precision="bf16", metrics_path=tmp_path / "m", verbose=False) as ctx:
        with ctx.autocast():
            out = checkpoint(layer, x, use_reentrant=False)
        out.float().sum().backward()
        assert len(ctx.attention.chosen) == 1  # measured, inside the region
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_a_long_call_is_left_to_autocast_unmeasured(
    monkeypatch: pytest.MonkeyPatch, qkv: tuple[torch.Tensor, ...]
) -> None:
    monkeypatch.setattr(attention, "LONG_S", 0.0)  # every call counts as long
    q, k, v = qkv
    lines: list[str] = []
    choice = AttentionChoice("auto", report=lines.append)
    with torch.autocast("cpu", dtype=torch.bfloat16), routed(choice):
        F.scaled_dot_product_attention(q, k, v)
    assert list(choice.chosen.values()) == [False]
    assert len(lines) == 1
    assert re.fullmatch(
        r"attention \[2, 3, 24, 16\]: bf16 \(a call took [0-9.]+ s, over 0.0 s: left to "
        r"autocast, not measured\)",
        lines[0],
    )


# ---------------------------------------------------------------- one choice for the job


def test_every_rank_takes_rank_0s_measured_choice_through_the_store() -> None:
    store = torch.distributed.HashStore()
    kind = (16, 32, 32, True, False, True)
    measured: list[int] = []

    def measure(rank: int, fp32: bool) -> Any:
        def run() -> bool:
            measured.append(rank)
            return fp32

        return run

    peers: list[bool] = []
    waiting = threading.Thread(
        target=lambda: peers.append(StoreAgreement(store, 1)(kind, measure(1, False)))
    )
    waiting.start()  # rank 1 asks first and waits for rank 0's measurement
    assert StoreAgreement(store, 0)(kind, measure(0, True)) is True
    waiting.join(timeout=10)
    assert peers == [True] and measured == [0]


def test_a_kind_rank_0_does_not_meet_in_time_is_autocasts_on_every_rank() -> None:
    store = torch.distributed.HashStore()
    kind = (16, 64, 64, False, False, False)
    late = StoreAgreement(store, 1, wait_s=0.05)
    assert late(kind, lambda: pytest.fail("only rank 0 measures")) is False
    # Rank 0 meets the kind afterwards, measures fp32 faster, and still takes bf16.
    assert StoreAgreement(store, 0)(kind, lambda: True) is False


def test_a_checkpoint_keeps_the_choices_and_a_load_reuses_them(
    monkeypatch: pytest.MonkeyPatch, clean_env: None, tmp_path: Any
) -> None:
    monkeypatch.delenv("CPUACCEL_ATTENTION", raising=False)
    measured = fixed_times(monkeypatch, bf16=2.0, fp32=1.0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    x = torch.randn(2, 8, 16)
    with cpuaccel.init("bf16", metrics_path=tmp_path / "a", verbose=False) as ctx:
        with ctx.autocast():
            layer(x)
        chosen = dict(ctx.attention.chosen)
        assert list(chosen.values()) == [True] and len(measured) == 1
        ctx.save(tmp_path / "checkpoint.pt", model=layer, step=3)
    measured.clear()
    with cpuaccel.init("bf16", metrics_path=tmp_path / "b", verbose=False) as ctx:
        state = ctx.load(tmp_path / "checkpoint.pt", model=layer)
        assert "cpuaccel_attention" not in state and state["step"] == 3
        assert ctx.attention.chosen == chosen
        with ctx.autocast():
            layer(x)
    assert measured == []  # the recorded choice, not a new timing
    fixed = AttentionChoice("auto")
    assert fixed.reuse([[[16, 8], "yes"], "junk", [[1, 2, 3], False]]) == 1
    assert fixed.chosen == {(1, 2, 3): False}


def test_deterministic_makes_no_choice_by_timing(
    monkeypatch: pytest.MonkeyPatch, clean_env: None, tmp_path: Any
) -> None:
    monkeypatch.setenv("I_MPI_CBWR", "unset below")  # restored (removed) after the test
    monkeypatch.delenv("I_MPI_CBWR")
    monkeypatch.setenv("CPUACCEL_DETERMINISTIC", "1")
    measured = fixed_times(monkeypatch, bf16=2.0, fp32=1.0)
    lines: list[str] = []
    monkeypatch.setattr("cpuaccel.runtime.context.Context.note", lambda _, line: lines.append(line))
    try:
        with cpuaccel.init("bf16", metrics_path=tmp_path / "a") as ctx:
            assert ctx.deterministic and ctx.attention.policy == "autocast"
            assert torch.are_deterministic_algorithms_enabled()
            layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
            with ctx.autocast():
                layer(torch.randn(2, 8, 16))
    finally:
        torch.use_deterministic_algorithms(False)
    assert measured == [] and os.environ["I_MPI_CBWR"] == "1"
    assert any(line.startswith("deterministic: no choice made by timing") for line in lines)
    with pytest.raises(SettingError, match="deterministic=True needs grad_reduce='ordered'"):
        cpuaccel.init(grad_reduce="library", metrics_path=tmp_path / "b")
    monkeypatch.setenv("CPUACCEL_DETERMINISTIC", "maybe")
    with pytest.raises(SettingError, match=r"^\$CPUACCEL_DETERMINISTIC: 'maybe' is not a choice"):
        cpuaccel.init(metrics_path=tmp_path / "c")
