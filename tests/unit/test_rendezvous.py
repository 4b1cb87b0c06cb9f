"""The rank side of the rendezvous bound: the worker follows torch's
init_process_group in real ranks (two local processes, gloo), without a change to the
script. The supervisor side: tests/unit/node/test_rendezvous.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from cpuaccel import _rendezvous
from cpuaccel.node.rendezvous import ENV, marker, parse
from tests.cluster.fixtures import master_port

RUN_ID = "20260101-000000-0dd0dd"

# No arguments (backend and timeout torch's), or the script's own timeout; then a
# collective, and the timeout the group keeps for the rest of the run.
SCRIPT = """\
import datetime, os, sys
import torch
import torch.distributed as dist
if sys.argv[1] == "own":
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=77))
else:
    dist.init_process_group()
from torch.distributed import distributed_c10d as c10d
t = torch.ones(1)
dist.all_reduce(t)
backend = c10d._get_default_group()._get_backend(torch.device("cpu"))
print("sum", int(t.item()), "timeout", backend.options._timeout.total_seconds(), flush=True)
"""
# Rank 1 looks for the store one port off: no rank can join.
ASTRAY = """\
import os
import torch.distributed as dist
if os.environ["RANK"] == "1":
    os.environ["MASTER_PORT"] = str(int(os.environ["MASTER_PORT"]) + 1)
dist.init_process_group("gloo")
"""


def test_the_bound_is_read_only_under_a_run_that_asked_for_it() -> None:
    assert _rendezvous.bound_of({"CPUACCEL_RUN_ID": RUN_ID, ENV: "120"}) == (RUN_ID, 120.0)
    for env in ({ENV: "120"}, {"CPUACCEL_RUN_ID": RUN_ID}, {"CPUACCEL_RUN_ID": RUN_ID, ENV: "x"}):
        assert _rendezvous.bound_of(env) is None
    before = list(sys.meta_path)
    assert _rendezvous.install({}) is False and sys.meta_path == before


def ranks(tmp_path: Path, source: str, *args: str, bound: str = "30") -> list[str]:
    """Both ranks' output (stdout and stderr, labelled), rank 0's first."""
    (tmp_path / "script.py").write_text(source)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "SLURM_"))}
    env = {
        **base, "CPUACCEL_LABEL_OUTPUT": "1", "CPUACCEL_RUN_ID": RUN_ID, ENV: bound,
        "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": master_port(),
    }  # fmt: skip
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "cpuaccel.worker", "script.py", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=tmp_path,
            env={**env, "RANK": str(rank)},
        )
        for rank in (0, 1)
    ]
    return [p.communicate(timeout=90)[0] for p in procs]


def states(output: str, rank: int) -> list[tuple[str, str | None]]:
    label = f"[rank {rank} "
    lines = [line.split("] ", 1)[1] for line in output.splitlines() if line.startswith(label)]
    return [found for found in (parse(line, RUN_ID) for line in lines) if found]


def test_a_rendezvous_is_followed_and_torchs_timeout_given_back(tmp_path: Path) -> None:
    outputs = ranks(tmp_path, SCRIPT, "none")
    for rank, output in enumerate(outputs):
        assert states(output, rank) == [("waiting", None), ("joined", None), ("ready", None)]
        # The bound was the rendezvous's only: the group keeps torch's 30 minutes.
        assert "sum 2 timeout 1800.0" in output, output


def test_a_scripts_own_timeout_is_kept(tmp_path: Path) -> None:
    for rank, output in enumerate(ranks(tmp_path, SCRIPT, "own")):
        assert states(output, rank)[-1] == ("ready", None)
        assert "sum 2 timeout 77.0" in output, output


def test_ranks_that_cannot_meet_say_why_within_the_bound(tmp_path: Path) -> None:
    started = time.monotonic()
    rank0, rank1 = ranks(tmp_path, ASTRAY, bound="2")
    # torch's store gives up after the bound, not after its 30 minutes (rank 1's client
    # retries once more before it does).
    assert time.monotonic() - started < 30
    said0, said1 = states(rank0, 0), states(rank1, 1)
    assert said0[0] == said1[0] == ("waiting", None)
    assert said0[-1][0] == "error" and "clients joined" in str(said0[-1][1]), rank0
    assert said1[-1][0] == "error" and "connect to (127.0.0.1" in str(said1[-1][1]), rank1
    assert marker(RUN_ID, "joined") not in rank0 + rank1
    assert "Traceback" in rank0  # raised on, as the script would have seen it
