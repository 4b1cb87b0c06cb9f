"""bf16 weights with fp32 master copies (init(weights="bf16")): what prepare does to a
model and its optimizer, the checkpoint's fp32 values, clipping in fp32, the refusals,
and two local ranks whose resumed run ends bit for bit where the uninterrupted one does."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import cpuaccel
from cpuaccel.errors import SettingError
from cpuaccel.runtime.context import Context
from tests.unit.runtime.test_two_local_ranks import REPO, start_two_ranks
from tests.unit.runtime.world import LAUNCH_VARS

VENV_BIN = Path(sys.executable).parent


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.norm = nn.LayerNorm(8)
        self.head = nn.Linear(8, 16)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.embed(tokens)))


def step(ctx: Context, model: nn.Module, optimizer: torch.optim.Optimizer, seed: int) -> None:
    tokens = torch.randint(0, 16, (4, 6), generator=torch.Generator().manual_seed(seed))
    with ctx.autocast():
        logits = model(tokens)
    loss = nn.functional.cross_entropy(logits.float().reshape(-1, 16), tokens.reshape(-1))
    ctx.backward(loss)
    ctx.clip_grad_norm_(model, 1.0)
    optimizer.step()
    optimizer.zero_grad()


@pytest.fixture
def bf16_ctx(clean_env: None, tmp_path: Path) -> Iterator[Context]:
    context = cpuaccel.init("bf16", seed=0, weights="bf16", metrics_path=tmp_path / "m.jsonl")
    yield context
    context.close()


def test_prepare_gives_bf16_parameters_and_fp32_masters_to_the_optimizer(
    bf16_ctx: Context, capsys: pytest.CaptureFixture[str]
) -> None:
    model = Tiny()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model, optimizer = bf16_ctx.prepare(model, optimizer)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    masters = [p for g in optimizer.param_groups for p in g["params"]]
    assert {m.dtype for m in masters} == {torch.float32} and len(masters) == 5
    # The masters are the exact fp32 values; the checkpoint's state holds them.
    saved = model.state_dict()
    assert all(torch.equal(saved[k], v) for k, v in before.items())
    assert "weights bf16: argument 1 (Tiny)'s 5 parameter(s) in bf16" in capsys.readouterr().err

    step(bf16_ctx, model, optimizer, seed=1)
    saved = model.state_dict()
    assert any(not torch.equal(saved[k], v) for k, v in before.items())  # it trained
    for name, param in model.named_parameters():
        assert saved[name].dtype == torch.float32
        assert torch.equal(param.detach(), saved[name].to(torch.bfloat16))  # the rounding
        assert param.grad is None
    assert all(m.grad is None for m in masters)


def test_loading_sets_masters_and_parameters_from_fp32_values(
    bf16_ctx: Context, tmp_path: Path
) -> None:
    model = Tiny()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = bf16_ctx.prepare(model, optimizer)
    fp32 = Tiny()
    with torch.no_grad():
        for p in fp32.parameters():
            p.add_(1e-4)  # below bf16's resolution near 1: only the masters can hold it
    path = tmp_path / "c.pt"
    torch.save({"model": fp32.state_dict(), "step": 3}, path)
    bf16_ctx.load(path, model=model)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in fp32.state_dict().items())
    for name, param in model.named_parameters():
        assert torch.equal(param.detach(), fp32.state_dict()[name].to(torch.bfloat16))


def test_clipping_sees_fp32_gradients_and_one_backward_after_it_is_not_lost(
    bf16_ctx: Context,
) -> None:
    model = Tiny()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    model, optimizer = bf16_ctx.prepare(model, optimizer)
    tokens = torch.arange(12).reshape(2, 6) % 16
    with bf16_ctx.autocast():
        loss = model(tokens).float().square().mean()
    bf16_ctx.backward(loss)
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    norm = bf16_ctx.clip_grad_norm_(model, 1e9)  # no clipping: only the norm
    assert norm.dtype == torch.float32
    expected = torch.stack([g.float().norm() for g in grads.values()]).norm()
    assert torch.equal(norm, expected)
    masters = [p for g in optimizer.param_groups for p in g["params"]]
    assert all(m.grad is not None and m.grad.dtype == torch.float32 for m in masters)
    assert all(p.grad is None for p in model.parameters())


def test_a_model_without_an_optimizer_of_its_own_or_already_cast_is_left_as_it_is(
    bf16_ctx: Context, capsys: pytest.CaptureFixture[str]
) -> None:
    frozen, trained, cast = Tiny(), Tiny(), Tiny().to(torch.bfloat16)
    shared = torch.optim.SGD([*trained.parameters(), nn.Parameter(torch.zeros(2))], lr=0.1)
    own = torch.optim.SGD(cast.parameters(), lr=0.1)
    frozen, trained, shared, cast, own = bf16_ctx.prepare(frozen, trained, shared, cast, own)
    assert {p.dtype for m in (frozen, trained) for p in m.parameters()} == {torch.float32}
    assert own.param_groups[0]["params"][0] is next(cast.parameters())  # no masters
    err = capsys.readouterr().err
    assert "argument 1 (Tiny) left as it is: it has no optimizer of its own" in err
    assert "argument 2 (Tiny) left as it is: its optimizer also holds other parameters" in err
    assert "argument 4 (Tiny) left as it is: its parameters are not all fp32" in err


def test_weights_is_checked_and_refused_with_accumulation(
    clean_env: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CPUACCEL_WEIGHTS", "fp16")
    with pytest.raises(SettingError, match=r"'fp16' is not a choice .*use fp32 or bf16"):
        cpuaccel.init("bf16", metrics_path=tmp_path / "m.jsonl")
    monkeypatch.delenv("CPUACCEL_WEIGHTS")
    with pytest.raises(SettingError, match="would sum the micro-steps' gradients in bf16"):
        cpuaccel.init("bf16", weights="bf16", gradient_accumulation_steps=2)


def test_fp32_precision_leaves_the_weights_fp32(
    clean_env: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with cpuaccel.init("no", weights="bf16", metrics_path=tmp_path / "m.jsonl") as ctx:
        model = Tiny()
        model, _ = ctx.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
        assert ctx.weights == "fp32"
        assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert "weights bf16 not used: the precision is fp32" in capsys.readouterr().err


# Two ranks (DDP over the process group, bf16 buckets): 12 steps without a stop, or the
# first 6 saved and a fresh pair of processes resuming from them.
RESUME = """\
import json, sys
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
import cpuaccel

mode = sys.argv[1]
ctx = cpuaccel.init("bf16", seed=0, weights="bf16")
torch.manual_seed(0)
model = nn.Sequential(nn.Embedding(32, 16), nn.LayerNorm(16), nn.Linear(16, 32))
data = TensorDataset(torch.randint(0, 32, (96, 8)))
opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.01)
model, opt, loader = ctx.prepare(model, opt, DataLoader(data, batch_size=4, shuffle=True))
step = 0
if mode == "resume":
    step = ctx.load("../mid.pt", model=model, optimizer=opt)["step"]
while step < 12:
    for (x,) in loader:
        with ctx.autocast():
            logits = model(x)
        ctx.backward(nn.functional.cross_entropy(logits.float().reshape(-1, 32), x.reshape(-1)))
        ctx.clip_grad_norm_(model, 0.5)
        opt.step()
        opt.zero_grad()
        step += 1
        if mode == "whole" and step == 6:
            ctx.save("../mid.pt", model=model, optimizer=opt, step=step)
        if step == 12:
            break
ctx.save(f"../{mode}.pt", model=model, optimizer=opt, step=step)
with open(f"../{mode}.{ctx.rank}.json", "w") as out:
    json.dump({
    "ddp": type(model).__name__, "sync": ctx.grad_sync, "world": ctx.world_size,
    "dtypes": sorted({str(p.dtype) for p in model.parameters()}),
    "params": [p.detach().float().sum().item() for p in model.parameters()],
    }, out)
"""


def wrapped(tmp_path: Path, mode: str) -> Path:
    """The script, run in ``mode`` (``whole`` or ``resume``)."""
    script = tmp_path / "bf16_train.py"
    script.write_text(RESUME)
    wrapper = tmp_path / f"{mode}.py"
    wrapper.write_text(
        f"import sys, runpy\nsys.argv[1:] = ['{mode}']\n"
        f"runpy.run_path({str(script)!r}, run_name='__main__')\n"
    )
    return wrapper


def two_local_ranks(tmp_path: Path, mode: str) -> list[dict[str, Any]]:
    """Ranks as torchrun starts them, each in its own folder: DDP over gloo."""
    results = start_two_ranks(wrapped(tmp_path, mode), tmp_path)
    assert [code for code, _, _ in results] == [0, 0], results
    return told(tmp_path, mode, 2)


def four_mpi_ranks(tmp_path: Path, mode: str) -> list[dict[str, Any]]:
    """Four ranks under Intel MPI's mpirun: gradients summed in rank order through MPI,
    with the ring allreduce (whose sums would depend on the bucket layout) configured."""
    folder = tmp_path / "run"
    folder.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS and "I_MPI" not in k}
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env.update(
        PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", PATH=f"{VENV_BIN}:{env['PATH']}",
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), I_MPI_ADJUST_ALLREDUCE="8",
    )  # fmt: skip
    argv = [str(VENV_BIN / "mpirun"), "-n", "4", sys.executable, str(wrapped(tmp_path, mode))]
    done = subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return told(tmp_path, mode, 4)


def told(tmp_path: Path, mode: str, world: int) -> list[dict[str, Any]]:
    """What each rank wrote at its end."""
    return [json.loads((tmp_path / f"{mode}.{rank}.json").read_text()) for rank in range(world)]


Launch = Callable[[Path, str], list[dict[str, Any]]]


@pytest.mark.parametrize(
    ("launch", "sync", "world"), [(two_local_ranks, "pg", 2), (four_mpi_ranks, "mpi", 4)]
)
def test_a_resumed_run_with_bf16_weights_ends_bit_for_bit_as_the_whole_one(
    tmp_path: Path, launch: Launch, sync: str, world: int
) -> None:
    outs = {mode: launch(tmp_path, mode) for mode in ("whole", "resume")}
    for seen in outs["whole"] + outs["resume"]:
        assert (seen["sync"], seen["world"]) == (sync, world)
        assert seen["ddp"] == "DistributedDataParallel"
        assert seen["dtypes"] == ["torch.bfloat16"]
    assert all(seen["params"] == outs["whole"][0]["params"] for seen in outs["whole"])
    whole = torch.load(tmp_path / "whole.pt")
    resumed = torch.load(tmp_path / "resume.pt")
    mid = torch.load(tmp_path / "mid.pt")
    assert (mid["step"], whole["step"], resumed["step"]) == (6, 12, 12)
    for name, value in whole["model"].items():
        assert value.dtype == torch.float32
        assert torch.equal(resumed["model"][name], value), name  # bit for bit
        assert not torch.equal(mid["model"][name], value), name
    for index, state in whole["optimizer"]["state"].items():
        for key, value in state.items():
            assert torch.equal(resumed["optimizer"]["state"][index][key], value), (index, key)
