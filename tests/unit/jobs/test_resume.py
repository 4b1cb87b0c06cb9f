"""Resuming from the last checkpoint, the parts without nodes:

- the rank side: $CPUACCEL_RESTART and $CPUACCEL_RESUME read by init, ``ctx.load()``
  without a path, the checkpoints.jsonl line of each save;
- the data order: a loader's position saved and loaded gives the very batches that the
  uninterrupted run reads next, across epoch ends and on every rank;
- the controller's choice (node/checkpoints.choose, nodes read by jobs/foreground.py): the
  newest checkpoint that every host holds whole, hostile lines ignored with a reason.

On the nodes: tests/cluster/test_resume.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import cpuaccel
from cpuaccel.node.checkpoints import RECORDS, HostCheckpoints, Record, choose, parse_records
from cpuaccel.runtime.context import Context
from cpuaccel.runtime.data import ShardedLoader, shard_loader
from cpuaccel.runtime.env import DistEnv

RUN_DIR = "/w/runs/20261130-180000-abcdef"
SHA_A, SHA_B = "a" * 64, "b" * 64
LAUNCH_VARS = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK",
    "SLURM_PROCID", "CPUACCEL_BACKEND", "CPUACCEL_GRAD_SYNC", "CPUACCEL_RUN_DIR",
    "CPUACCEL_RESTART", "CPUACCEL_RESUME",
)  # fmt: skip


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in LAUNCH_VARS:
        monkeypatch.delenv(name, raising=False)


def make_ctx(tmp_path: Path) -> Context:
    assert not dist.is_initialized()
    return cpuaccel.init("no", seed=0, metrics_path=tmp_path / "metrics.jsonl", verbose=False)


@pytest.fixture
def ctx(clean_env: None, tmp_path: Path) -> Iterator[Context]:
    context = make_ctx(tmp_path)
    yield context
    context.close()


# ---------------------------------------------------------------- restart and resume path


def test_restart_and_resume_come_from_the_environment() -> None:
    env = DistEnv.from_environ({})
    assert (env.restart, env.resume_path) == (0, None)
    env = DistEnv.from_environ({"CPUACCEL_RESTART": "2", "CPUACCEL_RESUME": "/w/ck.pt"})
    assert (env.restart, env.resume_path) == (2, "/w/ck.pt")
    assert DistEnv.from_environ({"CPUACCEL_RESTART": " ", "CPUACCEL_RESUME": ""}).restart == 0


@pytest.mark.parametrize("value", ["-1", "one", "1.5", "²", "3 4"])
def test_a_bad_restart_number_names_the_variable(value: str) -> None:
    with pytest.raises(ValueError, match=r"^CPUACCEL_RESTART=.*not a whole number"):
        DistEnv.from_environ({"CPUACCEL_RESTART": value})


def test_init_exposes_restart_and_resume_path(
    clean_env: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CPUACCEL_RESTART", "1")
    monkeypatch.setenv("CPUACCEL_RESUME", str(tmp_path / "ck.pt"))
    context = make_ctx(tmp_path)
    try:
        assert context.restart == 1 and context.resume_path == str(tmp_path / "ck.pt")
    finally:
        context.close()


def test_load_without_a_path_and_nothing_to_resume_loads_nothing(ctx: Context) -> None:
    model = nn.Linear(2, 2)
    before = [p.clone() for p in model.parameters()]
    assert ctx.resume_path is None
    assert ctx.load(model=model) is None
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_load_without_a_path_loads_the_resume_checkpoint(ctx: Context, tmp_path: Path) -> None:
    saved = nn.Linear(2, 2)
    ctx.save(tmp_path / "ck.pt", model=saved, step=30)
    ctx.resume_path = str(tmp_path / "ck.pt")  # what $CPUACCEL_RESUME gives init
    model = nn.Linear(2, 2)
    state = ctx.load(model=model)
    assert state is not None and state["step"] == 30
    pairs = zip(saved.parameters(), model.parameters(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)


def test_save_records_its_line_in_the_run_folder(ctx: Context, tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    ctx.run_dir = str(run_dir)
    ctx.save(run_dir / "checkpoint.pt", w=torch.ones(3), step=10)
    ctx.save(run_dir / "checkpoint.pt", w=torch.zeros(3), step=torch.tensor(20))
    ctx.save(run_dir / "other.pt", note="no step")
    lines = [json.loads(x) for x in (run_dir / RECORDS).read_text().splitlines()]
    assert [line["step"] for line in lines] == [10, 20, None]
    last = (run_dir / "checkpoint.pt").read_bytes()
    assert lines[1] == {
        "path": str(run_dir / "checkpoint.pt"),
        "step": 20,
        "sha256": hashlib.sha256(last).hexdigest(),
        "size": len(last),
        "time": lines[1]["time"],
        "rank": 0,
        "host": socket.gethostname(),
    }
    # What the controller makes of it: the newest complete is the step-20 file.
    found = HostCheckpoints("h", files={"checkpoint.pt": (len(last), 0.0), "other.pt": (1, 0.0)})
    parse_records((run_dir / RECORDS).read_text(), str(run_dir), found)
    assert choose([found], str(run_dir)).path == str(run_dir / "checkpoint.pt")


# ---------------------------------------------------------------- data order


def batches(loader: Any, count: int) -> list[list[int]]:
    """The next ``count`` batches, passes chained as a training loop does."""
    seen: list[list[int]] = []
    while len(seen) < count:
        for (batch,) in loader:
            seen.append(batch.tolist())
            if len(seen) == count:
                break
    return seen


def sharded(rank: int, world: int = 2, seed: int = 3) -> ShardedLoader:
    data = DataLoader(TensorDataset(torch.arange(40)), batch_size=3, shuffle=True, drop_last=True)
    loader = shard_loader(data, rank=rank, world_size=world, seed=seed)
    assert isinstance(loader, ShardedLoader)
    return loader


@pytest.mark.parametrize("stop", [0, 2, 6, 7, 13])  # 6 batches an epoch a rank
def test_a_loader_resumed_from_its_state_reads_what_the_whole_run_reads(stop: int) -> None:
    for rank in (0, 1):
        whole = batches(sharded(rank), 20)
        first = sharded(rank)
        assert batches(first, stop) == whole[:stop]
        state = json.loads(json.dumps(first.state_dict()))  # plain numbers, as saved
        resumed = sharded(rank)
        resumed.load_state_dict(state)
        # Until the pass starts, len() is a whole epoch's: scripts compute from it.
        assert len(resumed) == 6
        assert batches(resumed, 20 - stop) == whole[stop:], (rank, stop, state)


def test_loader_state_at_the_end_of_a_pass_is_the_next_epoch() -> None:
    loader = sharded(0)
    assert loader.state_dict() == {"epoch": 0, "position": 0}
    batches(loader, 6)  # the whole first pass, left before its iterator ended
    assert loader.state_dict() == {"epoch": 1, "position": 0}
    for _ in loader:
        pass
    assert loader.state_dict() == {"epoch": 2, "position": 0}
    loader.set_epoch(5, skip_batches=2)
    assert loader.state_dict() == {"epoch": 5, "position": 2}


def train_steps(ctx: Context, model: nn.Module, opt: Any, loader: Any, steps: int) -> list[int]:
    """``steps`` SGD steps over ``loader``; the first sample of each batch, in order."""
    seen: list[int] = []
    while len(seen) < steps:
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            ctx.backward(loss)
            opt.step()
            opt.zero_grad()
            seen.append(int(x[0, 0].item()))
            if len(seen) == steps:
                break
    return seen


def test_save_and_load_put_the_data_order_back(ctx: Context, tmp_path: Path) -> None:
    """No code of the script's own: ctx.save holds the prepared loader's place, ctx.load
    (here before prepare, as after a restart) puts it back."""
    x = torch.arange(30.0).reshape(15, 2)
    data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=2, shuffle=True)

    def fresh() -> tuple[nn.Module, Any]:
        torch.manual_seed(0)
        model = nn.Linear(2, 1)
        return model, torch.optim.SGD(model.parameters(), lr=1e-3)

    model, opt = fresh()
    model, opt, loader = ctx.prepare(model, opt, data)
    whole = train_steps(ctx, model, opt, loader, 25)  # 8 batches an epoch: 3 epochs and a bit
    final = [p.detach().clone() for p in model.parameters()]

    model, opt = fresh()
    loader = ctx.prepare(data)
    ctx._loaders = [loader]  # type: ignore[attr-defined]  # as in a new process
    first = train_steps(ctx, model, opt, loader, 11)
    ctx.save(tmp_path / "ck.pt", model=model, optimizer=opt, step=11)
    ctx._loaders = []  # type: ignore[attr-defined]  # a new process: nothing prepared yet
    model, opt = fresh()
    state = ctx.load(tmp_path / "ck.pt", model=model, optimizer=opt)
    assert state["step"] == 11 and "cpuaccel_loaders" not in state
    loader = ctx.prepare(data)
    rest = train_steps(ctx, model, opt, loader, 14)
    assert first + rest == whole
    assert all(torch.equal(a, b) for a, b in zip(final, model.parameters(), strict=True))


# ---------------------------------------------------------------- the controller's choice


def host(name: str, lines: list[Any], files: dict[str, int] | None) -> HostCheckpoints:
    text = "\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines)
    found = HostCheckpoints(name, files=None if files is None else {})
    if files is not None:
        found.files = {n: (size, 1000.0) for n, size in files.items()}
    parse_records(text, RUN_DIR, found)
    return found


def line(
    name: str, step: int | None, sha: str = SHA_A, size: int = 100, time: float = 2000.0
) -> dict[str, Any]:
    return {
        "path": f"{RUN_DIR}/{name}", "step": step, "sha256": sha, "size": size, "time": time,
        "rank": 0, "host": "n",
    }  # fmt: skip


def test_the_newest_checkpoint_on_every_host_is_chosen() -> None:
    a = host("a", [line("ck-10.pt", 10), line("ck-20.pt", 20)], {"ck-10.pt": 100, "ck-20.pt": 100})
    b = host("b", [line("ck-20.pt", 20), line("ck-10.pt", 10)], {"ck-10.pt": 100, "ck-20.pt": 100})
    found = choose([a, b], RUN_DIR + "/")
    assert found.path == f"{RUN_DIR}/ck-20.pt" and found.reasons == []


def test_a_checkpoint_on_one_host_only_is_not_chosen() -> None:
    files = {"ck-10.pt": 100, "ck-20.pt": 100}
    a = host("a", [line("ck-10.pt", 10), line("ck-20.pt", 20)], files)
    b = host("b", [line("ck-10.pt", 10)], {"ck-10.pt": 100})
    found = choose([a, b], RUN_DIR)
    assert found.path == f"{RUN_DIR}/ck-10.pt"
    assert found.reasons == [("b", "ck-20.pt (step 20) not complete: no record of it")]


@pytest.mark.parametrize(
    ("b_lines", "b_files", "why"),
    [
        ([line("ck.pt", 40)], {}, "the file is gone"),
        ([line("ck.pt", 40)], {"ck.pt": 99}, "the file is 99 bytes, its record says 100"),
        ([line("ck.pt", 40, sha=SHA_B)], {"ck.pt": 100}, "its copy is another one"),
        ([line("ck.pt", 30)], {"ck.pt": 100}, "its copy is another one (step 30"),
        ([line("ck.pt", 40, time=900.0)], {"ck.pt": 100}, "rewritten after its record"),
    ],
)
def test_a_copy_that_is_not_the_same_whole_file_is_incomplete(
    b_lines: list[Any], b_files: dict[str, int], why: str
) -> None:
    a = host("a", [line("ck.pt", 30), line("ck.pt", 40)], {"ck.pt": 100})
    b = host("b", b_lines, b_files)
    found = choose([a, b], RUN_DIR)
    assert found.path is None
    assert len(found.reasons) == 1 and why in found.reasons[0][1], found.reasons


def test_a_host_that_could_not_be_read_has_nothing() -> None:
    a = host("a", [line("ck.pt", 40)], {"ck.pt": 100})
    assert choose([a, host("b", [], None)], RUN_DIR).path is None
    assert choose([], RUN_DIR).path is None


def test_steps_then_time_order_the_candidates() -> None:
    files = {"x.pt": 100, "y.pt": 100, "z.pt": 100}
    lines = [line("x.pt", 5, time=3000.0), line("y.pt", 5, time=4000.0), line("z.pt", None)]
    assert choose([host("a", lines, files)], RUN_DIR).path == f"{RUN_DIR}/y.pt"
    only_unnumbered = [line("z.pt", None, time=2001.0), line("x.pt", None, time=2002.0)]
    assert choose([host("a", only_unnumbered, files)], RUN_DIR).path == f"{RUN_DIR}/x.pt"


def test_hostile_lines_are_ignored_with_a_reason_and_never_followed() -> None:
    outside = {**line("ck.pt", 99), "path": "/etc/passwd"}
    climbing = {**line("ck.pt", 98), "path": f"{RUN_DIR}/../other/ck.pt"}
    nested = {**line("ck.pt", 97), "path": f"{RUN_DIR}/sub/ck.pt"}
    hidden = {**line("ck.pt", 96), "path": f"{RUN_DIR}/.ck.pt.tmp-n-1"}
    relative = {**line("ck.pt", 95), "path": "ck.pt"}
    lines: list[Any] = [
        "not json {", "[1, 2]", outside, climbing, nested, hidden, relative,
        {**line("ck.pt", 94), "step": "94"}, {**line("ck.pt", 93), "step": True},
        {**line("ck.pt", 92), "sha256": "zz"}, {**line("ck.pt", 91), "size": -1},
        {**line("ck.pt", 90), "time": "now"}, '{"path": 3}',
        json.dumps(line("ck.pt", 89)) + " " * 5000,
        "[" * 3000,  # json's parser: a RecursionError, through every except ValueError
        {**line("ck.pt", 88), "path": f"{RUN_DIR}/ck.pt\n"},  # "$" matched before "\n"
        line("ck.pt", 40),
    ]  # fmt: skip
    found = host("a", lines, {"ck.pt": 100, "passwd": 100})
    assert list(found.records) == ["ck.pt"] and found.records["ck.pt"].step == 40
    assert len(found.reasons) == 16
    assert found.reasons[0] == f"{RECORDS} line 1: not JSON: ignored"
    assert "'/etc/passwd' is not a file directly in the run folder" in found.reasons[2]
    assert "longer than 4096 bytes" in found.reasons[13]
    assert (
        found.reasons[14] == f"{RECORDS} line 15: values nested more than 200 levels deep: ignored"
    )
    assert "is not a file directly in the run folder" in found.reasons[15]
    assert choose([found], RUN_DIR).path == f"{RUN_DIR}/ck.pt"


def test_a_record_is_what_the_runtime_writes() -> None:
    parsed = host("a", [line("ck.pt", 7)], {}).records["ck.pt"]
    assert parsed == Record("ck.pt", 7, SHA_A, 100, 2000.0)
    assert os.path.join(RUN_DIR, parsed.name) == f"{RUN_DIR}/ck.pt"


def test_only_the_tail_of_a_huge_checkpoints_file_is_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A checkpoints.jsonl of 50 MB: one read of its last TAIL bytes, the cut line dropped."""
    from cpuaccel.jobs import foreground as resume

    whole = json.dumps(line("ck.pt", 40)) + "\n"
    tail = ("x" * 100 + "\n" + whole).encode()
    asked: list[tuple[int, int]] = []

    def listing(conn: Any, run_dir: str, timeout: float) -> list[Any]:
        sizes = {RECORDS: 50_000_000, "ck.pt": 100}
        return [resume.runfiles.RemoteFile(n, s, 1000.0) for n, s in sizes.items()]

    def read(conn: Any, run_dir: str, name: str, offset: int, limit: int, timeout: float) -> Any:
        asked.append((offset, limit))
        return tail, offset + len(tail), 50_000_000

    monkeypatch.setattr(resume.runfiles, "list_files", listing)
    monkeypatch.setattr(resume.runfiles, "read", read)
    conn = type("Conn", (), {"host": type("H", (), {"name": "a"})()})()
    found = resume.read_host(conn, RUN_DIR, timeout=5)
    assert asked == [(50_000_000 - resume.TAIL, resume.TAIL)]
    assert found.reasons == [f"{RECORDS} is 50000000 bytes: only its last {resume.TAIL} read"]
    assert list(found.records) == ["ck.pt"]
    assert choose([found], RUN_DIR).path == f"{RUN_DIR}/ck.pt"


# ---------------------------------------------------------------- record_checkpoint


def test_record_checkpoint_of_a_folder_writes_its_manifest(
    clean_env: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What Accelerate's save_state writes: a folder, whose per-process RNG files differ
    between nodes (each holds its own ranks'), so they are left out of the hash."""
    run_dir = tmp_path / "runs" / "r1"
    state = run_dir / "state-10"
    (state / "sub").mkdir(parents=True)
    (state / "model.safetensors").write_bytes(b"weights")
    (state / "sub" / "x.bin").write_bytes(b"x")
    (state / "random_states_0.pkl").write_bytes(b"rng of rank 0")
    (state / "link").symlink_to("/etc/passwd")
    assert cpuaccel.record_checkpoint(state, step=10) is None  # not under cpuaccel run
    monkeypatch.setenv("CPUACCEL_RUN_DIR", str(run_dir))
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert cpuaccel.record_checkpoint(state, step=10) is None  # local rank 1: not its part
    monkeypatch.setenv("LOCAL_RANK", "0")
    line = cpuaccel.record_checkpoint(state, step=10)
    assert line is not None and line["manifest"] == "state-10.manifest.json"
    listed = (run_dir / "state-10.manifest.json").read_bytes()
    assert json.loads(listed) == [
        ["model.safetensors", 7, hashlib.sha256(b"weights").hexdigest()],
        ["sub/x.bin", 1, hashlib.sha256(b"x").hexdigest()],
    ]
    assert (line["sha256"], line["size"], line["rank"]) == (
        hashlib.sha256(listed).hexdigest(), len(listed), 2,
    )  # fmt: skip
    (state / "random_states_0.pkl").write_bytes(b"another node's ranks")
    assert cpuaccel.record_checkpoint(state, step=10)["sha256"] == line["sha256"]  # type: ignore[index]
    # The controller checks the manifest (the listing shows files only).
    found = HostCheckpoints("h", files={"state-10.manifest.json": (len(listed), 0.0)})
    parse_records((run_dir / RECORDS).read_text(), str(run_dir), found)
    assert choose([found], str(run_dir)).path == str(state)
    gone = HostCheckpoints("h", files={})
    parse_records((run_dir / RECORDS).read_text(), str(run_dir), gone)
    assert choose([gone], str(run_dir)).reasons[0][1].endswith("state-10.manifest.json is gone")


def test_a_manifest_of_another_name_is_refused() -> None:
    bad = {**line("state-10", 10), "manifest": "../../etc/passwd"}
    found = host("a", [bad], {"passwd": 100})
    assert found.records == {} and "manifest '../../etc/passwd' is not" in found.reasons[0]
