"""The Python API driven from a plain Python process on real nodes: a detached run on
2 nodes x 2 ranks, its logs followed, waited for and fetched; a second one stopped,
leaving nothing on any node."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cpuaccel.testbed.cluster import WORKDIR, Cluster
from tests.cluster.fixtures import REPO, assert_nothing_left, master_port
from testsupport.runs import ENV, job_processes, make_project

pytestmark = pytest.mark.cluster

# The driver: what a pipeline step or a sweep would write. It prints one JSON object.
DRIVER = """\
import json, sys, time
import cpuaccel

inventory, port = sys.argv[1], int(sys.argv[2])
common = dict(inventory=inventory, nodes=2, ppn=2, master_port=port, detach=True)
small = ["--steps", "6", "--log-every", "2", "--width", "32", "--layers", "1", "--heads", "2"]
run = cpuaccel.launch("train.py", *small, **common)
started = run.status()
lines = [(line.rank, line.host, line.text) for line in run.logs(follow=True, rank=0)]
result = run.wait(timeout=180)
fetched = run.fetch()
sleeper = cpuaccel.launch("sleep.py", **{**common, "master_port": port + 10})
deadline = time.monotonic() + 60
while sleeper.status()["state"] != "running" and time.monotonic() < deadline:
    time.sleep(0.2)
while not any("sleeping" in line.text for line in sleeper.logs(rank=3)):
    assert time.monotonic() < deadline, "the sleeper never started"
    time.sleep(0.2)
stopped = sleeper.stop()
print(json.dumps({
    "id": run.id, "folder": str(run.folder), "started": started, "lines": lines,
    "result": {"exit_code": result.exit_code, "state": result.state,
               "ranks": result.ranks, "metrics": result.metrics, "ok": result.ok},
    "fetched": fetched.files if fetched else None,
    "runs": [row["id"] for row in cpuaccel.runs()],
    "sleeper": sleeper.id,
    "stopped": {"state": stopped.state, "already": stopped.already, "left": stopped.left},
    "sleeper_after": sleeper.status()["state"],
}))
"""
SLEEP = "import os, time\nprint('sleeping', os.environ['RANK'], flush=True)\ntime.sleep(120)\n"


def test_a_python_process_launches_follows_waits_fetches_and_stops(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    train = (REPO / "examples" / "train.py").read_text()
    project = make_project(tmp_path, {"train.py": train, "sleep.py": SLEEP, "drive.py": DRIVER})
    port = master_port(20)
    done = subprocess.run(
        [sys.executable, "drive.py", inventory, port],
        cwd=project,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=420,
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr  # the API printed nothing
    seen = json.loads(done.stdout)
    run_id = seen["id"]
    assert seen["started"]["state"] == "running" and seen["started"]["detached"] is True
    assert seen["started"]["hosts"] == ["node1", "node2"]
    # Rank 0's lines, followed until the end: the runtime's first words and the steps.
    ranks = {rank for rank, _, _ in seen["lines"]}
    texts = [text for _, _, text in seen["lines"]]
    assert ranks == {0} and {host for _, host, _ in seen["lines"]} == {"node1"}
    assert any(text.startswith("cpuaccel: ") for text in texts), texts
    assert any(re.match(r"step +6 +loss", text) for text in texts), texts
    assert any(text.startswith("done: steps 1-6 on 4 rank(s)") for text in texts), texts
    result = seen["result"]
    assert (result["exit_code"], result["state"], result["ok"]) == (0, "succeeded", True)
    assert result["ranks"] == {"0": 0, "1": 0, "2": 0, "3": 0}
    assert (result["metrics"]["last_step"], result["metrics"]["world"]) == (6, 4)
    # wait() brought the results home; fetch() then found nothing new.
    home = Path(seen["folder"])
    assert (home / "metrics.jsonl").is_file() and (home / "rank-3.log").is_file()
    assert seen["fetched"] == []
    assert seen["runs"][:2] == [seen["sleeper"], run_id]
    # The sleeper: stopped on every node, verified; nothing of it is left anywhere.
    assert seen["stopped"] == {"state": "stopped", "already": False, "left": {}}
    assert seen["sleeper_after"] == "stopped"
    assert_nothing_left(cluster, seen["sleeper"])
    for node in ("node1", "node2"):
        assert job_processes(cluster, node, run_id) == []
    head = cluster.exec("node1", ["cat", f"{WORKDIR}/runs/{seen['sleeper']}/status.json"])
    assert json.loads(head.stdout)["state"] == "stopped"
