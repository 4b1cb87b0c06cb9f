"""`cpuaccel submit` against the real Slurm of the test cluster: a batch job runs
`cpuaccel run` on 3 nodes to COMPLETED with every rank's log, the metrics and a report;
a failing rank's exit code reaches sacct and ps; `stop` cancels a running job. Each time
no process of the run is left on any node."""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest

from cpuaccel.errors import EXIT_OK
from cpuaccel.testbed.cluster import Cluster
from cpuaccel.testbed.slurm import SlurmBed
from tests.cluster.fixtures import REPO, master_port
from testsupport.command import cpuaccel, inherited_env, start_cpuaccel
from testsupport.runs import job_processes, make_project

pytestmark = pytest.mark.cluster

ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}
TINY = ("--width", "32", "--layers", "1", "--heads", "2", "--context", "16", "--batch", "4")
TINY += ("--corpus-bytes", "20000", "--log-every", "5", "--precision", "fp32")
# Ranks 0 and 2 wait to be ended; rank 1 fails at once with 3.
FAIL = """import os, sys, time
rank = int(os.environ["RANK"])
print(f"rank {rank} up", flush=True)
if rank == 1:
    sys.exit(3)
time.sleep(300)
"""
SLOW = """import os, time
print(f"rank {os.environ['RANK']} up", flush=True)
for i in range(600):
    print(f"tick {i}", flush=True)
    time.sleep(0.5)
"""


def _project(tmp_path: Path, files: dict[str, str]) -> Path:
    # Its own master port: a job just ended leaves the last one in TIME_WAIT.
    port = master_port()
    return make_project(tmp_path, {**files, "cpuaccel.yaml": f"master_port: {port}\n"})


def _env(bed: SlurmBed) -> dict[str, str]:
    return inherited_env(**bed.env)


def _verb(bed: SlurmBed, project: Path, *args: str, timeout: float = 120) -> tuple[int, str, str]:
    done = cpuaccel(*args, cwd=project, env=_env(bed), timeout=timeout)
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, done.stdout, done.stderr


def _submit(bed: SlurmBed, project: Path, *args: str) -> tuple[str, str]:
    code, out, err = _verb(bed, project, "submit", "--nodes", "3", "--ppn", "1", *args)
    assert code == EXIT_OK, err
    found = re.fullmatch(r"Slurm job (\d+), run (\S+)\n", out)
    assert found is not None, out
    return found.group(1), found.group(2)


def _sacct(bed: SlurmBed, job: str, timeout: float = 300) -> tuple[str, str]:
    """(State, ExitCode) once sacct says the job ended."""
    deadline = time.monotonic() + timeout
    while True:
        out = bed.client(["sacct", "-X", "-n", "-P", "-j", job, "-o", "State,ExitCode"]).stdout
        rows = [line.split("|") for line in out.splitlines() if line.strip()]
        if rows and rows[0][0].split()[0] in ENDED:
            return rows[0][0].split()[0], rows[0][1]
        assert time.monotonic() < deadline, f"job {job} did not end: {out!r}"
        time.sleep(1)


def _nothing_left(cluster: Cluster, run_id: str) -> None:
    left = {n.name: job_processes(cluster, n.name, run_id) for n in cluster.nodes}
    assert {name: procs for name, procs in left.items() if procs} == {}


def _batch_output(project: Path, run_id: str, job: str) -> str:
    path = project / "runs" / run_id / f"slurm-{job}.out"
    return path.read_text() if path.exists() else "(no batch output)"


def _ps(bed: SlurmBed, project: Path) -> dict[str, object]:
    code, out, err = _verb(bed, project, "ps", "--json")
    assert code == EXIT_OK, err
    rows = json.loads(out)
    assert len(rows) == 1
    row: dict[str, object] = rows[0]
    return row


def test_submit_runs_train_to_completed_with_logs_metrics_and_report(
    cluster: Cluster, slurm: SlurmBed, tmp_path: Path
) -> None:
    project = _project(tmp_path, {"train.py": (REPO / "examples" / "train.py").read_text()})
    # run's own options given to submit reach the run inside the job (fp32 is not
    # what auto would pick on a CPU with native bf16, and not what train.py defaults to).
    job, run_id = _submit(
        slurm, project, "--mixed-precision", "fp32", "train.py", "--steps", "30", *TINY
    )
    state = _sacct(slurm, job)
    folder = project / "runs" / run_id
    assert state == ("COMPLETED", "0:0"), _batch_output(project, run_id, job)
    for rank in range(3):
        assert (folder / f"rank-{rank}.log").stat().st_size > 0, rank
    metrics = [json.loads(line) for line in (folder / "metrics.jsonl").open()]
    assert metrics[-1]["step"] == 30 and metrics[0]["precision"] == "fp32"
    record = json.loads((folder / "run.json").read_text())
    assert record["slurm"]["job_id"] == job and record["run_id"] == run_id
    assert sorted(record["hosts"]) == ["node1", "node2", "node3"]
    row = _ps(slurm, project)
    assert row["state"] == "succeeded" and row["exit_code"] == 0
    assert row["slurm"] == {"job_id": job, "state": "COMPLETED", "exit_code": 0, "reason": None}
    code, out, err = _verb(slurm, project, "logs", run_id)
    assert code == EXIT_OK, err
    assert {f"[rank {r} " for r in range(3)} <= {line[:8] for line in out.splitlines()}
    code, out, err = _verb(slurm, project, "report", f"runs/{run_id}", timeout=180)
    assert code == EXIT_OK, err
    assert (folder / "report.png").stat().st_size > 0
    assert "step 1 to 30" in out and "3 nodes x 1 ppn" in out and "(succeeded)" in out
    _nothing_left(cluster, run_id)


def test_a_failing_rank_reaches_sacct_and_ps(
    cluster: Cluster, slurm: SlurmBed, tmp_path: Path
) -> None:
    # A folder that sbatch's #SBATCH reader would cut (a blank, a '#', quotes): quoted;
    # a '%' that --output would expand: doubled.
    odd = tmp_path / "a b #c $x'q\"d%e"
    odd.mkdir()
    project = _project(odd, {"fail.py": FAIL})
    job, run_id = _submit(slurm, project, "fail.py")
    state = _sacct(slurm, job)
    assert state == ("FAILED", "3:0"), _batch_output(project, run_id, job)
    assert (project / "runs" / run_id / f"slurm-{job}.out").is_file()
    row = _ps(slurm, project)
    assert (row["state"], row["exit_code"]) == ("failed", 3)
    assert row["slurm"] == {"job_id": job, "state": "FAILED", "exit_code": 3, "reason": None}
    code, out, _ = _verb(slurm, project, "ps")
    assert code == EXIT_OK
    assert "failed (3)" in out and f"{job} FAILED" in out
    _nothing_left(cluster, run_id)


def test_stop_cancels_a_running_submitted_job(
    cluster: Cluster, slurm: SlurmBed, tmp_path: Path
) -> None:
    project = _project(tmp_path, {"slow.py": SLOW})
    job, run_id = _submit(slurm, project, "slow.py")
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    follow = start_cpuaccel("logs", "-f", run_id, cwd=project, env=_env(slurm), **pipes)
    folder = project / "runs" / run_id
    deadline = time.monotonic() + 180
    while not all(b"tick" in _read(folder / f"rank-{r}.log") for r in range(3)):
        assert time.monotonic() < deadline, _batch_output(project, run_id, job)
        time.sleep(1)
    assert _ps(slurm, project)["state"] == "running"
    code, out, err = _verb(slurm, project, "stop", run_id, timeout=200)
    assert code == EXIT_OK, err
    assert f"Slurm job {job} CANCELLED" in out
    # Verified before stop returned: Slurm lists it no more (not even COMPLETING).
    assert job not in slurm.client(["squeue", "-h", "-o", "%i"]).stdout.split()
    assert _sacct(slurm, job)[0] == "CANCELLED"
    followed, said = follow.communicate(timeout=60)
    assert follow.returncode == EXIT_OK
    assert "tick" in followed and f"run {run_id} ended: stopped" in said
    assert _ps(slurm, project)["state"] == "stopped"
    _nothing_left(cluster, run_id)


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""


def test_submit_refuses_a_partition_slurm_does_not_have(slurm: SlurmBed, tmp_path: Path) -> None:
    project = _project(tmp_path, {"fail.py": FAIL})
    code, _, err = _verb(slurm, project, "submit", "-p", "nope", "--nodes", "1", "fail.py")
    assert code == 69 and "invalid partition" in err.lower()
    assert list((project / "runs").glob("*")) == []


def test_a_queued_job_is_queued_in_ps_followed_and_cancelled(
    slurm: SlurmBed, tmp_path: Path
) -> None:
    project = _project(tmp_path, {"slow.py": SLOW})
    # The user's own hold: Slurm keeps the job PENDING (JobHeldUser) until released.
    job, run_id = _submit(slurm, project, "--sbatch-arg=--hold", "slow.py")
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    follow = start_cpuaccel("logs", "-f", run_id, cwd=project, env=_env(slurm), **pipes)
    guard = threading.Timer(60, follow.kill)  # a follower that never says: the test fails
    guard.start()
    assert follow.stderr is not None
    first = follow.stderr.readline()  # before stop: it has seen the job queued
    guard.cancel()
    assert f"waiting for Slurm job {job} to start: PENDING (JobHeldUser)" in first
    row = _ps(slurm, project)
    assert row["state"] == "queued", row
    assert row["slurm"] == {"job_id": job, "state": "PENDING", "exit_code": None,
                            "reason": "JobHeldUser"}  # fmt: skip
    code, out, err = _verb(slurm, project, "stop", run_id)
    assert code == EXIT_OK, err
    assert f"stopped (Slurm job {job} CANCELLED)" in out
    _, said = follow.communicate(timeout=60)
    assert follow.returncode == EXIT_OK
    assert f"run {run_id} ended: stopped" in said
    assert not (project / "runs" / run_id / "status.json").exists()  # it never ran
