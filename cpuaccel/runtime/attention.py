"""Attention's precision under bf16 autocast: measured on the CPU at hand, per kind.

Autocast runs ``scaled_dot_product_attention`` in bf16. Whether that is the fast choice
depends on the CPU and on the shape: on a CPU with AVX512-BF16 and no AMX, PyTorch's
flash attention can be slower in bf16 than in fp32 at short sequences and faster at long
ones (docs/benchmarks.md, "Training"). No fixed rule fits both, so ``auto`` (the
default) measures: the first call of each kind
(sequence lengths rounded up to a power of two, head size, causal, masked, with or
without gradients) times its forward and backward both ways on copies of its own
inputs, and every later call of that kind takes the faster; fp32 must win by
:data:`MARGIN`, so a tie keeps autocast's bf16.

fp32 means the attention alone: q, k and v are upcast, the kernel runs in fp32 and its
output is cast back to bf16, so the layers around it see what they saw. Every rank takes
the same choice, so that the job trains one way: rank 0 measures and publishes it in the
process group's store (:class:`StoreAgreement`), the others read it without measuring; a
kind rank 0 does not meet within :data:`AGREE_WAIT_S` is left to autocast for every
rank. ``ctx.save`` records the choices in the checkpoint and ``ctx.load`` takes them
back (:meth:`AttentionChoice.reuse`), so a resumed run computes as the run it continues
did. A timing can still choose differently in two separate runs: ``deterministic``
(``init(deterministic=True)``, $CPUACCEL_DETERMINISTIC) leaves the attention to autocast
instead. Measuring draws no random numbers (the user's seeded stream is untouched) and
is bounded: :data:`BUDGET_S` seconds a kind, :data:`KINDS` kinds a process, and a kind
whose one call takes over :data:`LONG_S` stays bf16 unmeasured (long sequences, where
bf16 tends to be the faster). ``CPUACCEL_ATTENTION`` (or ``init(attention=...)``):
``auto``, ``autocast`` (bf16, as autocast runs it) or ``fp32``.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from cpuaccel.rank_settings import ATTENTION_ENV, check

MARGIN = 0.9  # fp32 is taken when its time is under 90% of bf16's
BUDGET_S = 2.0  # measuring one kind of attention stops after this many seconds
LONG_S = 0.5  # a kind whose one call takes longer is left to autocast, unmeasured
KINDS = 16  # kinds measured in a process; a bound for inputs of ever-new lengths
AGREE_WAIT_S = 30.0  # how long a rank waits for rank 0's choice of a kind
STORE_PREFIX = "cpuaccel/attention/"
SDPA = F.scaled_dot_product_attention
OPTIONS = ("attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")  # after q, k, v
FLOATS = (torch.float32, torch.bfloat16)

Kind = tuple[Any, ...]
Agreement = Callable[[Kind, Callable[[], bool]], bool]  # (kind, measure) -> fp32 or not


def attention_policy(value: str | None, environ: Mapping[str, str]) -> str:
    """``init(attention=...)``, else $CPUACCEL_ATTENTION, else ``auto``; checked here."""
    origin = "init(attention=...)" if value is not None else f"${ATTENTION_ENV}"
    text = value if value is not None else environ.get(ATTENTION_ENV, "")
    check(ATTENTION_ENV, text, origin)
    return text.strip().lower() or "auto"


@dataclass
class AttentionChoice:
    """The policy, and what ``auto`` measured so far (kind -> fp32 or not)."""

    policy: str = "auto"
    report: Callable[[str], None] | None = None  # a line for each measured kind
    chosen: dict[Kind, bool] = field(default_factory=dict)
    agree: Agreement | None = None  # the job's choice of a kind; None: this process's

    def wants_fp32(self, call: Call) -> bool:
        if self.policy != "auto":
            return self.policy == "fp32"
        kind = call.kind()
        if kind not in self.chosen:
            if len(self.chosen) >= KINDS:
                return False

            def measure() -> bool:
                return self._measure(call)

            self.chosen[kind] = self.agree(kind, measure) if self.agree else measure()
        return self.chosen[kind]

    def recorded(self) -> list[list[Any]]:
        """The choices so far, as a checkpoint keeps them: ``[[kind...], fp32]`` pairs."""
        return [[list(kind), fp32] for kind, fp32 in self.chosen.items()]

    def reuse(self, recorded: Any) -> int:
        """Take back choices :meth:`recorded` wrote (anything else is ignored); returns
        how many were taken."""
        taken = 0
        for item in recorded if isinstance(recorded, list) else []:
            if (
                isinstance(item, list)
                and len(item) == 2
                and isinstance(item[0], list)
                and all(isinstance(x, (int, bool)) for x in item[0])
                and isinstance(item[1], bool)
            ):
                self.chosen[tuple(item[0])] = item[1]
                taken += 1
        return taken

    def _measure(self, call: Call) -> bool:
        low, high = call.time_both()
        fp32 = high < MARGIN * low
        if self.report is not None and math.isinf(high):
            self.report(
                f"attention {list(call.q.shape)}: bf16 (a call took {low:.2f} s, over "
                f"{LONG_S} s: left to autocast, not measured)"
            )
        elif self.report is not None:
            self.report(
                f"attention {list(call.q.shape)}{' causal' if call.causal else ''}: "
                f"{'fp32' if fp32 else 'bf16'} (forward{'+backward' if call.grad else ''} "
                f"measured: bf16 {1000 * low:.1f} ms, fp32 {1000 * high:.1f} ms; "
                f"{ATTENTION_ENV}=autocast or fp32 fixes the choice)"
            )
        return fp32


@dataclass
class StoreAgreement:
    """Rank 0's choice of each kind, for every rank, through the process group's store.

    Rank 0 measures and sets the kind's key; the others poll for it (``check``, which
    never blocks) for at most ``wait_s`` seconds. Whoever sets the key first wins
    (``compare_set``): a rank that waited in vain sets autocast's bf16, and rank 0, when
    it meets the kind later, takes that too."""

    store: Any  # a torch.distributed Store
    rank: int
    wait_s: float = AGREE_WAIT_S

    def __call__(self, kind: Kind, measure: Callable[[], bool]) -> bool:
        key = STORE_PREFIX + ",".join(str(int(x)) for x in kind)
        if self.rank == 0:
            return self._settle(key, "fp32" if measure() else "bf16")
        deadline = time.monotonic() + self.wait_s
        while not self.store.check([key]):
            if time.monotonic() >= deadline:
                return self._settle(key, "bf16")
            time.sleep(0.01)
        return bool(self.store.get(key) == b"fp32")

    def _settle(self, key: str, mine: str) -> bool:
        return bool(self.store.compare_set(key, "", mine) == b"fp32")


@dataclass
class Call:
    """One ``scaled_dot_product_attention`` call under bf16 autocast, its arguments named."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    options: dict[str, Any]  # attn_mask, dropout_p, is_causal, scale, enable_gqa as given

    @classmethod
    def of(cls, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Call | None:
        """The call, when it is ours to route: three CPU tensors, fp32 or bf16, under
        CPU autocast to bf16 (which would run it in bf16); else None."""
        if len(args) < 3 or len(args) > 3 + len(OPTIONS):
            return None
        q, k, v = args[:3]
        if not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
            return None
        if not torch.is_autocast_enabled("cpu"):
            return None
        if torch.get_autocast_dtype("cpu") != torch.bfloat16:
            return None
        for t in (q, k, v):
            if t.is_nested or t.device.type != "cpu" or t.dtype not in FLOATS or t.dim() < 2:
                return None
        return cls(q, k, v, dict(kwargs, **dict(zip(OPTIONS, args[3:], strict=False))))

    @property
    def causal(self) -> bool:
        return bool(self.options.get("is_causal", False))

    @property
    def grad(self) -> bool:
        return torch.is_grad_enabled() and any(t.requires_grad for t in (self.q, self.k, self.v))

    def kind(self) -> Kind:
        """What decides the kernels' speed, lengths rounded up to a power of two so a
        varying length does not ask for a new measurement each step."""
        lengths = (_round_up(self.q.shape[-2]), _round_up(self.k.shape[-2]))
        mask = self.options.get("attn_mask") is not None
        return (self.q.shape[-1], *lengths, self.causal, mask, self.grad)

    def fp32(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **options: Any) -> Any:
        """The attention in fp32 (autocast off inside), its output in bf16 as autocast's."""
        mask = options.get("attn_mask")
        if isinstance(mask, torch.Tensor) and mask.is_floating_point():
            options["attn_mask"] = mask.float()
        with torch.autocast("cpu", enabled=False):
            return SDPA(q.float(), k.float(), v.float(), **options).to(torch.bfloat16)

    def run_fp32(self) -> Any:
        return self.fp32(self.q, self.k, self.v, **self.options)

    def time_both(self) -> tuple[float, float]:
        """Median seconds of the call as autocast runs it (bf16) and in fp32, alternating,
        on detached copies of its inputs and without dropout (no random numbers drawn).

        Timed in a thread of its own: autograd's saved-tensor hooks, autocast and grad
        mode are a thread's state, so the timing's graphs stay out of whatever the
        caller's thread has on (activation checkpointing counts the tensors a forward
        saves, and would count these), and the caller's state is untouched."""
        grad = self.grad
        q, k, v = (t.detach().clone().requires_grad_(grad) for t in (self.q, self.k, self.v))
        options = dict(self.options, dropout_p=0.0)
        outcome: list[tuple[float, float]] = []
        failed: list[BaseException] = []

        def timing() -> None:
            try:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    outcome.append(_time_both(self, q, k, v, options, grad))
            except BaseException as exc:  # raised again in the caller's thread
                failed.append(exc)

        thread = threading.Thread(target=timing, name="cpuaccel-attention-timing", daemon=True)
        thread.start()
        thread.join()
        if failed:
            raise failed[0]
        return outcome[0]


def _time_both(
    call: Call, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, options: Any, grad: bool
) -> tuple[float, float]:
    def once(upcast: bool) -> float:
        started = time.perf_counter()
        with torch.enable_grad() if grad else torch.no_grad():
            out = call.fp32(q, k, v, **options) if upcast else SDPA(q, k, v, **options)
            if grad:
                out.backward(torch.ones_like(out))
        return time.perf_counter() - started

    # The first call warms the kernel up (a first call in a process can be slow for that
    # alone); a second one as slow makes the kind long.
    if once(False) > LONG_S and (second := once(False)) > LONG_S:
        return second, math.inf
    once(True)
    times: dict[bool, list[float]] = {False: [], True: []}
    deadline = time.perf_counter() + BUDGET_S
    while len(times[True]) < 3 and (not times[True] or time.perf_counter() < deadline):
        for upcast in (False, True):
            times[upcast].append(once(upcast))
    return statistics.median(times[False]), statistics.median(times[True])


def _round_up(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


# The routing is the module's attribute itself, swapped while a context is open:
# nn.MultiheadAttention reaches the kernel through F.multi_head_attention_forward, a
# Python function that looks the name up in torch.nn.functional at each call, where a
# TorchFunctionMode would see only the outer function. Outside CPU autocast to bf16 the
# swapped function is the original. Code that bound the name at import (``from
# torch.nn.functional import scaled_dot_product_attention``) keeps autocast's bf16, and
# so does a graph torch.compile traces (no timing inside a trace).
_lock = threading.Lock()
_choices: list[AttentionChoice] = []  # the open entries'; the last one routes


@contextlib.contextmanager
def routed(choice: AttentionChoice) -> Iterator[None]:
    """Within: F.scaled_dot_product_attention follows ``choice`` under bf16 autocast
    (the innermost open entry's; the original comes back when the last one leaves)."""
    with _lock:
        _choices.append(choice)
        F.scaled_dot_product_attention = _routed_attention
    try:
        yield
    finally:
        with _lock:
            _choices.remove(choice)
            if not _choices:
                F.scaled_dot_product_attention = SDPA


def _routed_attention(*args: Any, **kwargs: Any) -> Any:
    choice = _choices[-1] if _choices else None
    if choice is not None and not torch.compiler.is_compiling():
        call = Call.of(args, kwargs)
        if call is not None and choice.wants_fp32(call):
            return call.run_fp32()
    return SDPA(*args, **kwargs)
