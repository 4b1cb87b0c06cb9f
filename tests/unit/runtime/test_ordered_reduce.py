"""Gradient sums in rank order (runtime/gradsync.py, grad_reduce "ordered") on four real
ranks: Intel MPI's (the venv's mpirun, mpi4py) and gloo's. The same gradients give the
same bits wherever they sit in the bucket and whichever allreduce algorithm the library
is told to use; the library's own ring allreduce does not, which is what made a resumed
run drift (DDP lays a bucket out in one order for an attempt's first step, in another
after it)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.unit.runtime.world import LAUNCH_VARS

REPO = Path(__file__).resolve().parents[3]
VENV_BIN = Path(sys.executable).parent
WORLD = 4
SIZES = (30433, 3)  # not a multiple of the world; fewer elements than ranks

# Each rank's gradients: values over ten orders of magnitude, so that the order of a
# sum shows in its rounding. The layout permutes them as a rebuilt bucket would.
VALUES = """\
import numpy as np
def values(rank, n):
    rng = np.random.default_rng(rank)
    return (rng.standard_normal(n) * 10.0 ** rng.integers(-8, 2, n)).astype(np.float32)
def layout(n):
    return np.random.default_rng(99).permutation(n)
"""

# Under mpirun: MPI's sums (ordered and the library's), then gloo's through the same ranks.
RANK = (
    VALUES
    + """\
import sys, torch, torch.distributed as dist
from mpi4py import MPI
from cpuaccel.runtime import gradsync
comm = MPI.COMM_WORLD
rank, world = comm.Get_rank(), comm.Get_size()
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{sys.argv[3]}",
                        rank=rank, world_size=world)
class Bucket:
    def __init__(self, t): self.t = t
    def buffer(self): return self.t
out = {}
for n in map(int, sys.argv[2].split(",")):
    x, perm = values(rank, n), layout(n)
    for how in ("mpi-ordered", "mpi-library", "gloo-float32", "gloo-bfloat16"):
        mpi = gradsync.mpi_state(comm, world, ordered=how == "mpi-ordered")
        pg = gradsync.PgState(world, rank=rank, ordered=True)
        for name, order in (("as-is", np.arange(n)), ("permuted", perm)):
            t = torch.from_numpy(x[order].copy())
            if how.startswith("mpi"):
                gradsync.mpi_allreduce_mean_(t, mpi)
            else:
                t = t.to(getattr(torch, how.split("-")[1]))
                assert gradsync.pg_hook(pg, Bucket(t)).wait() is t
            back = np.empty(n, np.float32)
            back[order] = t.float().numpy()
            out[f"{n}-{how}-{name}"] = back
if rank == 0:
    np.savez(sys.argv[1], **out)
dist.destroy_process_group()
"""
)


def rank_order_mean(n: int, dtype: torch.dtype = torch.float32) -> np.ndarray:
    """The mean as "ordered" promises it: ((g0 + g1) + g2) + g3, then / 4, in float32
    (a bf16 bucket's values widened to float32 for the sum, the mean rounded back)."""
    scope: dict[str, Any] = {}
    exec(VALUES, scope)
    grads = [torch.from_numpy(scope["values"](r, n)).to(dtype).float() for r in range(WORLD)]
    total = grads[0].clone()
    for grad in grads[1:]:
        total += grad
    return (total / WORLD).to(dtype).float().numpy()


@pytest.fixture(scope="module")
def sums(tmp_path_factory: pytest.TempPathFactory) -> dict[str, np.ndarray]:
    """Every sum, computed by four ranks under Intel MPI told to use its ring allreduce
    (algorithm 8)."""
    tmp = tmp_path_factory.mktemp("ranks")
    script, out = tmp / "rank.py", tmp / "sums.npz"
    script.write_text(RANK)
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS and "I_MPI" not in k}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", PATH=f"{VENV_BIN}:{env['PATH']}")
    env["I_MPI_ADJUST_ALLREDUCE"] = "8"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [str(VENV_BIN / "mpirun"), "-n", str(WORLD), sys.executable, str(script)]
    done = subprocess.run(
        [*argv, str(out), ",".join(map(str, SIZES)), str(port)],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(np.load(out))


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("how", ["mpi-ordered", "gloo-float32"])
def test_an_ordered_sum_is_in_rank_order_wherever_a_gradient_sits(
    sums: dict[str, np.ndarray], how: str, n: int
) -> None:
    want = rank_order_mean(n)
    for layout in ("as-is", "permuted"):
        got = sums[f"{n}-{how}-{layout}"]
        assert np.array_equal(got, want), (layout, int((got != want).sum()))


def test_an_ordered_bf16_bucket_is_summed_the_same_for_any_layout(
    sums: dict[str, np.ndarray],
) -> None:
    for n in SIZES:
        as_is = sums[f"{n}-gloo-bfloat16-as-is"]
        assert np.array_equal(as_is, sums[f"{n}-gloo-bfloat16-permuted"])
        assert np.array_equal(as_is, rank_order_mean(n, torch.bfloat16))


def test_the_library_ring_allreduce_depends_on_the_layout(sums: dict[str, np.ndarray]) -> None:
    """Why "ordered" exists: the same gradients at other offsets sum to other bits."""
    n = SIZES[0]
    assert not np.array_equal(sums[f"{n}-mpi-library-as-is"], sums[f"{n}-mpi-library-permuted"])
