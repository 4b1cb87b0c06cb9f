"""ctx.log's trackers: TensorBoard event files beside metrics.jsonl, and clear refusals."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import cpuaccel
from cpuaccel.runtime.trackers import choose_trackers

REPO = Path(__file__).resolve().parents[3]
RUN_VARS = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK",
    "SLURM_PROCID", "CPUACCEL_BACKEND", "CPUACCEL_GRAD_SYNC", "CPUACCEL_RUN_DIR",
    "CPUACCEL_TRACKERS",
)  # fmt: skip


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in RUN_VARS:
        monkeypatch.delenv(name, raising=False)


def train_five_steps(run_dir: Path, monkeypatch: pytest.MonkeyPatch, **init: object) -> None:
    """A tiny run as `cpuaccel run` starts it: CPUACCEL_RUN_DIR set, 5 logged steps."""
    monkeypatch.setenv("CPUACCEL_RUN_DIR", str(run_dir))
    with cpuaccel.init("no", verbose=False, seed=0, **init) as ctx:  # type: ignore[arg-type]
        model = nn.Linear(3, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model, optimizer = ctx.prepare(model, optimizer)
        for step in range(1, 6):
            loss = model(torch.ones(4, 3)).pow(2).mean()
            ctx.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            ctx.log(step=step, loss=loss, lr=0.1 / step, phase="train", samples=4)


def scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator"
    ).EventAccumulator(str(log_dir))
    accumulator.Reload()
    return {
        tag: [(event.step, event.value) for event in accumulator.Scalars(tag)]
        for tag in accumulator.Tags()["scalars"]
    }


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_tensorboard_event_files_hold_the_logged_scalars(
    clean_env: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    pytest.importorskip("tensorboard", reason="pip install 'cpuaccel[tensorboard]'")
    run_dir = tmp_path / "runs" / "r1"
    if how == "argument":
        train_five_steps(run_dir, monkeypatch, trackers=["tensorboard"])
    else:
        monkeypatch.setenv("CPUACCEL_TRACKERS", "TensorBoard")
        train_five_steps(run_dir, monkeypatch)
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2, 3, 4, 5]
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*")), "no event file"
    found = scalars(run_dir / "tensorboard")
    # Every number of every line, at its step; the step and wall time are the axes.
    assert {"loss", "lr", "step_time", "samples_per_s", "sync_time", "sync_share"} <= set(found)
    assert "step" not in found and "time" not in found and "phase" not in found
    assert "world_size" not in found  # the first line's header is metrics.jsonl's only
    assert [step for step, _ in found["loss"]] == [1, 2, 3, 4, 5]
    for step, value in found["loss"]:
        assert value == pytest.approx(lines[step - 1]["loss"], rel=1e-6)
    assert [value for _, value in found["lr"]] == pytest.approx([0.1 / s for s in range(1, 6)])


def test_no_trackers_by_default(
    clean_env: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = tmp_path / "r"
    train_five_steps(run_dir, monkeypatch)
    assert sorted(p.name for p in run_dir.iterdir()) == ["metrics.jsonl"]
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    first, second = (json.loads(line) for line in lines[:2])
    # The first line tells the report the run's precision and size; the rest do not repeat it.
    assert (first["precision"], first["world_size"]) == ("fp32", 1)
    assert "precision" not in second


def test_unknown_trackers_are_named_with_the_supported_list(
    clean_env: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ValueError) as error:
        cpuaccel.init(trackers=["tensorboard", "wandb", "comet_ml"], metrics_path=tmp_path / "m")
    assert str(error.value) == (
        "init(trackers=...): 'wandb', 'comet_ml' are not choices (where ctx.log also writes); "
        "use tensorboard"
    )
    monkeypatch.setenv("CPUACCEL_TRACKERS", "tensorbord")
    expected = r"^\$CPUACCEL_TRACKERS: 'tensorbord' is not a choice \(.*\); use tensorboard$"
    with pytest.raises(ValueError, match=expected):
        cpuaccel.init(metrics_path=tmp_path / "m")
    assert not (tmp_path / "m").exists()


def test_tensorboard_missing_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as if not installed
    with pytest.raises(RuntimeError) as error:
        choose_trackers("tensorboard", {})
    assert str(error.value) == (
        "init(trackers=...) asks for tensorboard, but the tensorboard package is not "
        "installed: pip install 'cpuaccel[tensorboard]'"
    )
    assert choose_trackers(None, {"CPUACCEL_TRACKERS": " , "}) == ()
    assert choose_trackers(None, {}) == ()


TWO_RANK_SCRIPT = """\
import torch
from torch import nn
import cpuaccel

ctx = cpuaccel.init("no", verbose=False)
model = ctx.prepare(nn.Linear(2, 1))
for step in range(1, 4):
    loss = model(torch.ones(2, 2)).sum()
    ctx.backward(loss)
    ctx.log(step=step, loss=ctx.mean(loss))
ctx.close()
"""


def two_ranks(script: Path, tmp_path: Path, trackers: str) -> list[tuple[int, str]]:
    """SCRIPT as ranks 0 and 1 of one job (torchrun's variables), each in its folder."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    procs = []
    for rank in range(2):
        folder = tmp_path / f"rank{rank}"
        folder.mkdir(parents=True)
        env = {k: v for k, v in os.environ.items() if k not in RUN_VARS}
        path = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
        env.update(
            RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
            OMP_NUM_THREADS="1", PYTHONPATH=path, CPUACCEL_TRACKERS=trackers,
        )  # fmt: skip
        argv = [sys.executable, str(script)]
        procs.append(subprocess.Popen(argv, cwd=folder, env=env, text=True, stderr=subprocess.PIPE))
    errors = [proc.communicate(timeout=120)[1] for proc in procs]
    return [(proc.returncode, err) for proc, err in zip(procs, errors, strict=True)]


def test_two_ranks_only_rank_0_writes_and_a_bad_name_fails_both(tmp_path: Path) -> None:
    script = tmp_path / "two.py"
    script.write_text(TWO_RANK_SCRIPT)
    bad = two_ranks(script, tmp_path / "bad", "tensorboard,mlflow")
    for code, err in bad:  # both fail at init, neither waits for the other
        assert code != 0 and "'mlflow' is not a choice (where ctx.log also writes)" in err, err
    pytest.importorskip("tensorboard", reason="pip install 'cpuaccel[tensorboard]'")
    good = two_ranks(script, tmp_path / "good", "tensorboard")
    assert [code for code, _ in good] == [0, 0], good
    zero, one = tmp_path / "good" / "rank0", tmp_path / "good" / "rank1"
    assert [step for step, _ in scalars(zero / "tensorboard")["loss"]] == [1, 2, 3]
    assert list(one.iterdir()) == []  # rank 1: no metrics.jsonl, no event files
