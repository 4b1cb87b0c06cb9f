"""The seed's scenario 2 as one `cpuaccel run` line: 4 machines x 4 processes, bf16, Intel MPI.

Today's recipe is a hand-written hostfile, oneCCL's setvars.sh, a handful of exports and
`mpirun -f hostfile -n 16 -ppn 4 ...` typed on node0. Here the user keeps the seed's own
`default_config.yaml` (verbatim) and a hostfile naming the nodes beside it, and types
`cpuaccel run --config default_config.yaml train.py` on a 4-node cluster of its own (the
session cluster has 3 nodes); each rank joins a torch.distributed process group and
all-reduces a bf16 tensor.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cpuaccel.testbed.cluster import Cluster

pytestmark = pytest.mark.cluster

SCRIPT = """\
import json, os, socket
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
value = torch.full((4,), float(dist.get_rank()), dtype=torch.bfloat16)
dist.all_reduce(value)
print(json.dumps({"rank": dist.get_rank(), "world": dist.get_world_size(),
                  "local": int(os.environ["LOCAL_RANK"]), "host": socket.gethostname(),
                  "threads": torch.get_num_threads(), "sum": value[0].item()}), flush=True)
dist.destroy_process_group()
"""


def test_four_machines_sixteen_processes_bf16_is_one_line(tmp_path: Path) -> None:
    # Apart from the session cluster (CPUACCEL_TEST_CLUSTER_ID), so both can be up at once.
    cluster_id = (int(os.environ.get("CPUACCEL_TEST_CLUSTER_ID", "0")) + 40) % 64
    project = tmp_path / "scenario2"
    project.mkdir()
    (project / "train.py").write_text(SCRIPT)
    # The seed's file names /home/user/hostfile; cpuaccel takes the hostfile beside it.
    seed = Path(__file__).parents[1] / "unit/config/data/default_config.multi-cpu.yaml"
    (project / "default_config.yaml").write_text(seed.read_text())
    with Cluster(4, cluster_id=cluster_id) as cluster:
        (project / "hostfile").write_text("".join(f"{n}  # {n} ip\n" for n in cluster.names))
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "cpuaccel",
                "run",
                "-i",
                str(cluster.inventory_path),
                "--config",
                "default_config.yaml",
                "train.py",
            ],
            cwd=project,
            capture_output=True,
            text=True,
            env={"NO_COLOR": "1", "PATH": "/usr/bin:/bin", "HOME": str(Path.home())},
            timeout=300,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        reports = [
            json.loads(line.split("] ", 1)[1])
            for line in proc.stdout.splitlines()
            if line.startswith("[rank ")
        ]
        assert sorted(r["rank"] for r in reports) == list(range(16))
        assert {r["world"] for r in reports} == {16}
        assert {r["sum"] for r in reports} == {float(sum(range(16)))}  # exact in bf16
        for r in reports:
            assert r["host"] == f"node{r['rank'] // 4 + 1}"
            assert r["local"] == r["rank"] % 4
        command = next(Path(project, "runs").glob("*/command.txt")).read_text()
        assert " -n 16 -ppn 4 " in command
        assert "main_process_ip: 36.112.23.24 is not in the hostfile" in proc.stderr
        env_sh = next(Path(project, "runs").glob("*/env.sh")).read_text()
        assert "export MASTER_PORT=29500\n" in env_sh
        assert "export ACCELERATE_MIXED_PRECISION=bf16\n" in env_sh
