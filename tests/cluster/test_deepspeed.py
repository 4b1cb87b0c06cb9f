"""An unmodified DeepSpeed ZeRO-2 script under `cpuaccel run`, at 2 nodes x 2 ranks on CPU.

Marked ``clients`` (``make test-clients`` installs DeepSpeed and runs these; ``make test``
leaves them out). The script is written the way DeepSpeed's docs show: ``deepspeed.initialize``
with a ZeRO stage 2 config, fp32, ``engine.backward``/``engine.step``; on a node with no
accelerator DeepSpeed picks its CPU accelerator and gloo by itself. It never imports
cpuaccel. DeepSpeed's op builder probes the C compiler with stderr duplicated and keeps
the duplicate open: the run must still end when the scripts exit, with their exit code.
A plain torch optimizer (``zero_allow_untested_optimizer``) keeps DeepSpeed from compiling
its own C++ optimizers; whatever it does compile goes to each node's own
TORCH_EXTENSIONS_DIR, given per host by the inventory's cpuaccel_env, as
docs/compatibility.md shows.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from cpuaccel.testbed.cluster import Cluster
from tests.cluster.fixtures import TREE, TWO_BY_TWO, master_port
from testsupport.runs import cpuaccel_run, make_project

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.clients,
    pytest.mark.skipif(
        importlib.util.find_spec("deepspeed") is None,
        reason="DeepSpeed is not installed (make test-clients installs it)",
    ),
]

SCRIPT = """\
import hashlib, json, socket

import deepspeed
import torch
import torch.distributed as dist
from torch import nn

torch.manual_seed(sum(socket.gethostname().encode()))  # a different start on each node
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
config = {
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 1,
    "zero_optimization": {"stage": 2},
    "zero_allow_untested_optimizer": True,
    "fp16": {"enabled": False},
    "bf16": {"enabled": False},
    "steps_per_print": 1000,
}
engine, _, _, _ = deepspeed.initialize(
    model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05), config=config
)
rank = dist.get_rank()
generator = torch.Generator().manual_seed(100 + rank)  # each rank its own batches
for _ in range(4):
    inputs = torch.randn(4, 8, generator=generator)
    loss = nn.functional.mse_loss(engine(inputs), inputs.sum(dim=1, keepdim=True))
    engine.backward(loss)
    engine.step()
digest = hashlib.sha256()
for p in engine.module.parameters():
    digest.update(p.detach().float().numpy().tobytes())
print(json.dumps({
    "rank": rank,
    "world_size": dist.get_world_size(),
    "backend": dist.get_backend(),
    "zero_stage": engine.zero_optimization_stage(),
    "host": socket.gethostname(),
    "steps": engine.global_steps,
    "params": digest.hexdigest(),
}), flush=True)
"""


def test_deepspeed_zero2_on_cpu_trains_and_ends(cluster: Cluster, tmp_path: Path) -> None:
    extensions = {}
    for node in ("node1", "node2"):
        folder = tmp_path / "torch_extensions" / node
        folder.mkdir(parents=True)
        extensions[node] = {"cpuaccel_env": {"TORCH_EXTENSIONS_DIR": str(folder)}}
    inventory = cluster.write_inventory(tmp_path / "ds.yaml", host_overrides=extensions)
    proj = make_project(tmp_path, {"ds_zero2.py": SCRIPT})
    run = cpuaccel_run(
        proj, "-i", str(inventory), *TWO_BY_TWO, "--master-port", master_port(),
        "--timeout", "600", *TREE, "ds_zero2.py", timeout=660,
    )  # fmt: skip
    assert run.code == 0, run  # not 124: the run ended when the scripts did
    assert "completed: 4 rank(s) on 2 node(s)" in run.stderr, run
    ranks = run.json_lines()
    assert sorted(ranks) == [0, 1, 2, 3], run
    for rank, (label_host, seen) in ranks.items():
        assert label_host == seen["host"] == f"node{rank // 2 + 1}", (rank, seen)
        assert seen["rank"] == rank, seen
        assert (seen["world_size"], seen["backend"], seen["zero_stage"]) == (4, "gloo", 2), seen
        assert seen["steps"] == 4, seen
    assert len({seen["params"] for _, seen in ranks.values()}) == 1, ranks
    for node in ("node1", "node2"):  # each node built DeepSpeed's op in its own folder
        built = tmp_path / "torch_extensions" / node / "deepspeed_shm_comm"
        assert (built / "deepspeed_shm_comm.so").is_file(), sorted(built.parent.rglob("*"))
