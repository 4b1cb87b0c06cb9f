"""`cpuaccel run` inside a real Slurm allocation (the test bed's slurmctld and slurmd):
no -i, the allocation's nodes reached through srun, the ranks started by srun --mpi=pmi2.

The nodes' work folder is their private /srv/cpuaccel-node/work (as the SSH inventory
sets it), given with -e; the ranks import cpuaccel from the tree under test through
PYTHONPATH, which srun passes on as it passes the whole environment.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cpuaccel.errors import EXIT_NODE_FAILED, EXIT_OK
from cpuaccel.node.supervisor import EXIT_TIMEOUT
from cpuaccel.testbed.cluster import Cluster
from cpuaccel.testbed.slurm import SlurmBed
from testsupport.runs import ENV, LABELLED, job_processes, make_project

pytestmark = pytest.mark.cluster

WORKDIR = "cpuaccel_workdir=/srv/cpuaccel-node/work"
REPORT = """\
import os, socket, sys
print("report", os.environ["RANK"], os.environ["LOCAL_RANK"], os.environ["WORLD_SIZE"],
      os.environ["LOCAL_WORLD_SIZE"], socket.gethostname(), os.environ["MASTER_ADDR"],
      os.path.getsize("data.bin") if os.path.exists("data.bin") else 0,
      repr(sys.argv[1:]), flush=True)
"""
FAIL = """\
import os, sys, time
if os.environ["RANK"] == "3":
    sys.exit(7)
time.sleep(600)  # past in_allocation's timeout: only the step's end ends it
"""
RUN_DIR = re.compile(r"^run directory: (.+)$", re.M)
DATA = (4 << 20) + 12345  # bytes: above sync/transfer.RSYNC_MIN_BYTES


def in_allocation(
    slurm: SlurmBed, project: Path, nodes: int, *args: str, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    """``salloc -N NODES cpuaccel run ARGS`` from the project folder, as a user types it."""
    argv = ["salloc", "-N", str(nodes), sys.executable, "-m", "cpuaccel", "run", "-e", WORKDIR]
    proc = subprocess.run(
        [*argv, *args],
        cwd=project,
        env={**ENV, **slurm.env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def step_names(slurm: SlurmBed) -> str:
    """Every job step Slurm still knows of, with its name."""
    argv = ["squeue", "--steps", "--noheader", "--format=%i %j"]
    env = {**ENV, **slurm.env}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30, check=True)
    return done.stdout


def run_id_of(proc: subprocess.CompletedProcess[str]) -> str:
    found = RUN_DIR.findall(proc.stderr)
    assert len(found) == 1, proc.stderr
    return Path(found[0]).name


def test_salloc_two_nodes_run_ppn_2_reports_every_rank(slurm: SlurmBed, tmp_path: Path) -> None:
    project = make_project(tmp_path, {"report.py": REPORT})
    # Above sync's rsync threshold: through srun the tar stream carries it all the same.
    (project / "data.bin").write_bytes(os.urandom(DATA))
    proc = in_allocation(slurm, project, 2, "--ppn", "2", "report.py", "a b", "$x", "'q'")
    assert proc.returncode == EXIT_OK, proc.stderr
    assert re.search(r"hosts: the nodes of Slurm job \d+ \(node1, node2\)", proc.stderr)
    reports = {}
    for line in proc.stdout.splitlines():
        match = LABELLED.match(line)
        assert match, f"unlabelled line {line!r}"
        words = match[3].split(" ", 8)
        assert words[0] == "report" and int(words[1]) == int(match[1])  # label = RANK
        assert words[5] == match[2]  # the label names the rank's own node
        reports[int(words[1])] = words[2:]
    args, size = repr(["a b", "$x", "'q'"]), str(DATA)
    assert reports == {
        0: ["0", "4", "2", "node1", "node1", size, args],
        1: ["1", "4", "2", "node1", "node1", size, args],
        2: ["0", "4", "2", "node2", "node1", size, args],
        3: ["1", "4", "2", "node2", "node1", size, args],
    }
    record = json.loads((project / "runs" / run_id_of(proc) / "run.json").read_text())
    assert record["hosts"] == ["node1", "node2"] and record["exit_code"] == 0
    assert "srun" in record["command"][0] and "--mpi=pmi2" in record["command"]


def test_a_failing_rank_ends_the_step_with_its_code_and_leaves_nothing(
    slurm: SlurmBed, cluster: Cluster, tmp_path: Path
) -> None:
    project = make_project(tmp_path, {"fail.py": FAIL})
    proc = in_allocation(slurm, project, 2, "--ppn", "2", "fail.py")
    assert proc.returncode == 7, proc.stderr
    assert "first failing rank 3 on node2 (exit code 7)" in proc.stderr
    run_id = run_id_of(proc)
    status = json.loads((project / "runs" / run_id / "status.json").read_text())
    assert status["state"] == "failed" and status["exit_code"] == 7
    for node in cluster.names:
        assert job_processes(cluster, node, run_id) == [], node
    assert f"cpuaccel-{run_id}" not in step_names(slurm)


def test_a_batch_job_keeps_the_given_run_id(slurm: SlurmBed, tmp_path: Path) -> None:
    """As cpuaccel submit's batch script does: CPUACCEL_RUN_ID=ID cpuaccel run on the
    batch host, which is one of the nodes (reached locally), the others through srun."""
    project = make_project(tmp_path, {"report.py": REPORT})
    run_id = "20261130-220000-5a1b2c"
    script = project / "batch.sh"
    python = f"{sys.executable} -m cpuaccel run -e {WORKDIR} --ppn 1 report.py x"
    script.write_text(f"#!/bin/sh\nCPUACCEL_RUN_ID={run_id} {python}\n")
    out = project / "batch.out"
    done = subprocess.run(
        ["sbatch", "--wait", "-N", "3", f"--output={out}", str(script)],
        cwd=project,
        env={**ENV, **slurm.env},
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    text = out.read_text() if out.exists() else ""
    assert done.returncode == EXIT_OK, done.stderr + text
    assert "Traceback" not in text
    status = json.loads((project / "runs" / run_id / "status.json").read_text())
    assert status["state"] == "succeeded" and status["run_id"] == run_id
    reports = [line.split("] report ", 1) for line in text.splitlines()]
    hosts = sorted(parts[1].split()[4] for parts in reports if len(parts) == 2)
    assert hosts == ["node1", "node2", "node3"], text


def test_a_timeout_ends_the_step_and_leaves_nothing(
    slurm: SlurmBed, cluster: Cluster, tmp_path: Path
) -> None:
    """cpuaccel ends the job itself (the teardown: the launcher signalled, the step
    scancelled, every node swept), not a failing rank."""
    project = make_project(tmp_path, {"sleep.py": "import time\ntime.sleep(600)\n"})
    proc = in_allocation(slurm, project, 3, "--ppn", "1", "--timeout", "5", "sleep.py")
    assert proc.returncode == EXIT_TIMEOUT, proc.stderr
    run_id = run_id_of(proc)
    assert json.loads((project / "runs" / run_id / "status.json").read_text())["state"] == "timeout"
    for node in cluster.names:
        assert job_processes(cluster, node, run_id) == [], node
    assert f"cpuaccel-{run_id}" not in step_names(slurm)


def test_preflight_through_srun_names_each_failing_node(slurm: SlurmBed, tmp_path: Path) -> None:
    """The fact probe runs in one srun step over the nodes; a node that cannot run it
    is named with the fix, exit 69, and no job starts."""
    project = make_project(tmp_path, {"report.py": REPORT})
    bad = ("-e", "cpuaccel_python=/nonexistent/python")
    proc = in_allocation(slurm, project, 2, *bad, "--ppn", "1", "report.py")
    assert proc.returncode == EXIT_NODE_FAILED, proc.stderr
    for node in ("node1", "node2"):
        assert f"preflight {node}: " in proc.stderr
    assert "/nonexistent/python" in proc.stderr and "no job was started" in proc.stderr
    assert "[rank" not in proc.stdout
