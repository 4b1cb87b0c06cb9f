"""bf16 weights with fp32 master copies: ``init(weights="bf16")`` under bf16 precision.

By default (``weights="fp32"``) a model's parameters stay fp32 and autocast casts each
weight to bf16 where an op runs in bf16, every forward, and casts its gradient back.
With ``weights="bf16"``, ``ctx.prepare`` turns each trained model's parameters into bf16
and gives its optimizer fp32 copies of them (the master weights) to update instead:

- the forward and backward run on the bf16 parameters (no weight casts; the ops autocast
  keeps in fp32, such as layer norm and softmax, still compute in fp32), so the
  activations of ops autocast leaves alone (embeddings, residual additions) are bf16 too;
- the gradients arrive in bf16 (and are averaged across ranks as bf16 buckets, summed in
  fp32); just before ``optimizer.step()`` they move into the masters as fp32, the step
  updates the masters in fp32, and the parameters become the masters rounded to bf16;
- ``model.state_dict()`` holds the fp32 masters, and ``model.load_state_dict`` sets both
  the masters and the parameters, so ``ctx.save``/``ctx.load`` (and plain
  ``torch.save``) keep full precision and a resumed run continues exactly where the
  uninterrupted one was: the bf16 parameters are always the masters rounded.

A model is left as it is (with a note) when it has no optimizer of its own, its
optimizer also holds other parameters, or its parameters are not all fp32 (IPEX or the
script cast them). Gradient accumulation over several
micro-steps would sum the gradients in bf16, so ``init`` refuses it with this setting.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from cpuaccel.errors import SettingError
from cpuaccel.rank_settings import WEIGHTS_ENV, check

FP32 = "fp32"
BF16 = "bf16"


def weights_policy(value: str | None, environ: Mapping[str, str]) -> str:
    """``init(weights=...)``, else $CPUACCEL_WEIGHTS, else ``fp32``; checked either way."""
    origin = "init(weights=...)" if value is not None else f"${WEIGHTS_ENV}"
    text = value if value is not None else environ.get(WEIGHTS_ENV, "")
    check(WEIGHTS_ENV, text, origin)
    return text.strip().lower() or FP32


def check_accumulation(policy: str, steps: int, dtype: torch.dtype | None) -> None:
    """Refuse bf16 weights with gradient accumulation: the micro-steps' gradients would be
    summed in bf16 (DDP accumulates them in the parameters' dtype)."""
    if policy == BF16 and dtype == torch.bfloat16 and steps > 1:
        raise SettingError(
            f"weights='bf16' with gradient_accumulation_steps={steps} would sum the "
            "micro-steps' gradients in bf16: use weights='fp32' (the default) to accumulate"
        )


class MasterWeights:
    """One model's bf16 parameters and its optimizer's fp32 copies of them."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model = model
        self.optimizer = optimizer
        self.params: list[torch.Tensor] = []
        self.masters: list[torch.Tensor] = []
        by_id: dict[int, torch.Tensor] = {}
        for group in optimizer.param_groups:
            for i, param in enumerate(group["params"]):
                master = param.detach().clone().to(torch.float32).requires_grad_(True)
                by_id[id(param)] = master
                if param in optimizer.state:  # state a user loaded before prepare
                    optimizer.state[master] = optimizer.state.pop(param)
                group["params"][i] = master
                self.params.append(param)
                self.masters.append(master)
        self.master_of = by_id
        # The masters' fp32 gradients, allocated once: a fresh tensor a step costs its
        # page faults again every step.
        self.grads = [torch.empty_like(master) for master in self.masters]
        with torch.no_grad():
            for param in self.params:
                param.data = param.data.to(torch.bfloat16)
                param.grad = None
        # Functions, not bound methods: torch marks a state-dict hook with an attribute.
        self._handles = [
            optimizer.register_step_pre_hook(lambda *_: self.pull_grads()),
            optimizer.register_step_post_hook(lambda *_: self.push()),
            model.register_state_dict_post_hook(lambda *a: self._state_dict_hook(*a)),  # type: ignore[no-untyped-call]
            model.register_load_state_dict_pre_hook(lambda *a: self._load_hook(*a)),  # type: ignore[no-untyped-call]
        ]

    def pull_grads(self) -> None:
        """Move the bf16 gradients into the masters as fp32 (added to what a master holds
        already), leaving the parameters with none; a parameter without one keeps its
        master's as it is."""
        for param, master, kept in zip(self.params, self.masters, self.grads, strict=True):
            grad = param.grad
            if grad is None:
                continue
            if master.grad is None:
                master.grad = kept.copy_(grad)
            else:
                master.grad.add_(grad)
            param.grad = None

    def push(self) -> None:
        """After a step: the parameters become the updated masters rounded to bf16, and
        the masters' gradients are dropped (the next step's arrive on the parameters)."""
        with torch.no_grad():
            torch._foreach_copy_(self.params, self.masters)
        for master in self.masters:
            master.grad = None

    def grads_for(self, params: Iterable[torch.Tensor]) -> list[torch.Tensor]:
        """``params`` with each of this model's parameters replaced by its master, after
        moving the gradients there (what clipping should see: fp32 gradients)."""
        self.pull_grads()
        return [self.master_of.get(id(p), p) for p in params]

    def _named(self, module: nn.Module, prefix: str) -> Iterable[tuple[str, torch.Tensor]]:
        for name, param in module.named_parameters(prefix=prefix, remove_duplicate=False):
            master = self.master_of.get(id(param))
            if master is not None:
                yield name.removeprefix("."), master

    def _state_dict_hook(
        self, module: nn.Module, state: dict[str, Any], prefix: str, _meta: Any
    ) -> None:
        """The fp32 masters in place of the bf16 parameters, so a checkpoint keeps full
        precision (and loads into an fp32 model as it is)."""
        for name, master in self._named(module, prefix.rstrip(".")):
            if name in state:
                state[name] = master.detach()

    def _load_hook(self, module: nn.Module, state: Mapping[str, Any], prefix: str, *_: Any) -> None:
        """Loading sets the masters from the checkpoint's values (fp32, or bf16 from a
        checkpoint saved without masters); torch's own load rounds the parameters."""
        with torch.no_grad():
            for name, master in self._named(module, prefix.rstrip(".")):
                value = state.get(name)
                if isinstance(value, torch.Tensor) and value.shape == master.shape:
                    master.copy_(value)


def same_on_every_rank(model: nn.Module) -> None:
    """Rank 0's fp32 parameters on every rank, before they are rounded to bf16: DDP only
    broadcasts the module's values at wrapping, which would be the bf16 ones, and the
    masters must agree too."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    params = [p.data for p in model.parameters()]
    if not params:
        return
    flat = torch.cat([p.reshape(-1).to(torch.float32) for p in params])
    dist.broadcast(flat, src=0)
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
