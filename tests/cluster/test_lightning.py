"""An unmodified Lightning DDP script under `cpuaccel run`, at 2 nodes x 2 ranks, on nodes
without mpi4py.

The script is written the way Lightning's docs show (``Trainer(accelerator="cpu",
strategy="ddp", devices=2, num_nodes=2)``) and never imports cpuaccel. Lightning picks its
cluster environment from the rank's environment, first match wins: TorchElastic (torchrun's
variables), SLURM, LSF, then MPI (when mpi4py imports and its world is larger than one),
else its own single-node guess, which gives each node's ranks global ranks 0 and 1 again.
The test nodes have mpi4py, which would let Lightning find the job through MPI instead of
through what cpuaccel sets, so the run hides it (NO_MPI4PY below): to Lightning the nodes
then look like nodes where mpi4py was never installed, and only torchrun's variables can
tell it the job's shape.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cpuaccel.testbed.cluster import Cluster
from tests.cluster.fixtures import TREE, TWO_BY_TWO, master_port
from testsupport.runs import cpuaccel_run, make_project

pytestmark = pytest.mark.cluster

# A sitecustomize.py, first on the ranks' PYTHONPATH, that runs in every rank before the
# worker and the script: mpi4py neither imports (ModuleNotFoundError, as where it is not
# installed) nor has metadata (importlib.metadata finds no distribution). Lightning asks
# both (lightning_utilities' RequirementCache("mpi4py"), then `from mpi4py import MPI`).
NO_MPI4PY = """\
import importlib.machinery
import sys

HIDDEN = "mpi4py"


class WithoutMpi4py(importlib.machinery.PathFinder):
    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname.partition(".")[0] == HIDDEN:
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return super().find_spec(fullname, path, target)

    @classmethod
    def find_distributions(cls, context=None, **kwargs):
        for dist in super().find_distributions(context, **kwargs):
            if dist.metadata["Name"].lower() != HIDDEN:
                yield dist


sys.meta_path[:] = [
    WithoutMpi4py if finder is importlib.machinery.PathFinder else finder
    for finder in sys.meta_path
]
"""

# Lightning's docs' DDP script, tiny: a linear layer, a few steps. Each rank prints one
# JSON line: what Lightning decided, and a digest of the trained parameters.
SCRIPT = """\
import hashlib, json, socket

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        inputs, targets = batch
        return nn.functional.mse_loss(self.layer(inputs), targets)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def digest(model):
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()


generator = torch.Generator().manual_seed(7)
inputs = torch.randn(256, 8, generator=generator)
data = TensorDataset(inputs, inputs.sum(dim=1, keepdim=True))
# A different start on every process: only DDP's broadcast and averaged gradients make
# the parameters the same everywhere.
torch.manual_seed(sum(socket.gethostname().encode()))
model = Tiny()
before = digest(model)
trainer = L.Trainer(
    accelerator="cpu", strategy="ddp", devices=2, num_nodes=2, max_steps=4,
    logger=False, enable_checkpointing=False, enable_progress_bar=False,
    enable_model_summary=False,
)
trainer.fit(model, DataLoader(data, batch_size=8))
try:
    import mpi4py
    mpi = "importable"
except ImportError:
    mpi = "absent"
print(json.dumps({
    "environment": type(trainer.strategy.cluster_environment).__name__,
    "global_rank": trainer.global_rank,
    "local_rank": trainer.local_rank,
    "node_rank": trainer.node_rank,
    "world_size": trainer.world_size,
    "host": socket.gethostname(),
    "steps": trainer.global_step,
    "before": before,
    "after": digest(model),
    "mpi4py": mpi,
}), flush=True)
"""


def test_lightning_ddp_finds_the_job_from_torchrun_s_variables(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    hide = tmp_path / "no-mpi4py"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(NO_MPI4PY)
    hide.chmod(0o755)
    tree = TREE[1].removeprefix("PYTHONPATH=")
    proj = make_project(tmp_path, {"lightning_ddp.py": SCRIPT})
    run = cpuaccel_run(
        proj, "-i", inventory, *TWO_BY_TWO, "--master-port", master_port(),
        "--timeout", "120", "--env", f"PYTHONPATH={hide}:{tree}", "lightning_ddp.py",
    )  # fmt: skip
    assert run.code == 0, run
    ranks = run.json_lines()
    assert sorted(ranks) == [0, 1, 2, 3], run
    for rank, (label_host, seen) in ranks.items():
        node = rank // 2
        assert label_host == seen["host"] == f"node{node + 1}", (rank, seen)
        assert seen["mpi4py"] == "absent", seen  # the hiding held in the script's process
        assert seen["environment"] == "TorchElasticEnvironment", seen
        assert (seen["global_rank"], seen["local_rank"], seen["node_rank"]) == (
            rank, rank % 2, node,
        ), seen  # fmt: skip
        assert (seen["world_size"], seen["steps"]) == (4, 4), seen
    # Trained as one job: every rank started elsewhere and ended with the same parameters.
    assert len({seen["before"] for _, seen in ranks.values()}) == 2, ranks
    after = {seen["after"] for _, seen in ranks.values()}
    assert len(after) == 1 and after.isdisjoint(s["before"] for _, s in ranks.values()), ranks
