"""Checkpoints (runtime/checkpoint.py): a round trip, and a save interrupted or killed
never leaves a corrupt file nor a stale temporary one."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from cpuaccel.runtime import checkpoint
from cpuaccel.runtime.context import Context

REPO = Path(__file__).resolve().parents[3]


def test_checkpoint_round_trip(ctx: Context, tmp_path: Path) -> None:
    torch.manual_seed(1)
    model = nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    path = ctx.save(tmp_path / "ckpt" / "state.pt", model=model, optimizer=opt, step=7, tag="a")
    assert path.is_file()
    other = nn.Linear(4, 2)
    other_opt = torch.optim.AdamW(other.parameters(), lr=0.1)
    state = ctx.load(path, model=other, optimizer=other_opt)
    assert state["step"] == 7 and state["tag"] == "a"
    for p, q in zip(model.parameters(), other.parameters(), strict=True):
        assert torch.equal(p, q)
    assert torch.equal(
        other_opt.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"]
    )
    with pytest.raises(KeyError, match="no scheduler"):
        ctx.load(path, scheduler=other_opt)


def test_interrupted_save_leaves_the_old_checkpoint_whole(
    ctx: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "state.pt"
    ctx.save(path, step=1, weights=torch.arange(1000.0))
    old = path.read_bytes()

    def killed(src: object, dst: object) -> None:
        raise KeyboardInterrupt("killed before the rename")

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        ctx.save(path, step=2, weights=torch.zeros(1000))
    monkeypatch.undo()
    assert path.read_bytes() == old
    assert ctx.load(path)["step"] == 1
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp file


def test_temp_file_of_a_killed_save_is_cleared_by_the_next(ctx: Context, tmp_path: Path) -> None:
    path = tmp_path / "state.pt"
    # The name carries host and pid (nodes sharing a folder never remove another's).
    host = socket.gethostname()
    stale = tmp_path / f".state.pt{checkpoint.TEMP_MARK}{host}-99999999"  # no such pid
    stale.write_bytes(b"half a checkpoint")
    running = tmp_path / f".state.pt{checkpoint.TEMP_MARK}{host}-1"  # init: a save under way
    running.write_bytes(b"another writer's")
    other = tmp_path / f".state.pt{checkpoint.TEMP_MARK}node9-123"
    other.write_bytes(b"another host's")
    ctx.save(path, step=3)
    assert not stale.exists() and running.exists() and other.exists()
    assert ctx.load(path) == {"step": 3}


def test_a_killed_writer_never_leaves_a_corrupt_file(tmp_path: Path) -> None:
    """SIGKILL a process that saves in a loop: the file always loads, whole."""
    path = tmp_path / "state.pt"
    writer = textwrap.dedent(
        f"""
        import torch
        from cpuaccel.runtime.checkpoint import to_bytes, write_atomic
        n = 0
        while True:
            n += 1
            write_atomic({str(path)!r}, to_bytes({{"n": n, "w": torch.full((300_000,), n)}}))
            print(n, flush=True)
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", writer], stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    try:
        assert proc.stdout is not None
        for _ in range(3):
            proc.stdout.readline()
    finally:
        proc.kill()
        proc.wait()
    state = checkpoint.from_bytes(path.read_bytes())
    assert state["n"] >= 3 and torch.equal(state["w"], torch.full((300_000,), state["n"]))
