"""``cpuaccel.init()``: join the job (or start a world of one) and build its :class:`Context`.

::

    import cpuaccel

    ctx = cpuaccel.init(mixed_precision="bf16")
    model, optimizer, loader = ctx.prepare(model, optimizer, loader)
    for step, (x, y) in enumerate(loader, 1):
        with ctx.accumulate(model):
            with ctx.autocast():
                loss = loss_fn(model(x), y)
            ctx.backward(loss)
            if ctx.sync_gradients:
                ctx.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad()
        ctx.log(step=step, loss=ctx.mean(loss))
    ctx.save("checkpoint.pt", model=model, optimizer=optimizer, step=step)
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypedDict

import torch

from cpuaccel.errors import SettingError
from cpuaccel.rank_settings import DETERMINISTIC_ENV, check, switch
from cpuaccel.runtime import gradsync, group, master_weights
from cpuaccel.runtime.attention import attention_policy
from cpuaccel.runtime.backend import BackendChoice
from cpuaccel.runtime.context import Context, Settled
from cpuaccel.runtime.precision import AUTO, PRECISION_ENV, Precision, resolve_precision
from cpuaccel.runtime.trackers import TENSORBOARD_DIR, choose_trackers

if TYPE_CHECKING:
    from typing import Unpack

CBWR_ENV = "I_MPI_CBWR"  # Intel MPI's conditional numerical reproducibility
# The keywords the context takes as they are given.
PASSED_ON = ("ipex", "metrics_path", "find_unused_parameters", "gradient_as_bucket_view", "verbose")


class InitOptions(TypedDict, total=False):
    """``init``'s keywords beside ``mixed_precision``, each described there."""

    gradient_accumulation_steps: int
    seed: int | None
    backend: str | None
    grad_sync: str | None
    ipex: bool | None
    metrics_path: str | os.PathLike[str] | None
    find_unused_parameters: bool
    gradient_as_bucket_view: bool
    verbose: bool
    trackers: str | Sequence[str] | None
    attention: str | None
    grad_reduce: str | None
    deterministic: bool | None
    weights: str | None


def init(mixed_precision: str | None = None, **options: Unpack[InitOptions]) -> Context:
    """Join the job (or start a world of one) and return its :class:`Context`.

    - ``mixed_precision``: ``"auto"`` (bf16 where the CPU has AMX or AVX512-BF16, else
      fp32), ``"bf16"`` (autocast to bfloat16 on the CPU, native or not) or ``"no"``
      (fp32); default $CPUACCEL_MIXED_PRECISION (what ``cpuaccel run`` exports from its
      flag, the project file or an Accelerate config), else ``"auto"``;
    - ``backend``: the process group's; default $CPUACCEL_BACKEND, else ``ccl`` when
      oneCCL's bindings import and match torch, else ``gloo``;
    - ``grad_sync``: ``"mpi"`` or ``"pg"``; default $CPUACCEL_GRAD_SYNC, else MPI when
      the job was started by an MPI launcher and mpi4py works, else the process group;
    - ``ipex``: None uses IPEX when it imports and matches torch; False never; True
      requires it;
    - ``gradient_as_bucket_view``: True (default) makes each ``.grad`` a view into DDP's
      gradient bucket, which saves copying every gradient out of the bucket after each
      sync (same values; False restores DDP's own default, e.g. for code that calls
      ``grad.detach_()``);
    - ``seed``: seeds torch on every rank (and the data loaders' shuffles);
    - ``trackers``: where ``ctx.log`` also writes, as Accelerate's ``log_with``:
      ``["tensorboard"]`` writes TensorBoard event files into ``<run dir>/tensorboard/``
      on rank 0 (needs ``pip install 'cpuaccel[tensorboard]'``); default
      $CPUACCEL_TRACKERS (comma-separated), else none;
    - ``attention``: under bf16, ``"auto"`` runs each kind of attention
      (``scaled_dot_product_attention``) in bf16 or fp32, whichever its first call
      measured faster on this CPU; ``"autocast"`` leaves it in bf16; ``"fp32"`` always
      upcasts it; default $CPUACCEL_ATTENTION, else ``"auto"``. Rank 0 measures and
      every rank takes its choice; a checkpoint saved by ``ctx.save`` records the
      choices and ``ctx.load`` reuses them;
    - ``grad_reduce``: ``"ordered"`` sums every gradient element in rank order, so a
      resumed run matches an uninterrupted one bit for bit; ``"library"`` uses the MPI
      library's or process group's allreduce as it is (its order can change with the
      bucket layout); default $CPUACCEL_GRAD_REDUCE, else ``"ordered"``;
    - ``deterministic``: True makes no choice by timing (attention stays as autocast
      runs it unless ``attention="fp32"``), asks Intel MPI for reproducible reductions
      (``I_MPI_CBWR=1`` unless set) and turns on
      ``torch.use_deterministic_algorithms`` (warning, not failing, on an op without a
      deterministic kernel); default $CPUACCEL_DETERMINISTIC, else False;
    - ``weights``: under bf16, ``"fp32"`` keeps the parameters fp32 (autocast casts
      them each step); ``"bf16"`` makes them bf16 and has each optimizer update fp32
      master copies (:mod:`cpuaccel.runtime.master_weights`: checkpoints keep the fp32
      values, and a resumed run is exact); default $CPUACCEL_WEIGHTS, else ``"fp32"``.

    Rank, world size and rendezvous come from the launcher's environment (``cpuaccel
    run``, mpirun, Slurm, torchrun); without one this is a world of one process. A
    process group the script initialized itself is used as it is.
    """
    unknown = [name for name in options if name not in InitOptions.__annotations__]
    if unknown:  # as Python says it of a keyword the signature does not name
        raise TypeError(f"init() got an unexpected keyword argument {unknown[0]!r}")
    steps = options.get("gradient_accumulation_steps", 1)
    seed = options.get("seed")
    if mixed_precision is None:
        mixed_precision = os.environ.get(PRECISION_ENV) or AUTO
    precision = resolve_precision(mixed_precision)
    # Before joining: a bad tracker fails early.
    tracker_names = choose_trackers(options.get("trackers"), os.environ)
    fixed = deterministic_setting(options.get("deterministic"), os.environ)
    attention_name = attention_policy(options.get("attention"), os.environ)
    weights_name = master_weights.weights_policy(options.get("weights"), os.environ)
    master_weights.check_accumulation(weights_name, steps, precision.dtype)
    ordered = gradsync.reduce_in_order(options.get("grad_reduce"), os.environ)
    if fixed:
        if not ordered:
            raise SettingError(
                "deterministic=True needs grad_reduce='ordered' (the library's allreduce "
                "sums in an order its algorithm picks): drop grad_reduce='library'"
            )
        if attention_name == "auto":
            attention_name = "autocast"
        os.environ.setdefault(CBWR_ENV, "1")  # read by Intel MPI at MPI_Init, below
        torch.use_deterministic_algorithms(True, warn_only=True)
    env, choice, owns = group.place(options.get("backend"))
    # MPI_Init first, if MPI
    sync = gradsync.choose_grad_sync(options.get("grad_sync"), env, os.environ)
    if owns:
        group.create(choice.name, env)
        atexit.register(group.leave)
    if seed is not None:
        torch.manual_seed(seed)
    passed: dict[str, Any] = {k: v for k, v in options.items() if k in PASSED_ON}
    policies = (tracker_names, attention_name, ordered, fixed, weights_name)
    settled = Settled(precision.dtype, steps, seed or 0, owns, *policies, **passed)
    ctx = Context(env, choice, sync, settled)
    _note_choices(ctx, choice, sync, precision)
    if weights_name != ctx.weights:
        ctx.note(f"weights {weights_name} not used: the precision is fp32")
    return ctx


def deterministic_setting(value: bool | None, environ: Mapping[str, str]) -> bool:
    """``init(deterministic=...)``, else $CPUACCEL_DETERMINISTIC (checked), else False."""
    if value is not None:
        return bool(value)
    text = environ.get(DETERMINISTIC_ENV, "")
    check(DETERMINISTIC_ENV, text, f"${DETERMINISTIC_ENV}")
    return switch(text)


def _note_choices(
    ctx: Context, choice: BackendChoice, sync: gradsync.SyncChoice, precision: Precision
) -> None:
    """One line per decision init made, with its reason (rank 0, unless ``verbose=False``)."""
    ctx.note(f"backend {choice.name}: {choice.reason} ({ctx.world_size} rank(s))")
    if ctx.world_size > 1:
        order = (
            "each element summed in rank order"
            if ctx.grad_reduce == "ordered"
            else "the library's allreduce"
        )
        ctx.note(f"gradient sync {sync.mode}: {sync.reason}; {order}")
    if ctx.deterministic:
        ctx.note(
            "deterministic: no choice made by timing, "
            f"{CBWR_ENV}={os.environ.get(CBWR_ENV)}, torch's deterministic algorithms"
        )
    if precision.note is not None:
        ctx.note(precision.note)
    if ctx.trackers:
        where = ctx.metrics_path.parent / TENSORBOARD_DIR
        ctx.note(f"trackers {', '.join(ctx.trackers)}: event files in {where}")
