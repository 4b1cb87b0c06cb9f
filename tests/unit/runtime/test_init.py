"""cpuaccel.init in one process: the package stays cheap to import and exports init
lazily, a world of one without a launcher, what init says (once, on rank 0), and the
precision `cpuaccel run` exported."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import cpuaccel
from cpuaccel.runtime.context import Context


def test_importing_cpuaccel_stays_cheap_and_exports_init_lazily() -> None:
    code = (
        "import sys, cpuaccel\n"
        "assert 'torch' not in sys.modules, 'torch imported by import cpuaccel'\n"
        "init = cpuaccel.init\n"
        "assert 'torch' in sys.modules and callable(init) and cpuaccel.Context\n"
        "from cpuaccel import init as again\n"
        "assert again is init\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr
    with pytest.raises(AttributeError):
        cpuaccel.no_such_name  # noqa: B018


def test_world_of_one_without_a_launcher(ctx: Context, capsys: pytest.CaptureFixture[str]) -> None:
    assert (ctx.rank, ctx.world_size, ctx.backend, ctx.grad_sync) == (0, 1, "gloo", "none")
    assert dist.is_initialized() and dist.get_world_size() == 1
    assert ctx.dtype is torch.bfloat16
    assert ctx.mean(torch.tensor(3.0)) == 3.0
    # The pg is ready for collectives in a world of one.
    ctx.barrier()


def test_init_logs_its_choices_once_on_rank_0(
    clean_env: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with cpuaccel.init("bf16", metrics_path=tmp_path / "m.jsonl"):
        pass
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "cpuaccel: backend gloo: a single process (1 rank(s))"
    assert err[1].startswith("cpuaccel: mixed precision bf16")
    assert len(err) == 2
    with pytest.raises(ValueError, match="fp16"):
        cpuaccel.init("fp16")
    assert not dist.is_initialized()


def test_precision_defaults_to_what_run_exported(
    clean_env: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CPUACCEL_MIXED_PRECISION", "bf16")
    with cpuaccel.init(verbose=False, metrics_path=tmp_path / "m.jsonl") as ctx:
        assert ctx.dtype == torch.bfloat16
    with cpuaccel.init("no", verbose=False, metrics_path=tmp_path / "m.jsonl") as ctx:
        assert ctx.dtype is None  # an explicit argument wins
