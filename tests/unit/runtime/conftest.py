"""Fixtures of the runtime's tests: no launcher's variable in the environment (clean_env),
and a world of one (ctx)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch.distributed as dist

import cpuaccel
from cpuaccel.runtime.context import Context
from tests.unit.runtime.world import LAUNCH_VARS


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in LAUNCH_VARS:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def ctx(clean_env: None, tmp_path: Path) -> Iterator[Context]:
    """A world of one (gloo), as a script run with plain `python` gets."""
    assert not dist.is_initialized()
    context = cpuaccel.init("bf16", seed=0, metrics_path=tmp_path / "metrics.jsonl")
    yield context
    context.close()
    assert not dist.is_initialized()
