"""Sharded data loading (runtime/data.py): each rank reads its own shard, set_epoch
reshuffles and can resume part way, a sequential loader stays in order, and what cannot
be sharded is said."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from cpuaccel.runtime.data import ShardedLoader, shard_loader


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
