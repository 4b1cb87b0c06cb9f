"""`make test-clients`: DeepSpeed installed against the venv's pinned CPU torch, its ops
left to first use, then the `clients` tests, which `make test` leaves out."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make")


def make_dry_run(target: str) -> list[str]:
    done = subprocess.run(
        ["make", "-n", "-C", str(REPO), "VENV=/nonexistent/venv", target],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_test_clients_installs_deepspeed_without_a_build_env_then_runs_the_clients_tests() -> None:
    lines = make_dry_run("test-clients")
    install = [i for i, line in enumerate(lines) if "pip install" in line and "deepspeed" in line]
    assert len(install) == 1, lines
    line = lines[install[0]]
    assert line.startswith("DS_BUILD_OPS=0 "), line
    assert "--no-build-isolation" in line and "-c constraints.txt" in line, line
    pytest_runs = [i for i, line in enumerate(lines) if "/pytest " in line]
    assert len(pytest_runs) == 1 and pytest_runs[0] > install[0], lines
    assert lines[pytest_runs[0]].endswith("-m clients"), lines


def test_make_test_leaves_the_clients_tests_out() -> None:
    runs = [line for line in make_dry_run("test") if "/pytest " in line]
    assert len(runs) == 1 and runs[0].endswith('-m "not clients"'), runs
