"""Fixtures of the unit tests that more than one package's tests use."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def private_hash_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the controller's hash cache out of the real ~/.cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
