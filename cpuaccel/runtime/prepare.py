"""What ``ctx.prepare`` does to models and optimizers: IPEX (when usable), then DDP.

Optimizers are matched to the model whose parameters they hold, so any number of
model–optimizer pairs can be prepared together, in any order; an optimizer keeps its
identity unless IPEX hands back a new one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch
from torch import nn


@dataclass
class Pairing:
    """Indexes (into prepare's arguments) of each model's own optimizer, if any."""

    optimizer_of: dict[int, int]  # model index -> optimizer index
    shared: list[int]  # optimizers holding parameters of several models


def pair(objects: Sequence[Any]) -> Pairing:
    models = {i: o for i, o in enumerate(objects) if isinstance(o, nn.Module)}
    owners = {i: {id(p) for p in m.parameters()} for i, m in models.items()}
    optimizer_of: dict[int, int] = {}
    shared: list[int] = []
    for j, opt in enumerate(objects):
        if not isinstance(opt, torch.optim.Optimizer):
            continue
        held = {id(p) for group in opt.param_groups for p in group["params"]}
        hits = [i for i, params in owners.items() if params & held]
        if len(hits) == 1 and hits[0] not in optimizer_of:
            optimizer_of[hits[0]] = j
        elif len(hits) > 1:
            shared.append(j)
    return Pairing(optimizer_of, shared)


def apply_ipex(
    ipex: ModuleType, objects: list[Any], pairing: Pairing, dtype: torch.dtype | None
) -> tuple[int, list[str]]:
    """``ipex.optimize`` each model (with its optimizer) in ``objects``, in place.

    Returns how many models were optimized and why the others were not.
    """
    done, skipped = 0, []
    for i, model in enumerate(objects):
        if not isinstance(model, nn.Module) or isinstance(
            model, nn.parallel.DistributedDataParallel
        ):
            continue
        j = pairing.optimizer_of.get(i)
        if model.training and j is None:
            skipped.append(f"argument {i + 1} ({type(model).__name__}) has no optimizer of its own")
            continue
        kwargs: dict[str, Any] = {"dtype": dtype or torch.float32}
        if j is not None:
            objects[i], objects[j] = ipex.optimize(model, optimizer=objects[j], **kwargs)
        else:
            objects[i] = ipex.optimize(model, **kwargs)
        done += 1
    return done, skipped


def wrap_ddp(
    model: nn.Module, state: Any, hook: Any, *, find_unused: bool, bucket_view: bool
) -> nn.parallel.DistributedDataParallel:
    """``model`` in DDP, its buckets averaged by ``hook``.

    ``bucket_view``: each parameter's ``.grad`` is a view into DDP's gradient bucket, so
    the averaged bucket *is* the gradients: DDP skips copying every bucket back into the
    ``.grad`` tensors after each sync, one pass over all gradients a step. The values
    are the same bit for bit; only ``grad.detach_()`` on such a view is refused by
    torch.
    """
    wrapped = nn.parallel.DistributedDataParallel(
        model, find_unused_parameters=find_unused, gradient_as_bucket_view=bucket_view
    )
    wrapped.register_comm_hook(state, hook)
    return wrapped


def needs_ddp(model: nn.Module) -> bool:
    return not isinstance(model, nn.parallel.DistributedDataParallel) and any(
        p.requires_grad for p in model.parameters()
    )
