"""examples/train.py's last line, as a newcomer reads it after the demo."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train.py"
TINY = ["--steps", "2", "--batch", "2", "--context", "8", "--width", "16", "--layers", "1",
        "--heads", "1", "--corpus-bytes", "20000", "--log-every", "1", "--warmup", "1"]  # fmt: skip


def test_the_done_line_says_what_the_uniform_guess_is(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CPUACCEL_")}
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), *TINY],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    done = [line for line in proc.stdout.splitlines() if line.startswith("done: ")]
    assert len(done) == 1, proc.stdout
    assert "(a uniform guess over 256 bytes would score 5.545); " in done[0]
