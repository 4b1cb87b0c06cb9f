"""Data loaders split across ranks: each rank reads its own shard of every epoch.

:func:`shard_loader` rebuilds a ``DataLoader`` (same batch size, collate function,
workers...) on a :class:`ShardSampler`, a ``DistributedSampler`` that can also start an
epoch part-way (to resume a run at the batch where it stopped). The loader it returns
is a :class:`ShardedLoader`: each new pass over it uses the next epoch's shuffle unless
:meth:`ShardedLoader.set_epoch` chose one, so every rank shuffles alike and each epoch
differently, deterministically from the seed. Its ``state_dict`` (epoch, batches handed
out) goes into checkpoints, so that a resumed run reads exactly the batches that the
interrupted one would have read next.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
)


class ShardSampler(DistributedSampler[Any]):
    """A DistributedSampler that can skip the first samples of the next pass."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.skip = 0

    def __iter__(self) -> Iterator[Any]:
        skip, self.skip = self.skip, 0
        return itertools.islice(super().__iter__(), skip, None)

    def __len__(self) -> int:
        return max(0, self.num_samples - self.skip)


class ShardedLoader(DataLoader[Any]):
    """A DataLoader over a :class:`ShardSampler`, with ``set_epoch`` and a resumable
    position (``state_dict``/``load_state_dict``)."""

    sampler: ShardSampler

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.epoch = -1  # the epoch of the pass under way (or the last one)
        self.position = 0  # batches of that pass handed out so far (skipped ones count)
        self.finished = True  # whether that pass reached its end
        self._chosen: int | None = None
        self._skip = 0

    def set_epoch(self, epoch: int, skip_batches: int = 0) -> None:
        """Use ``epoch``'s order for the next pass, starting after ``skip_batches``."""
        self._chosen = epoch
        self._skip = skip_batches
        self.sampler.skip = skip_batches * (self.batch_size or 1)

    def state_dict(self) -> dict[str, int]:
        """Where the next batch comes from: ``{"epoch": e, "position": batches of e
        already handed out}`` (a checkpoint saves it; :meth:`load_state_dict` goes back)."""
        if self._chosen is not None:
            return {"epoch": self._chosen, "position": self._skip}
        if self.finished or self.position >= self.batches_per_pass():
            return {"epoch": self.epoch + 1, "position": 0}
        return {"epoch": self.epoch, "position": self.position}

    def batches_per_pass(self) -> int:
        """A whole pass's batches (``len`` is less during a pass that skips some)."""
        size = self.batch_size or 1
        whole, rest = divmod(self.sampler.num_samples, size)
        return whole + (1 if rest and not self.drop_last else 0)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # Applied when the next pass starts: until then len() stays a whole epoch's, as
        # scripts that compute their place from len(loader) after a load expect.
        self._chosen, self._skip = int(state["epoch"]), int(state["position"])

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        # The pass is set up here, not on the first next(): state_dict() is right at once.
        epoch = self._chosen if self._chosen is not None else self.epoch + 1
        self._chosen = None
        self.sampler.skip = self._skip * (self.batch_size or 1)
        self.epoch, self.position, self.finished = epoch, self._skip, False
        self._skip = 0
        self.sampler.set_epoch(epoch)
        return self._counted(super().__iter__())

    def _counted(self, batches: Iterator[Any]) -> Iterator[Any]:
        for batch in batches:
            self.position += 1  # before the yield: the batch is the caller's from now on
            yield batch
        self.finished = True


def _batch_size_and_sampler(loader: DataLoader[Any]) -> tuple[int, Any, bool]:
    """(batch size, the index sampler, drop_last) of a loader built the usual ways."""
    if loader.batch_size is not None:
        return loader.batch_size, loader.sampler, loader.drop_last
    batches = loader.batch_sampler
    if type(batches) is BatchSampler:
        return batches.batch_size, batches.sampler, batches.drop_last
    raise TypeError(
        f"cannot shard a DataLoader with a custom batch_sampler ({type(batches).__name__}): "
        "build it with batch_size= (and shuffle=), and prepare() will split it across ranks"
    )


def shard_loader(
    loader: DataLoader[Any], *, rank: int, world_size: int, seed: int = 0
) -> DataLoader[Any]:
    """``loader``, rebuilt so that rank ``rank`` of ``world_size`` reads its own shard.

    The shuffle follows the original loader (a RandomSampler shuffles, a sequential one
    does not). Every rank gets the same number of batches (the last samples repeat when
    the dataset does not split evenly), which DDP needs. An IterableDataset is returned
    unchanged: it has to shard itself (by rank).
    """
    if isinstance(loader, ShardedLoader) or isinstance(loader.dataset, IterableDataset):
        return loader
    batch_size, sampler, drop_last = _batch_size_and_sampler(loader)
    if isinstance(sampler, DistributedSampler):
        shuffle = bool(sampler.shuffle)
    elif isinstance(sampler, RandomSampler):
        shuffle = True
    elif isinstance(sampler, SequentialSampler):
        shuffle = False
    else:
        raise TypeError(
            f"cannot shard a DataLoader with a custom sampler ({type(sampler).__name__}): "
            "use shuffle=True/False, or give each rank its part yourself (ctx.rank)"
        )
    shard = ShardSampler(
        loader.dataset, num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed
    )
    extra: dict[str, Any] = {}
    if loader.num_workers > 0:
        extra = {
            "prefetch_factor": loader.prefetch_factor,
            "persistent_workers": loader.persistent_workers,
        }
    return ShardedLoader(
        loader.dataset,
        batch_size=batch_size,
        sampler=shard,
        num_workers=loader.num_workers,
        collate_fn=loader.collate_fn,
        pin_memory=False,
        drop_last=drop_last,
        timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context,
        generator=loader.generator,
        **extra,
    )
