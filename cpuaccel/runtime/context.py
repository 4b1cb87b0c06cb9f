"""The :class:`Context` that ``cpuaccel.init()`` returns: a rank's training helpers.

``init`` itself (joining the job) is in :mod:`cpuaccel.runtime.start`; this module holds
what a training script calls on the context afterwards: ``prepare``, ``accumulate``,
``autocast``, ``backward``, ``mean``, ``save``/``load``, ``log`` and ``close``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from cpuaccel import _progress
from cpuaccel.errors import SettingError
from cpuaccel.runtime import checkpoint, gradsync, group, master_weights
from cpuaccel.runtime._log import note
from cpuaccel.runtime.attention import AttentionChoice, StoreAgreement, routed
from cpuaccel.runtime.backend import IPEX_DISTS, IPEX_MODULE, BackendChoice, find_extension
from cpuaccel.runtime.data import ShardedLoader, shard_loader
from cpuaccel.runtime.env import DistEnv
from cpuaccel.runtime.metrics import MetricsLog, default_path
from cpuaccel.runtime.prepare import apply_ipex, needs_ddp, pair, wrap_ddp
from cpuaccel.runtime.trackers import start_trackers

LOADERS_KEY = "cpuaccel_loaders"  # the prepared loaders' positions, in a checkpoint
ATTENTION_KEY = "cpuaccel_attention"  # the attention choices made, in a checkpoint


def _agreement(env: DistEnv) -> StoreAgreement | None:
    """Rank 0's attention choices for the whole job, through the group's store; None in a
    world of one (or a group without a store, where each rank keeps its own)."""
    if env.world_size == 1 or not dist.is_initialized():
        return None
    try:
        store = dist.distributed_c10d._get_default_store()
    except Exception:  # a group torch gives no store for
        return None
    return StoreAgreement(store, env.rank)


@dataclass(frozen=True)
class Settled:
    """What ``init`` settled for the context from its keywords and the environment:
    the autocast ``dtype`` (None: fp32), ``ordered`` (grad_reduce "ordered"), the
    attention and weights policies, whether it ``owns_group`` (created the process
    group, so ends it), and the keywords it passes on as they are."""

    dtype: torch.dtype | None
    gradient_accumulation_steps: int
    seed: int
    owns_group: bool
    trackers: Sequence[str]
    attention: str
    ordered: bool
    deterministic: bool
    weights: str
    # The keywords passed on as they are given, with init's defaults.
    ipex: bool | None = None
    metrics_path: str | os.PathLike[str] | None = None
    find_unused_parameters: bool = False
    gradient_as_bucket_view: bool = True
    verbose: bool = True


class Context:
    """A rank's view of the job, and the helpers that train across ranks.

    Created by :func:`init`. Attributes: ``rank``, ``world_size``, ``local_rank``,
    ``local_world_size``, ``is_main`` (rank 0), ``backend``, ``grad_sync`` ("mpi", "pg"
    or "none"), ``grad_reduce`` ("ordered" or "library"), ``deterministic``, ``dtype``
    (autocast dtype, None for fp32), ``weights`` ("fp32", or "bf16": bf16 parameters
    with fp32 masters, see :mod:`cpuaccel.runtime.master_weights`),
    ``gradient_accumulation_steps``,
    ``sync_gradients`` (whether this micro-step syncs and should step the optimizer),
    ``samples_per_step`` (for the metrics' samples/s), ``run_dir``, ``metrics_path``,
    ``trackers`` (the names of the trackers ``log`` also writes to, e.g. tensorboard),
    ``restart`` (the attempt's number: 0, or k after k restarts of the job) and
    ``resume_path`` (the checkpoint this attempt resumes from, or None; see :meth:`load`).
    """

    def __init__(
        self, env: DistEnv, backend: BackendChoice, sync: gradsync.SyncChoice, settled: Settled
    ) -> None:
        if settled.gradient_accumulation_steps < 1:
            raise SettingError("init(gradient_accumulation_steps=...) must be at least 1")
        self.env = env
        self.rank = env.rank
        self.world_size = env.world_size
        self.local_rank = env.local_rank
        self.local_world_size = env.local_world_size
        self.is_main = env.rank == 0
        self.run_dir = env.run_dir
        self.restart = env.restart
        self.resume_path = env.resume_path
        self.backend = backend.name
        self.backend_reason = backend.reason
        self.grad_sync = sync.mode
        self.grad_sync_reason = sync.reason
        self.grad_reduce = "ordered" if settled.ordered else "library"
        self.deterministic = settled.deterministic
        self.dtype = settled.dtype
        # bf16 parameters with fp32 masters only where autocast runs in bf16
        self.weights = settled.weights if settled.dtype == torch.bfloat16 else master_weights.FP32
        self._masters: list[master_weights.MasterWeights] = []
        self.gradient_accumulation_steps = settled.gradient_accumulation_steps
        self.seed = settled.seed
        self.ipex = settled.ipex
        self.verbose = settled.verbose
        # fp32 attention where measured faster, for the context's life (runtime/attention.py)
        self.attention = AttentionChoice(settled.attention, report=self.note, agree=_agreement(env))
        self._routing = contextlib.ExitStack()
        if settled.dtype == torch.bfloat16 and settled.attention != "autocast":
            self._routing.enter_context(routed(self.attention))
        # DistributedDataParallel's own options, for prepare
        self.find_unused_parameters = settled.find_unused_parameters
        self.gradient_as_bucket_view = settled.gradient_as_bucket_view
        self.sync_gradients = True
        self.samples_per_step: float | None = None
        self.timer = gradsync.SyncTimer()
        self.steps_done = 0
        self._micro_steps = 0
        self._loaders: list[ShardedLoader] = []
        self._positions: list[dict[str, Any]] = []  # loader positions a checkpoint held
        self._ipex_noted = False
        self._owns_group = settled.owns_group
        self._mpi: gradsync.MpiState | None = None
        if sync.mode == "mpi":
            self._mpi = gradsync.mpi_state(sync.comm, env.world_size, ordered=settled.ordered)
            self._mpi.timer = self.timer
        self._pg = gradsync.PgState(
            env.world_size, rank=env.rank, ordered=settled.ordered, timer=self.timer
        )
        given = settled.metrics_path
        self.metrics_path = Path(given) if given else default_path(env.run_dir)
        self.trackers = tuple(settled.trackers)
        # Beside metrics.jsonl: runs/<id>/tensorboard/ under cpuaccel run.
        writers = start_trackers(self.trackers, self.metrics_path.parent) if self.is_main else []
        self.metrics = MetricsLog(
            self.metrics_path,
            enabled=self.is_main,
            header={
                "precision": "bf16" if settled.dtype else "fp32",
                "weights": self.weights,
                "world_size": self.world_size,
            },
            trackers=writers,
        )

    def __repr__(self) -> str:
        return (
            f"Context(rank={self.rank}, world_size={self.world_size}, backend={self.backend!r}, "
            f"grad_sync={self.grad_sync!r}, dtype={self.dtype})"
        )

    def note(self, message: str) -> None:
        note(message, rank=self.rank, enabled=self.verbose)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on rank 0 only (flushed)."""
        if self.is_main:
            print(*args, **{"flush": True, **kwargs})

    # ------------------------------------------------------------------ prepare

    def prepare(self, *objects: Any) -> Any:
        """Make models, optimizers and data loaders ready for this job; same order back.

        - models (``nn.Module``): IPEX-optimized when usable (see ``init(ipex=...)``),
          then wrapped in DDP when there is more than one rank, with gradients averaged
          by MPI or the process group (``grad_sync``);
        - optimizers: matched to the model whose parameters they hold, so that any
          number of model–optimizer pairs can be prepared at once;
        - ``DataLoader``: rebuilt so that each rank reads its own shard (see
          :meth:`set_epoch`);
        - anything else comes back unchanged.

        One object in, one out; several in, a tuple out.
        """
        items = list(objects)
        pairing = pair(items)
        if any(isinstance(o, nn.Module) for o in items):
            self._maybe_ipex(items, pairing)
            if self.weights == master_weights.BF16:
                self._bf16_weights(items, pairing)
        for i, obj in enumerate(items):
            if isinstance(obj, nn.Module):
                items[i] = self._wrap(obj)
            elif isinstance(obj, DataLoader):
                items[i] = shard_loader(
                    obj, rank=self.rank, world_size=self.world_size, seed=self.seed
                )
                if isinstance(items[i], ShardedLoader):
                    if len(self._positions) > len(self._loaders):  # ctx.load came first
                        items[i].load_state_dict(self._positions[len(self._loaders)])
                    self._loaders.append(items[i])
            elif isinstance(obj, torch.optim.Optimizer):  # run --hang-timeout only
                _progress.watch_optimizer(obj, lambda: self.steps_done)
        self.metrics.reset(steps_done=self.steps_done, sync_seconds=self.timer.seconds)
        return items[0] if len(items) == 1 else tuple(items)

    def _maybe_ipex(self, items: list[Any], pairing: Any) -> None:
        if self.ipex is False:
            reason = "IPEX skipped: init(ipex=False)"
        else:
            found = find_extension(IPEX_MODULE, IPEX_DISTS, torch.__version__)
            if found.module is None:
                if self.ipex:
                    raise RuntimeError(f"init(ipex=True), but {found.reason}")
                reason = f"IPEX skipped: {found.reason}"
            else:
                done, skipped = apply_ipex(found.module, items, pairing, self.dtype)
                reason = f"IPEX optimize applied to {done} model(s): {found.reason}"
                if skipped:
                    reason += f"; not to {'; '.join(skipped)}"
        if not self._ipex_noted:
            self.note(reason)
            self._ipex_noted = True

    def _bf16_weights(self, items: list[Any], pairing: Any) -> None:
        """bf16 parameters and fp32 masters for each model with an optimizer of its own."""
        for i, model in enumerate(items):
            if not isinstance(model, nn.Module) or not needs_ddp(model):
                continue
            name = f"argument {i + 1} ({type(model).__name__})"
            j = pairing.optimizer_of.get(i)
            held = {id(p) for p in model.parameters()}
            why = (
                "it is already wrapped in DDP"
                if isinstance(model, DistributedDataParallel)
                else "it has no optimizer of its own"
                if j is None
                else "its parameters are not all fp32 (IPEX, or the script, cast them)"
                if any(p.dtype != torch.float32 for p in model.parameters())
                else "its optimizer also holds other parameters"
                if any(id(p) not in held for g in items[j].param_groups for p in g["params"])
                else None
            )
            if why is not None:
                self.note(f"weights bf16: {name} left as it is: {why}")
                continue
            master_weights.same_on_every_rank(model)
            self._masters.append(master_weights.MasterWeights(model, items[j]))
            count = len(self._masters[-1].masters)
            self.note(
                f"weights bf16: {name}'s {count} parameter(s) in bf16, "
                "its optimizer updates fp32 master copies"
            )

    def _wrap(self, model: nn.Module) -> nn.Module:
        if self.world_size == 1 or not needs_ddp(model):
            return model
        state: Any = self._mpi if self._mpi is not None else self._pg
        hook: Any = gradsync.mpi_hook if self._mpi is not None else gradsync.pg_hook
        return wrap_ddp(
            model,
            state,
            hook,
            find_unused=self.find_unused_parameters,
            bucket_view=self.gradient_as_bucket_view,
        )

    def unwrap(self, model: nn.Module) -> nn.Module:
        """The module inside DDP (what to inspect, or to save on its own)."""
        unwrapped: nn.Module = checkpoint.unwrap(model)
        return unwrapped

    def set_epoch(self, epoch: int) -> None:
        """Choose the shuffle of every prepared loader's next pass (default: next epoch)."""
        for loader in self._loaders:
            loader.set_epoch(epoch)

    # ------------------------------------------------------------------ training step

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """``torch.autocast`` on the CPU in the chosen precision (a no-op for fp32)."""
        return torch.autocast("cpu", dtype=self.dtype or torch.bfloat16, enabled=bool(self.dtype))

    @contextlib.contextmanager
    def accumulate(self, *models: nn.Module) -> Iterator[None]:
        """One micro-step of gradient accumulation.

        Sets ``sync_gradients``: True on every ``gradient_accumulation_steps``-th call
        (then step the optimizer); on the others the models' DDP gradient sync is
        skipped (``no_sync``), so gradients only accumulate locally.
        """
        self._micro_steps += 1
        self.sync_gradients = self._micro_steps % self.gradient_accumulation_steps == 0
        with contextlib.ExitStack() as stack:
            if not self.sync_gradients:
                for model in models:
                    if isinstance(model, DistributedDataParallel):
                        stack.enter_context(model.no_sync())
            yield

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """``loss.backward()``, scaled for gradient accumulation."""
        if self.gradient_accumulation_steps > 1:
            loss = loss / self.gradient_accumulation_steps
        torch.autograd.backward(loss, **kwargs)
        if self.sync_gradients:
            self.steps_done += 1
        _progress.beat(self.steps_done)  # run --hang-timeout's marker, rate-limited

    def clip_grad_norm_(
        self,
        parameters: Iterable[torch.Tensor] | torch.Tensor | nn.Module,
        max_norm: float,
        norm_type: float = 2.0,
    ) -> torch.Tensor:
        """Clip the (already averaged) gradients' norm; returns the norm before clipping.

        With bf16 weights, the gradients are moved into the fp32 masters first and
        clipped there, so the norm is computed in fp32.
        """
        if isinstance(parameters, nn.Module):
            parameters = parameters.parameters()
        if isinstance(parameters, torch.Tensor):
            parameters = [parameters]
        tensors = list(parameters)
        for weights in self._masters:
            tensors = weights.grads_for(tensors)
        return torch.nn.utils.clip_grad_norm_(tensors, max_norm, norm_type=norm_type)

    # ------------------------------------------------------------------ across ranks

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()

    def mean(self, value: torch.Tensor | float) -> float:
        """The mean of ``value`` over all ranks (e.g. the loss), as a float."""
        tensor = torch.as_tensor(value, dtype=torch.float64).detach().reshape(1).clone()
        if self.world_size > 1:
            dist.all_reduce(tensor)
        return float(tensor.item()) / self.world_size

    # ------------------------------------------------------------------ checkpoints

    def save(self, path: str | os.PathLike[str], **state: Any) -> Path:
        """Write ``state`` to ``path`` atomically on every node; all ranks wait for it.

        Models (wrapped or not), optimizers and schedulers are saved as their ``state_dict()``;
        other values (step, epoch, config) as they are; the prepared loaders' positions
        and the attention choices made by timing too (:meth:`load` puts them back: the
        data order and the arithmetic resume exactly). Every node's local rank 0 writes
        its own copy (in data parallel every rank holds the same state: a local write,
        no network), so that a checkpoint outlives a lost node; under ``cpuaccel run``
        each copy gets its line in the run folder's checkpoints.jsonl (``step`` is the
        ``step=`` value saved), which is how a restarted job finds the newest checkpoint
        every node has. Save into ``ctx.run_dir`` for that.
        """
        target = Path(path).absolute()
        if self._loaders and LOADERS_KEY not in state:
            state = {**state, LOADERS_KEY: [loader.state_dict() for loader in self._loaders]}
        if self.attention.chosen and ATTENTION_KEY not in state:
            state = {**state, ATTENTION_KEY: self.attention.recorded()}
        error = digest = None
        if self.local_rank == 0:
            try:
                data = checkpoint.to_bytes(state)
                checkpoint.write_atomic(target, data)
                line = checkpoint.record_line(
                    target, data, step=checkpoint.step_of(state), rank=self.rank
                )
                digest = line["sha256"]
                if self.run_dir:
                    checkpoint.record(self.run_dir, line)
            except Exception as exc:
                if self.world_size == 1:
                    raise
                error = f"{type(exc).__name__}: {exc}"
        self._agree_all(error, digest, f"saving {path}")
        return Path(path)

    def _agree_all(self, error: str | None, digest: str | None, what: str) -> None:
        """Raise on every rank when any rank failed; note copies that differ by node."""
        if self.world_size == 1:
            return
        told: list[Any] = [None] * self.world_size
        dist.all_gather_object(told, (error, digest))
        for rank, (failed, _) in enumerate(told):
            if failed is not None:
                raise RuntimeError(f"{what} failed on rank {rank}: {failed}")
        if len({d for _, d in told if d is not None}) > 1:
            self.note(f"{what}: the nodes' copies differ (the ranks' states are not equal)")

    @overload
    def load(
        self, path: str | os.PathLike[str], *, weights_only: bool = ..., **targets: Any
    ) -> dict[str, Any]: ...
    @overload
    def load(
        self, path: None = None, *, weights_only: bool = ..., **targets: Any
    ) -> dict[str, Any] | None: ...
    def load(
        self, path: str | os.PathLike[str] | None = None, *, weights_only: bool = True,
        **targets: Any,
    ) -> dict[str, Any] | None:  # fmt: skip
        """Rank 0's checkpoint at ``path``, on every rank; loads the named ``targets``.

        ``ctx.load(path, model=model, optimizer=opt)`` calls ``load_state_dict`` on each
        with the entry of that name, puts the prepared loaders back where they were at the
        save, and returns the whole dict (step, ...). Ranks whose node holds no copy (or
        another one) of the file get rank 0's bytes over the process group, so a
        checkpoint in a node-local folder works too.

        Without ``path``, the checkpoint of ``ctx.resume_path`` ($CPUACCEL_RESUME, which a
        restarted ``cpuaccel run`` sets): when there is none (a first attempt), nothing is
        loaded and the result is None.
        """
        if path is None:
            if self.resume_path is None:
                return None
            path = self.resume_path
        data = (
            Path(path).read_bytes()
            if self.world_size == 1
            else checkpoint.fetch(Path(path), self.is_main, self.world_size)
        )
        state = checkpoint.from_bytes(data, weights_only=weights_only)
        checkpoint.restore(state, targets)
        recorded = state.pop(ATTENTION_KEY, None)
        if recorded is not None and self.attention.policy == "auto":
            # The run this one continues chose these by timing: compute as it did.
            self.attention.reuse(recorded)
        positions = state.pop(LOADERS_KEY, None)
        if isinstance(positions, list):
            # Loaders prepared after this load get theirs in prepare(), in the same order.
            self._positions = positions
            for loader, position in zip(self._loaders, positions, strict=False):
                loader.load_state_dict(position)
        return state

    # ------------------------------------------------------------------ metrics

    @property
    def grad_sync_seconds(self) -> float:
        """Seconds this rank has spent in gradient sync so far."""
        return self.timer.seconds

    def log(self, step: int | None = None, **values: Any) -> dict[str, Any]:
        """Append a line to metrics.jsonl (rank 0) and return it (every rank).

        On rank 0 the line also goes to the trackers of ``init(trackers=...)``.

        ``samples=`` (samples since the previous call, all ranks) gives samples/s; so does
        ``ctx.samples_per_step``. See :mod:`cpuaccel.runtime.metrics` for the fields added.
        """
        samples = values.pop("samples", None)
        _progress.beat(step if isinstance(step, int) else self.steps_done)
        if step is not None:
            values = {"step": step, **values}
        return self.metrics.record(
            values,
            steps_done=self.steps_done,
            sync_seconds=self.timer.seconds,
            samples=None if samples is None else float(samples),
            samples_per_step=self.samples_per_step,
        )

    # ------------------------------------------------------------------ end

    def close(self, *, together: bool = True) -> None:
        """Close the trackers, put attention's routing back; destroy the process group if
        :func:`init` created it (also done at exit), the ranks together."""
        self.metrics.close()
        self._routing.close()
        if self._owns_group:
            group.leave(together)
        self._owns_group = False

    def __enter__(self) -> Context:
        return self

    def __exit__(self, kind: object, *exc: object) -> None:
        self.close(together=kind is None)
