"""Resuming from the newest complete checkpoint on real nodes 2 nodes
x 2 ranks, Intel MPI, examples/train.py in fp32 with a fixed seed, a checkpoint every 10
steps:

- run A: 100 steps, never interrupted;
- run B: rank 1 killed (SIGKILL) at step 45; ``newest_complete`` on B's run folder finds
  the step-40 checkpoint on both nodes, and not a newer one that only node1 has, nor
  what hostile lines of checkpoints.jsonl point at;
- run C: started with CPUACCEL_RESUME=<that path> (as a restarted attempt gets it), it
  finishes the 100 steps, and its final parameters are A's (the data order resumed
  exactly: the loader's epoch and position are in the checkpoint).

The restart loop itself (one run, attempts) is ft-restart's: tests/cluster/test_restart.py.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from cpuaccel.connectors.connect_options import ConnectOptions
from cpuaccel.executor import ConnectionPool
from cpuaccel.inventory.inventory import Inventory
from cpuaccel.jobs.foreground import find_complete, newest_complete
from cpuaccel.node.checkpoints import RECORDS
from cpuaccel.runtime import checkpoint
from cpuaccel.testbed.cluster import Cluster
from cpuaccel.testbed.netns import WORKDIR
from tests.cluster.fixtures import REPO, TREE, master_port, train_args
from testsupport.command import cpuaccel as cpuaccel_command
from testsupport.runs import ENV, Run, cpuaccel_run, make_project

pytestmark = pytest.mark.cluster

# Ranks import cpuaccel from the tree under test.
# 20000 bytes in windows of 32: 39 batches of 4 a rank and epoch; 100 steps cross 2 ends.
TRAIN = train_args(steps=100, save_every=10, log_every=5)

# Rank 1 dies (SIGKILL, as the OOM killer does it) right after ctx.log at a step: the
# example itself has no test hook.
DIE = """\
import os, runpy, signal, sys
from cpuaccel.runtime.context import Context

die_at = int(sys.argv.pop(1))
log = Context.log

def log_then_die(self, step=None, **values):
    line = log(self, step, **values)
    if step == die_at and self.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return line

Context.log = log_then_die
here = os.path.dirname(os.path.abspath(__file__))
sys.argv[0] = os.path.join(here, "train.py")
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def job(project: Path, inventory: str, *args: str, killed: bool = False) -> Run:
    words = (
        "-i", inventory, "--nodes", "2", "--ppn", "2", "--master-port", master_port(),
        *TREE, *args,
    )  # fmt: skip
    if not killed:
        return cpuaccel_run(project, *words, timeout=400)
    # The other ranks' tracebacks (their peer gone) are expected here: no cpuaccel_run.
    started = time.monotonic()
    proc = cpuaccel_command("run", *words, cwd=project, env=ENV, timeout=400)
    return Run(proc, time.monotonic() - started)


def node_path(cluster: Cluster, node: str, path: str) -> Path:
    """The host-side path of ``path`` inside node ``node``'s own folder."""
    inside = Path(path).relative_to(WORKDIR.parent)
    return cluster.node(node).private_dir / inside


def final_params(cluster: Cluster, run: Run) -> dict[str, torch.Tensor]:
    run_dir = f"{WORKDIR}/runs/{run.record()['run_id']}"
    data = node_path(cluster, "node1", f"{run_dir}/checkpoint.pt").read_bytes()
    state = checkpoint.from_bytes(data)
    assert state["step"] == 100
    model: dict[str, torch.Tensor] = state["model"]
    return model


def metrics(cluster: Cluster, run: Run) -> dict[int, float]:
    run_dir = f"{WORKDIR}/runs/{run.record()['run_id']}"
    text = node_path(cluster, "node1", f"{run_dir}/metrics.jsonl").read_text()
    return {line["step"]: line["loss"] for line in map(json.loads, text.splitlines())}


def records(cluster: Cluster, node: str, run_dir: str) -> list[dict[str, Any]]:
    text = node_path(cluster, node, f"{run_dir}/{RECORDS}").read_text()
    return [json.loads(line) for line in text.splitlines()]


def test_a_killed_run_resumes_from_the_newest_complete_checkpoint(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    example = (REPO / "examples" / "train.py").read_text()
    project = make_project(tmp_path, {"train.py": example, "die.py": DIE})

    whole = job(project, inventory, "train.py", *TRAIN)
    assert whole.code == 0, whole
    reference = final_params(cluster, whole)

    killed = job(project, inventory, "die.py", "45", *TRAIN, killed=True)
    # Which failure the supervisor sees first (rank 1's 137, or a peer's 1) is a race.
    assert killed.code in (1, 137), killed
    status = json.loads((killed.run_dir / "status.json").read_text())
    assert status["ranks"]["1"] == 137, status
    run_dir = f"{WORKDIR}/runs/{killed.record()['run_id']}"
    for node in ("node1", "node2"):  # each node's local rank 0 saved and recorded its copy
        lines = records(cluster, node, run_dir)
        assert [line["step"] for line in lines] == [10, 20, 30, 40], (node, lines)
        assert {line["rank"] for line in lines} == ({0} if node == "node1" else {2})
        assert all(line["path"] == f"{run_dir}/checkpoint.pt" for line in lines)
    one, two = records(cluster, "node1", run_dir), records(cluster, "node2", run_dir)
    assert [x["sha256"] for x in one] == [x["sha256"] for x in two]  # the same bytes

    # Hostile or partial things on node1: a line that is not JSON, a path outside the
    # run folder, and a newer checkpoint (step 50) that only node1 has.
    node1_dir = node_path(cluster, "node1", run_dir)
    (node1_dir / "late.pt").write_bytes(b"x" * 10)
    late = {**one[-1], "path": f"{run_dir}/late.pt", "step": 50, "size": 10}
    outside = {**one[-1], "path": "/etc/passwd", "step": 60}
    with open(node1_dir / RECORDS, "a") as out:
        out.write("not json {\n" + json.dumps(outside) + "\n" + json.dumps(late) + "\n")

    inv = Inventory.load(cluster.inventory_path)
    hosts = [inv.hosts["node1"], inv.hosts["node2"]]
    with ConnectionPool(ConnectOptions(command_timeout=30)) as pool:
        found = find_complete(pool, hosts, run_dir, timeout=15)
        assert found.path == f"{run_dir}/checkpoint.pt", found
        why = [f"{host}: {text}" for host, text in found.reasons]
        assert f"node1: {RECORDS} line 5: not JSON: ignored" in why, why
        assert any("'/etc/passwd' is not a file directly in the run folder" in w for w in why)
        assert "node2: late.pt (step 50) not complete: no record of it" in why, why
        # Only node1: its newest is late.pt, which it alone holds.
        assert newest_complete(pool, hosts[:1], run_dir, 15) == f"{run_dir}/late.pt"

    # The resumed run sums with Intel MPI's ring allreduce, the others with its default:
    # resuming is exact only when the sums' order depends on neither, nor on DDP's bucket
    # layout (another in a run's first step than after it).
    resumed = job(
        project, inventory, "--env", f"CPUACCEL_RESUME={found.path}",
        "--env", "I_MPI_ADJUST_ALLREDUCE=8", "train.py", *TRAIN,
    )  # fmt: skip
    assert resumed.code == 0, resumed
    assert f"resumed from {found.path} at step 40" in resumed.stdout, resumed
    assert "done: steps 41-100 on 4 rank(s)" in resumed.stdout, resumed
    params = final_params(cluster, resumed)
    assert params.keys() == reference.keys()
    for name, value in reference.items():
        gap = (params[name] - value).norm() / value.norm().clamp_min(1e-12)
        assert gap <= 1e-5, (name, float(gap))
    # The loss over steps 96-100, all ranks' batches: the same batches as in run A.
    assert metrics(cluster, resumed)[100] == pytest.approx(metrics(cluster, whole)[100], rel=1e-5)


# ---------------------------------------------------------------- an Accelerate script

DIE_ACCELERATE = """\
import os, runpy, signal, sys
from accelerate import Accelerator

die_at = int(sys.argv.pop(1))
backward = Accelerator.backward
calls = [0]

def backward_then_die(self, loss, **kwargs):
    calls[0] += 1
    if calls[0] == die_at and self.process_index == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return backward(self, loss, **kwargs)

Accelerator.backward = backward_then_die
here = os.path.dirname(os.path.abspath(__file__))
sys.argv[0] = os.path.join(here, "accelerate_resume.py")
runpy.run_path(sys.argv[0], run_name="__main__")
"""
# 64 samples, 2 ranks, 4 a batch: 8 batches an epoch; killed in step 13, the state of
# step 10 (epoch 1, 2 batches in) is the newest.
ACCELERATE = ("--steps", "20", "--save-every", "5", "--batch", "4")


def accelerate_job(project: Path, inventory: str, *args: str, killed: bool = False) -> Run:
    words = (
        "-i", inventory, "--nodes", "2", "--ppn", "1", "--master-port", master_port(),
        *TREE, *args,
    )  # fmt: skip
    if not killed:
        return cpuaccel_run(project, *words, timeout=400)
    started = time.monotonic()
    proc = cpuaccel_command("run", *words, cwd=project, env=ENV, timeout=400)
    return Run(proc, time.monotonic() - started)


def printed(run: Run) -> dict[str, Any]:
    found = [json.loads(text) for text in run.lines(0) if text.startswith("{")]
    assert len(found) == 1, run
    result: dict[str, Any] = found[0]
    return result


def test_an_accelerate_script_resumes_from_its_saved_state(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    example = (REPO / "examples" / "accelerate_resume.py").read_text()
    project = make_project(tmp_path, {"accelerate_resume.py": example, "die.py": DIE_ACCELERATE})

    whole = accelerate_job(project, inventory, "accelerate_resume.py", *ACCELERATE)
    assert whole.code == 0, whole
    reference = printed(whole)
    assert reference["resumed_at"] == 0

    killed = accelerate_job(project, inventory, "die.py", "13", *ACCELERATE, killed=True)
    assert killed.code != 0, killed
    run_dir = f"{WORKDIR}/runs/{killed.record()['run_id']}"
    for node, rank in (("node1", 0), ("node2", 1)):
        lines = records(cluster, node, run_dir)
        assert [(x["step"], x["rank"], x["manifest"]) for x in lines] == [
            (5, rank, "state-5.manifest.json"), (10, rank, "state-10.manifest.json"),
        ], (node, lines)  # fmt: skip
    inv = Inventory.load(cluster.inventory_path)
    hosts = [inv.hosts["node1"], inv.hosts["node2"]]
    with ConnectionPool(ConnectOptions(command_timeout=30)) as pool:
        found = find_complete(pool, hosts, run_dir, timeout=15)
    assert found.path == f"{run_dir}/state-10", found

    resumed = accelerate_job(
        project, inventory, "--env", f"CPUACCEL_RESUME={found.path}", "accelerate_resume.py",
        *ACCELERATE,
    )  # fmt: skip
    assert resumed.code == 0, resumed
    result = printed(resumed)
    assert result["resumed_at"] == 10
    assert result["params"] == pytest.approx(reference["params"], rel=1e-5, abs=1e-7)
