"""`cpuaccel tune` on 2 namespace nodes: a row per setting with what each measured, a
failing setting kept as a row with its reason, and --write keeping the best in
cpuaccel.yaml with the file's other lines as they were.

The script is a pure Python loop calling ctx.log(samples=...): no model, few steps.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from cpuaccel.testbed.cluster import Cluster
from tests.cluster.fixtures import TREE, master_port
from testsupport.command import cpuaccel as cpuaccel_command
from testsupport.command import start_cpuaccel
from testsupport.runs import ENV, job_processes, make_project

pytestmark = pytest.mark.cluster

LOOP = """\
import argparse, os, sys
if os.environ["OMP_NUM_THREADS"] == "2":
    sys.exit("refusing 2 threads")  # a failing setting: a row, not the end of the tune
import cpuaccel
parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, required=True)
steps = parser.parse_args().steps
ctx = cpuaccel.init()
for step in range(1, steps + 1):
    total = sum(i * i for i in range(30000))
    ctx.log(step=step, loss=1.0 / step, samples=4 * ctx.world_size)
print("steps", steps, "threads", os.environ["OMP_NUM_THREADS"])
"""

PROJECT_FILE = """\
# the team's settings: kept by tune --write
nodes: 2  # both nodes
env:
  FOO: bar   # ours
"""


def test_tune_measures_each_setting_and_writes_the_best(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    project = make_project(tmp_path, {"loop.py": LOOP, "cpuaccel.yaml": PROJECT_FILE})
    port = master_port(20)
    result = cpuaccel_command(
        "tune", "-i", inventory, "--master-port", port, *TREE, "--steps", "6",
        "--grid", "ppn=1,2 threads=1,2", "--trial-timeout", "120", "--write", "--json",
        "loop.py", cwd=project, env=ENV, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result
    assert "Traceback" not in result.stderr, result.stderr
    report = json.loads(result.stdout)
    rows = report["rows"]
    assert [(r["ppn"], r["threads"]) for r in rows] == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert report["unit"] == "samples/s"
    for row in rows:
        if row["threads"] == 2:  # the script refused it: a row with its reason
            assert row["status"] == "failed" and row["value"] is None, row
            assert row["reason"], row
            continue
        assert row["status"] == "ok", row
        assert row["value"] > 0 and 0 < row["ratio"] <= 1, row
        assert row["samples_per_s"] == row["value"], row
        metrics = Path(row["folder"]) / "metrics.jsonl"
        assert len(metrics.read_text().splitlines()) == 6  # --steps 6 reached the script
    measured = [r for r in rows if r["status"] == "ok"]
    best = max(measured, key=lambda r: r["value"])
    assert report["best"]["ppn"] == best["ppn"] and best["ratio"] == 1.0
    assert report["written"] == "cpuaccel.yaml"
    assert "tune 4/4" in result.stderr  # a progress line a trial
    text = (project / "cpuaccel.yaml").read_text()
    assert text.startswith(PROJECT_FILE.splitlines()[0] + "\nnodes: 2  # both nodes\nenv:\n")
    assert "  FOO: bar   # ours\n" in text
    written = yaml.safe_load(text)
    assert written["ppn"] == best["ppn"]
    assert written["env"] == {"OMP_NUM_THREADS": str(best["threads"]), "FOO": "bar"}
    assert "allocator" not in written  # no node has tcmalloc or jemalloc: not tried


SLOW = """\
import argparse, time
import cpuaccel
parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, required=True)
parser.parse_args()
ctx = cpuaccel.init()
print("training", flush=True)
for step in range(1, 100000):
    time.sleep(0.2)
    ctx.log(step=step, loss=1.0, samples=1)
"""


def test_ctrl_c_ends_the_trial_on_every_node_and_writes_nothing(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    project = make_project(tmp_path, {"slow.py": SLOW, "cpuaccel.yaml": PROJECT_FILE})
    port = master_port(20)
    errors = tmp_path / "stderr.txt"
    with errors.open("w") as err:
        proc = start_cpuaccel(
            "tune", "-i", inventory, "--master-port", port, *TREE, "--grid", "ppn=1 threads=1,3",
            "--write", "slow.py", cwd=project, env=ENV, stdout=subprocess.PIPE, stderr=err,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 120
            while errors.read_text().count("training") < 2:  # both nodes' rank 0 and 1
                assert proc.poll() is None and time.monotonic() < deadline, errors.read_text()
                time.sleep(0.2)
            proc.send_signal(signal.SIGINT)
            out, _ = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    stderr = errors.read_text()
    assert proc.returncode == 130, (out, stderr)
    assert "Traceback" not in stderr
    rows = [line for line in out.splitlines() if line.startswith("ppn ")]
    assert len(rows) == 2 and "interrupted" in rows[0] and "skipped" in rows[1], out
    (run_dir,) = (project / "runs").iterdir()  # the one trial that started
    for node in ("node1", "node2"):
        assert job_processes(cluster, node, run_dir.name) == [], node
    assert (project / "cpuaccel.yaml").read_text() == PROJECT_FILE  # nothing written
