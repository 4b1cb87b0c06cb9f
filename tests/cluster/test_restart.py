"""`run --max-restarts` against real nodes: a failed attempt is ended
everywhere, and the next one starts in the same run folder; a failure that repeats
identically before any checkpoint stops the run.

Scripts import nothing heavy: each attempt is about a second.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from cpuaccel.testbed.cluster import NODE_DIR, Cluster
from tests.cluster.fixtures import REPO, train_args
from testsupport.command import cpuaccel
from testsupport.runs import (
    ENV,
    BackgroundRun,
    Run,
    cpuaccel_run,
    job_processes,
    make_project,
)

pytestmark = pytest.mark.cluster

NODES = ("node1", "node2", "node3")

# Rank 0 fails once rank 1 has started (a flag in a folder the nodes share), every
# attempt; rank 1 waits to be ended.
FAILS = """\
import os, pathlib, sys, time
attempt = os.environ["CPUACCEL_RESTART"]
flag = pathlib.Path(sys.argv[1]) / f"started-{attempt}"
print("attempt", attempt, flush=True)
if os.environ["RANK"] == "0":
    deadline = time.monotonic() + 30
    while not flag.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    sys.exit(3)
flag.touch()
time.sleep(60)
"""

# Attempt 0 sleeps until the test kills a rank; attempt 1 finishes at once.
KILLED_ONCE = """\
import os, time
attempt = os.environ["CPUACCEL_RESTART"]
if attempt == "0":
    print("pid", os.getpid(), flush=True)
print("started", attempt, os.environ.get("CPUACCEL_RESUME"), flush=True)
if attempt == "0":
    time.sleep(60)
"""


def attempts_of(run_dir: Path) -> list[dict[str, object]]:
    lines = (run_dir / "attempts.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def assert_nothing_left(cluster: Cluster, run_id: str) -> None:
    for node in NODES:
        assert job_processes(cluster, node, run_id) == [], node
    for node in NODES:
        assert cluster.wait_idle(node, timeout=5) == [], node


def test_an_identical_failure_is_not_restarted_again(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    proj = make_project(tmp_path, {"job.py": FAILS})
    run = cpuaccel_run(
        proj, "-i", inventory, "--nodes", "2", "--ppn", "1", "--max-restarts", "3",
        "--restart-delay", "0.5", "job.py", str(tmp_path),
    )  # fmt: skip
    assert run.code == 3, run  # the script's own code, the last attempt's
    attempts = attempts_of(run.run_dir)
    assert [a["attempt"] for a in attempts] == [0, 1], run  # not 4: the repeat was seen
    for a in attempts:
        assert (a["reason"], a["exit_code"], a["rank"], a["host"]) == ("failed", 3, 0, "node1")
        assert a["hosts"] == ["node1", "node2"] and a["resume"] is None
    assert "attempt 0 failed (exit code 3, rank 0 on node1): restarting in 0.5 s" in run.stderr
    assert "attempt 1 failed as attempt 0 did" in run.stderr, run
    assert "not restarting it again" in run.stderr
    assert run.lines(0) == ["attempt 0", "attempt 1"]
    record = run.record()
    assert record["attempts"] == attempts and record["exit_code"] == 3
    log = (run.run_dir / "rank-1.log").read_text().splitlines()  # and how it was ended
    ours = [line for line in log if line.startswith(("---", "attempt"))]
    assert ours == ["--- attempt 0 ---", "attempt 0", "--- attempt 1 ---", "attempt 1"], log
    copy = (run.run_dir / "attempt-1" / "rank-0.log").read_text().splitlines()
    assert copy == ["attempt 1", "[cpuaccel] exit code 3"]
    assert_nothing_left(cluster, record["run_id"])


def _the_rank(lines: list[str], rank: int) -> int:
    """The pid of the rank's script, as it printed it ("pid N")."""
    said = [
        line.split()[-1] for line in lines if line.startswith(f"[rank {rank} ") and " pid " in line
    ]
    assert len(said) == 1, lines
    return int(said[0])


def test_a_rank_killed_mid_run_is_restarted(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    proj = make_project(tmp_path, {"job.py": KILLED_ONCE})
    job = BackgroundRun(
        proj, "-i", inventory, "--nodes", "2", "--ppn", "1", "--max-restarts", "1",
        "--restart-delay", "1", "--json", "job.py",
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while sum("started 0" in line for line in job.err) < 2:  # --json: ranks on stderr
            assert job.proc.poll() is None and time.monotonic() < deadline, job.report()
            time.sleep(0.05)
        run_id = next((proj / "runs").iterdir()).name
        os.kill(_the_rank(job.err, 1), signal.SIGKILL)
        run = job.finish(timeout=90)
    finally:
        job.stop()
    assert run.code == 0, run
    report = json.loads(run.stdout)
    assert report["exit_code"] == 0 and report["ended_by"] == "completed"
    attempts = report["attempts"]
    assert [(a["attempt"], a["reason"]) for a in attempts] == [(0, "failed"), (1, "completed")]
    assert attempts[0]["rank"] == 1 and attempts[0]["host"] == "node2", run
    assert attempts[0]["exit_code"] == 128 + signal.SIGKILL
    assert attempts[1]["resume"] is None  # no checkpoint was saved
    run_dir = Path(report["folder"])
    assert attempts_of(run_dir) == attempts
    log = (run_dir / "rank-1.log").read_text().splitlines()
    assert log[0] == "--- attempt 0 ---" and "[cpuaccel] killed by SIGKILL" in log
    assert log[-2:] == ["--- attempt 1 ---", "started 1 None"]
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "succeeded" and status["exit_code"] == 0
    listed = cpuaccel("ps", "--json", cwd=proj, env=ENV)
    assert [(r["id"], r["restarts"]) for r in json.loads(listed.stdout)] == [(run_id, 1)]
    table = cpuaccel("ps", cwd=proj, env=ENV)
    assert "succeeded, restarts: 1" in table.stdout, table.stdout
    assert_nothing_left(cluster, run_id)


# ---------------------------------------------------------------- resumed exactly

WORKDIR = NODE_DIR / "work"  # the nodes' own folder for projects and runs
# examples/train.py as it is, but in attempt 0 rank 3 (on node2) dies by SIGKILL as soon
# as it has finished step 43 (steps 40's checkpoint is saved): a death at a known step.
# Attempt 1 tells Intel MPI to use its ring allreduce (algorithm 8), which sums each
# segment of a buffer from another rank: the resumed model is the same only when the
# gradients' sums do not depend on the library's algorithm, nor on the bucket layout
# (which DDP changes after an attempt's first step).
KILLED_AT_43 = """\
import os, runpy, signal
from cpuaccel.runtime.context import Context
if os.environ["CPUACCEL_RESTART"] != "0":
    os.environ["I_MPI_ADJUST_ALLREDUCE"] = "8"  # read at MPI_Init, in cpuaccel.init()
if os.environ["CPUACCEL_RESTART"] == "0" and os.environ["RANK"] == "3":
    log = Context.log
    def dying(self, step=None, **values):
        if step == 43:
            os.kill(os.getpid(), signal.SIGKILL)
        return log(self, step, **values)
    Context.log = dying
runpy.run_path("train.py", run_name="__main__")
"""
TRAIN = train_args(steps=100, save_every=10, log_every=1, seed=7, corpus_bytes=100000)
# The largest relative difference between two checkpoints' model parameters.
COMPARE = """\
import sys, torch
a, b = (torch.load(p, weights_only=False)["model"] for p in sys.argv[1:3])
assert a.keys() == b.keys()
print(max(float(((a[k] - b[k]).abs() / b[k].abs().clamp_min(1e-12)).max()) for k in a))
"""


def test_a_killed_rank_resumes_from_the_checkpoint_to_the_same_parameters(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    example = (REPO / "examples" / "train.py").read_text()
    proj = make_project(tmp_path, {"train.py": example, "job.py": KILLED_AT_43})
    # The ranks import cpuaccel from this tree (its runtime saves and resumes).
    common = ("-i", inventory, "--nodes", "2", "--ppn", "2", "--env", f"PYTHONPATH={REPO}")
    reference = cpuaccel_run(proj, *common, "train.py", *TRAIN, timeout=400)
    assert reference.code == 0, reference
    # Not cpuaccel_run: the other ranks' tracebacks (their peer gone) are expected here.
    begun = time.monotonic()
    proc = cpuaccel(
        "run", *common, "--max-restarts", "2", "job.py", *TRAIN, cwd=proj, env=ENV, timeout=400
    )
    run = Run(proc, time.monotonic() - begun)
    assert run.code == 0, run
    assert "[rank 3 node2] [cpuaccel] killed by SIGKILL" in run.stderr, run
    attempts = attempts_of(run.run_dir)
    # The first rank to report may be rank 3 or a peer that lost it (gloo's read error).
    assert [a["reason"] for a in attempts] == ["failed", "completed"], attempts
    run_id, reference_id = run.record()["run_id"], reference.record()["run_id"]
    resumed = f"{WORKDIR}/runs/{run_id}/checkpoint.pt"
    assert attempts[1]["resume"] == resumed
    assert f"resumed from {resumed} at step 40" in run.lines(0), run
    compared = cluster.exec(
        "node1",
        [cluster.python, "-c", COMPARE, resumed, f"{WORKDIR}/runs/{reference_id}/checkpoint.pt"],
    )
    assert compared.returncode == 0, compared.stderr
    assert float(compared.stdout) <= 1e-5, compared.stdout
    assert_nothing_left(cluster, run_id)
