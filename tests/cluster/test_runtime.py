"""The training runtime under `cpuaccel run` on real nodes (namespaces with sshd), Intel MPI.

- MPI gradient allreduce (mpi4py in a DDP hook) against the process group (gloo), on
  2 nodes x 2 ranks: the same parameters after N steps, identical on every rank;
- a checkpointed run that is killed, then resumed: the same loss curve as a run that
  was never interrupted;
- the example (examples/train.py): the loss falls, metrics and a checkpoint are written,
  and --resume continues from it.

Each job imports torch on every rank (~1-2 s a rank on these shared cores), so models
are tiny and steps few.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from cpuaccel.testbed.cluster import WORKDIR, Cluster
from tests.cluster.fixtures import REPO, TREE, master_port
from testsupport.runs import Run, cpuaccel_run, make_project

pytestmark = pytest.mark.cluster


def rank_json(run: Run, world: int) -> dict[int, dict[str, Any]]:
    """rank -> the JSON object it printed (its stdout line starting with '{')."""
    found: dict[int, dict[str, Any]] = {}
    for rank in range(world):
        objects = [json.loads(text) for text in run.lines(rank) if text.startswith("{")]
        assert len(objects) == 1, (rank, run)
        found[rank] = objects[0]
    return found


# ---------------------------------------------------------------- MPI hook against gloo

SYNC_SCRIPT = """\
import hashlib, json, os, sys
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
import cpuaccel

steps, out = int(sys.argv[1]), sys.argv[2]
ctx = cpuaccel.init(seed=0)
torch.manual_seed(0)
# Two model-optimizer pairs: an fp32 MLP, and a bf16 one (whose gradient buckets are
# bf16, which MPI gets as fp32). Kept apart so that bf16 rounding does not leak into
# the fp32 comparison.
fp32 = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1))
bf16 = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 1)).to(torch.bfloat16)
models = (fp32, bf16)
initial = torch.cat([p.detach().float().flatten() for m in models for p in m.parameters()])
opt32 = torch.optim.SGD(fp32.parameters(), lr=0.05, momentum=0.9)
opt16 = torch.optim.SGD(bf16.parameters(), lr=0.05, momentum=0.9)
g = torch.Generator().manual_seed(1)
x, y = torch.randn(256, 16, generator=g), torch.randn(256, 1, generator=g)
loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
fp32, opt32, bf16, opt16, loader = ctx.prepare(fp32, opt32, bf16, opt16, loader)
done = 0
while done < steps:
    for xb, yb in loader:  # each rank its own 8 samples a step
        loss = nn.functional.mse_loss(fp32(xb), yb)
        loss16 = nn.functional.mse_loss(bf16(xb.to(torch.bfloat16)).float(), yb)
        ctx.backward(loss + loss16)
        for opt in (opt32, opt16):
            opt.step()
            opt.zero_grad()
        done += 1
        if done == steps:
            break
params = [p for m in (fp32, bf16) for p in ctx.unwrap(m).parameters()]
flat = torch.cat([p.detach().float().flatten() for p in params])  # bf16 -> fp32 is exact
# A checkpoint in the run folder, which is each node's own: each node's local rank 0 writes.
path = os.path.join(os.environ["CPUACCEL_RUN_DIR"], "state.pt")
ctx.save(path, fp32=fp32, bf16=bf16, step=done)
state = ctx.load(path)
print(json.dumps({
    "sync": ctx.grad_sync,
    "checksum": hashlib.sha256(flat.numpy().tobytes()).hexdigest(),
    "moved": (flat - initial).abs().max().item(),
    "sync_calls": ctx.timer.calls,
    "sync_seconds": ctx.grad_sync_seconds,
    "loaded": state["step"] == done and all(
        torch.equal(state[name][k], v)
        for name, m in (("fp32", fp32), ("bf16", bf16))
        for k, v in ctx.unwrap(m).state_dict().items()
    ),
    "has_file": os.path.exists(path),
    "sizes": [[p.numel(), str(p.dtype)] for p in params],
}))
if ctx.rank == 0:  # to a shared folder: a 40 kB line would not reach the test whole
    with open(out, "w") as f:
        json.dump(flat.tolist(), f)
"""


def sync_run(
    project: Path, inventory: str, mode: str, steps: int, out: Path
) -> dict[int, dict[str, Any]]:
    run = cpuaccel_run(
        project, "-i", inventory, "--nodes", "2", "--ppn", "2", "--master-port",
        master_port(), *TREE, "--env", f"CPUACCEL_GRAD_SYNC={mode}", "sync.py", str(steps),
        str(out),
    )  # fmt: skip
    assert run.code == 0, run
    assert f"cpuaccel: gradient sync {mode}: forced by $CPUACCEL_GRAD_SYNC" in run.stderr, run
    return rank_json(run, 4)


def test_mpi_gradient_sync_matches_gloo_on_two_nodes(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    project = make_project(tmp_path, {"sync.py": SYNC_SCRIPT})
    steps = 12  # 8 steps an epoch (256 samples / 4 ranks / 8): crosses into the next
    runs = {
        mode: sync_run(project, inventory, mode, steps, tmp_path / f"{mode}.json")
        for mode in ("mpi", "pg")
    }
    for mode, ranks in runs.items():
        # Every rank trained on other samples, yet ends with the same parameters, bit for bit.
        assert len({r["checksum"] for r in ranks.values()}) == 1, (mode, ranks)
        for rank, seen in ranks.items():
            assert seen["sync"] == mode and seen["moved"] > 1e-2, (mode, rank)
            # one bucket per model and step at least
            assert seen["sync_calls"] >= 2 * steps and seen["sync_seconds"] > 0, (mode, rank)
            assert seen["loaded"], (mode, rank)
        # Each node's local rank 0 wrote its copy: every node has the file.
        assert [ranks[r]["has_file"] for r in range(4)] == [True, True, True, True], mode
    sizes = runs["mpi"][0]["sizes"]
    assert sizes == runs["pg"][0]["sizes"]
    mpi, pg = (json.loads((tmp_path / f"{mode}.json").read_text()) for mode in ("mpi", "pg"))
    offset = 0
    for numel, dtype in sizes:
        # bf16: MPI gets fp32 values and the mean is rounded once; gloo sums bf16.
        rel, tol = (1e-5, 1e-6) if dtype == "torch.float32" else (2e-2, 2e-2)
        for a, b in zip(mpi[offset : offset + numel], pg[offset : offset + numel], strict=True):
            assert math.isclose(a, b, rel_tol=rel, abs_tol=tol), (dtype, offset, a, b)
        offset += numel
    assert offset == len(mpi) == 1633 + 289


# ---------------------------------------------------------------- kill and resume

RESUME_SCRIPT = """\
import argparse, os, signal
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
import cpuaccel

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, required=True)
parser.add_argument("--save-every", type=int, required=True)
parser.add_argument("--checkpoint", required=True)
parser.add_argument("--resume", action="store_true")
parser.add_argument("--die-after", type=int, default=0)
args = parser.parse_args()

ctx = cpuaccel.init("bf16", seed=0)
g = torch.Generator().manual_seed(1)
x = torch.randn(48, 8, generator=g)
y = x @ torch.randn(8, 1, generator=g) + 0.1 * torch.randn(48, 1, generator=g)
model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 1))
opt = torch.optim.AdamW(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(x, y), batch_size=4, shuffle=True)
model, opt, loader = ctx.prepare(model, opt, loader)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.9)
step = 0
if args.resume:
    step = ctx.load(args.checkpoint, model=model, optimizer=opt, scheduler=sched)["step"]
    ctx.print(f"resumed at step {step}")
epoch, skip = divmod(step, len(loader))  # where the data order stands
while step < args.steps:
    loader.set_epoch(epoch, skip_batches=skip)
    skip = 0
    for xb, yb in loader:
        with ctx.autocast():
            out = model(xb)
        loss = nn.functional.mse_loss(out.float(), yb)
        ctx.backward(loss)
        opt.step()
        sched.step()
        opt.zero_grad()
        step += 1
        ctx.print(f"loss {step} {ctx.mean(loss):.9e}")
        if step % args.save_every == 0:
            ctx.save(args.checkpoint, model=model, optimizer=opt, scheduler=sched, step=step)
        if step == args.die_after and ctx.rank == ctx.world_size - 1:
            os.kill(os.getpid(), signal.SIGKILL)  # a node lost mid-run
        if step == args.steps:
            break
    epoch += 1
"""


def losses(run: Run) -> dict[int, float]:
    found = {}
    for text in run.lines(0):
        match = re.match(r"^loss (\d+) (\S+)$", text)
        if match:
            found[int(match[1])] = float(match[2])
    return found


def test_checkpoint_kill_and_resume_give_the_same_loss_curve(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    project = make_project(tmp_path, {"resume.py": RESUME_SCRIPT})
    common = ("-i", inventory, "--nodes", "2", "--ppn", "1", *TREE)
    # 48 samples / 2 ranks / 4 a batch: 6 steps an epoch; 14 steps cross two epoch ends.
    whole = cpuaccel_run(
        project, *common, "--master-port", master_port(), "resume.py",
        "--steps", "14", "--save-every", "4", "--checkpoint", str(tmp_path / "whole.pt"),
    )  # fmt: skip
    assert whole.code == 0, whole
    reference = losses(whole)
    assert sorted(reference) == list(range(1, 15)), whole
    early = sum(reference[s] for s in (1, 2, 3, 4))
    late = sum(reference[s] for s in (11, 12, 13, 14))
    assert late < early / 2, reference  # it does learn

    ckpt = tmp_path / "ckpt.pt"
    killed = cpuaccel_run(
        project, *common, "--master-port", master_port(), "resume.py",
        "--steps", "14", "--save-every", "4", "--checkpoint", str(ckpt), "--die-after", "6",
    )  # fmt: skip
    assert killed.code == 137, killed
    assert "first failing rank 1 on node2 (exit code 137)" in killed.stderr, killed
    before = losses(killed)
    # Rank 0's line for step 6 may be lost with the job, ended at once when rank 1 died.
    assert sorted(before) in (list(range(1, 6)), list(range(1, 7))), killed
    assert before == {s: reference[s] for s in before}  # the same run, up to the kill
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".ckpt")] == []

    resumed = cpuaccel_run(
        project, *common, "--master-port", master_port(), "resume.py",
        "--steps", "14", "--save-every", "4", "--checkpoint", str(ckpt), "--resume",
    )  # fmt: skip
    assert resumed.code == 0, resumed
    assert "resumed at step 4" in resumed.lines(0), resumed
    after = losses(resumed)
    assert sorted(after) == list(range(5, 15)), resumed
    for step, loss in after.items():
        # Two ranks: every sum is a + b, whatever the order, so the curve is exact.
        assert loss == reference[step], (step, loss, reference[step])


# ---------------------------------------------------------------- the example


def test_example_loss_falls_and_it_resumes(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    example = (REPO / "examples" / "train.py").read_text()
    project = make_project(tmp_path, {"train.py": example})
    common = ("-i", inventory, "--nodes", "1", "--ppn", "2", *TREE)
    first = cpuaccel_run(
        project, *common, "--master-port", master_port(), "train.py",
        "--steps", "40", "--log-every", "10", "--checkpoint", "ckpt.pt",
    )  # fmt: skip
    assert first.code == 0, first
    assert "cpuaccel: gradient sync mpi: the job was started by MPI; Intel(R) MPI" in (
        first.stderr
    ), first
    done = re.search(r"done: steps 1-40 on 2 rank\(s\) .*loss (\S+) -> (\S+) ", first.stdout)
    assert done, first
    start, end = float(done[1]), float(done[2])
    assert start > 5.0 and end < 3.2 and start - end > 2.0, first
    printed = re.findall(r"step +(\d+) +loss (\S+) +(\S+) samples/s", first.stdout)
    assert [int(s) for s, _, _ in printed] == [1, 10, 20, 30, 40], first
    assert all(float(rate) > 0 for _, _, rate in printed)
    # metrics.jsonl is in the run folder on node1 (the head), where rank 0 ran.
    run_id = first.record()["run_id"]
    metrics = cluster.exec("node1", ["cat", f"{WORKDIR}/runs/{run_id}/metrics.jsonl"])
    lines = [json.loads(line) for line in metrics.stdout.splitlines()]
    assert [line["step"] for line in lines] == [1, 10, 20, 30, 40], metrics.stderr
    for line in lines:
        assert {"loss", "samples_per_s", "step_time", "sync_time", "lr"} <= set(line)
    assert lines[-1]["loss"] == pytest.approx(end, abs=1e-3)

    more = cpuaccel_run(
        project, *common, "--master-port", master_port(), "train.py",
        "--steps", "44", "--log-every", "10", "--checkpoint", "ckpt.pt", "--resume", "ckpt.pt",
    )  # fmt: skip
    assert more.code == 0, more
    assert "resumed from ckpt.pt at step 40" in more.stdout, more
    cont = re.search(r"done: steps 41-44 .*loss (\S+) -> (\S+) ", more.stdout)
    assert cont and float(cont[1]) < 3.2, more
