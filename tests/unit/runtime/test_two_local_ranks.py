"""One local two-rank job, as torchrun would start it: DDP, process-group sync, sharded
data, and a checkpoint saved by each rank, loaded by one that lost its copy."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from tests.unit.runtime.world import LAUNCH_VARS

REPO = Path(__file__).resolve().parents[3]


TWO_RANKS = """\
import json, os, sys
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
import cpuaccel

ctx = cpuaccel.init(seed=0)
torch.manual_seed(0)
data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
a, b = nn.Linear(4, 3), nn.Linear(3, 1)
oa, ob = torch.optim.AdamW(a.parameters(), lr=0.05), torch.optim.SGD(b.parameters(), lr=0.1)
a, oa, b, ob, loader = ctx.prepare(a, oa, b, ob, DataLoader(data, batch_size=4, shuffle=True))
seen = []
for x, y in loader:
    seen += [round(v, 6) for v in x[:, 0].tolist()]
    ctx.backward(nn.functional.mse_loss(b(a(x)), y))
    for opt in (oa, ob):
        opt.step()
        opt.zero_grad()
ctx.save("ckpt.pt", a=a, b=b, step=len(loader))  # relative: rank 1 runs in another folder
saved_here = os.path.exists("ckpt.pt")  # each is its node's local rank 0: both save
if ctx.rank == 1:
    os.remove("ckpt.pt")  # a node without a copy: it gets rank 0's bytes
state = ctx.load("ckpt.pt")
params = [p.detach() for m in (a, b) for p in m.parameters()]
# An attention kind each rank would time differently: every rank takes rank 0's choice.
agreed = ctx.attention.agree((16, 8, 8, True, False, True), lambda: ctx.rank == 0)
print(json.dumps({
    "rank": ctx.rank, "sync": ctx.grad_sync, "ddp": type(a).__name__,
    "same_optimizers": [oa.param_groups[0]["params"][0] is next(a.parameters())],
    "params": torch.cat([p.flatten() for p in params]).tolist(), "seen": seen,
    "loaded": all(torch.equal(state["a"][k], v) for k, v in ctx.unwrap(a).state_dict().items()),
    "step": state["step"], "has_file": os.path.exists("ckpt.pt"), "saved_here": saved_here,
    "sync_calls": ctx.timer.calls, "agreed": agreed,
}))
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_two_ranks(script: Path, tmp_path: Path) -> list[tuple[int, str, str]]:
    """Run ``script`` as ranks 0 and 1 (each in its own folder); (code, out, err) each."""
    port = free_port()
    procs = []
    for rank in range(2):
        folder = tmp_path / f"rank{rank}"
        folder.mkdir(exist_ok=True)
        env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
        env.update(
            RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
            OMP_NUM_THREADS="1", PYTHONPATH=str(REPO),
        )  # fmt: skip
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script)],
                cwd=folder,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        results.append((proc.returncode, out, err))
    return results


def test_two_local_ranks_train_two_pairs_in_sync(tmp_path: Path) -> None:
    """Two ranks as torchrun would start them: DDP, process-group sync, sharded data,
    and a checkpoint saved by each (each is local rank 0), loaded by one that lost its copy."""
    script = tmp_path / "two.py"
    script.write_text(TWO_RANKS)
    results = start_two_ranks(script, tmp_path)
    if any("EADDRINUSE" in err or "address already in use" in err for _, _, err in results):
        results = start_two_ranks(script, tmp_path)  # the free port was taken meanwhile
    assert [code for code, _, _ in results] == [0, 0], results
    outs = [(json.loads(out), err) for _, out, err in results]
    (zero, err0), (one, err1) = outs
    assert "cpuaccel: gradient sync pg: the job was not started by an MPI launcher" in err0
    assert err1 == ""  # only rank 0 tells
    for seen in (zero, one):
        assert seen["sync"] == "pg" and seen["ddp"] == "DistributedDataParallel"
        assert seen["same_optimizers"] == [True]
        assert seen["loaded"] and seen["step"] == 4
        assert seen["sync_calls"] >= 8  # two models, four steps
        assert seen["agreed"] is True  # rank 0's measurement, through the group's store
    assert zero["params"] == one["params"]  # identical on both ranks, bit for bit
    assert len(zero["seen"]) == len(one["seen"]) == 16
    assert not set(zero["seen"]) & set(one["seen"])  # each rank its own shard
    assert (zero["has_file"], one["has_file"]) == (True, False)
