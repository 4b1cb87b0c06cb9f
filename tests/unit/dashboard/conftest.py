"""Fixtures of the dashboard's tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    return tmp_path / "runs"
