"""The dashboard's server on real nodes: a detached 2 nodes x 2 job whose head (node1) is
not the controller is served with every rank and its metrics while it runs (its folder
kept live from the head: runs/homecoming.Homecoming), and the page's POST stop ends it
with nothing left; ``run --detach --dashboard`` keeps serving after the start until
Ctrl-C and the job goes on; a foreground ``run --dashboard``'s page closes with the run.
The browser's side: test_dashboard_page.py."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from cpuaccel.errors import EXIT_OK
from cpuaccel.testbed.cluster import Cluster
from tests.cluster.fixtures import TWO_BY_TWO, master_port
from testsupport.command import clean_env, cpuaccel, start_cpuaccel
from testsupport.runs import BackgroundRun, cpuaccel_run, job_processes, make_project

pytestmark = pytest.mark.cluster

URL = re.compile(r"dashboard: (http://[^/\s]+)(?:/run/([^?\s]+)|/)\?token=(\S+)")
# Each rank ticks; rank 0 also logs a metric line a tick, as ctx.log would.
TICKER = """\
import json, os, sys, time
rank = int(os.environ["RANK"])
for i in range(int(sys.argv[1])):
    print(f"tick {i} of rank {rank}", flush=True)
    if rank == 0:
        with open(os.path.join(os.environ["CPUACCEL_RUN_DIR"], "metrics.jsonl"), "a") as f:
            f.write(json.dumps({"step": i, "loss": 1.0 / (i + 1), "samples_per_s": 10.0}) + "\\n")
    time.sleep(0.3)
"""


class Page:
    """A dashboard's URL (from the stderr lines of the command serving it) and its API."""

    def __init__(self, lines: list[str], proc: subprocess.Popen[str], timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not any(URL.search(line) for line in lines):
            assert proc.poll() is None and time.monotonic() < deadline, "\n".join(lines)
            time.sleep(0.1)
        found = next(m for m in map(URL.search, lines) if m)
        self.base, self.run_id, self.token = found[1], found[2], found[3]

    def call(self, path: str, method: str = "GET") -> tuple[int, Any]:
        headers = {"X-Cpuaccel-Token": self.token}
        request = urllib.request.Request(self.base + path, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=180) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def until(self, run_id: str, done: Any, timeout: float = 90) -> dict[str, Any]:
        """Poll the run's page data (as the page does, every second) until ``done``."""
        deadline = time.monotonic() + timeout
        while True:
            status, doc = self.call(f"/api/runs/{run_id}?tail=3")
            assert status == 200, doc
            if done(doc) or time.monotonic() > deadline:
                return dict(doc)
            time.sleep(1)


class Serving:
    """A command serving a page, its stderr collected line by line."""

    def __init__(self, project: Path, *args: str) -> None:
        self.proc = start_cpuaccel(
            *args, cwd=project, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        self.lines: list[str] = []
        self.out: list[str] = []
        for stream, into in ((self.proc.stderr, self.lines), (self.proc.stdout, self.out)):
            threading.Thread(target=self._read, args=(stream, into), daemon=True).start()
        self.page = Page(self.lines, self.proc)

    @staticmethod
    def _read(stream: Any, into: list[str]) -> None:
        for line in stream:
            into.append(line.rstrip("\n"))

    def interrupt(self) -> int:
        self.proc.send_signal(signal.SIGINT)  # Ctrl-C
        return self.proc.wait(timeout=60)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def every_rank_shown(doc: dict[str, Any]) -> bool:
    ranks = doc["ranks"]
    return len(ranks) == 4 and all(r["log_tail"] for r in ranks) and doc["metrics"]["next"] >= 3


def nothing_left(cluster: Cluster, run_id: str) -> dict[str, list[str]]:
    return {n: job_processes(cluster, n, run_id) for n in ("node1", "node2")}


def test_a_detached_run_is_served_live_from_its_head_and_stopped_from_the_page(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    project = make_project(tmp_path, {"tick.py": TICKER})
    started = cpuaccel_run(
        project, "-i", inventory, *TWO_BY_TWO, "--master-port", master_port(), "--detach",
        "tick.py", "400",
    )  # fmt: skip
    assert started.code == EXIT_OK, started
    run_id = started.stdout.strip().splitlines()[-1]
    served = Serving(project, "dashboard", "--port", "0", "--no-browser")
    try:
        page = served.page
        status, listed = page.call("/api/runs")
        assert status == 200 and [r["id"] for r in listed["runs"]] == [run_id]
        doc = page.until(run_id, every_rank_shown)
        assert every_rank_shown(doc), doc
        assert [r["host"] for r in doc["ranks"]] == ["node1", "node1", "node2", "node2"]
        assert {r["state"] for r in doc["ranks"]} == {"running"} and not doc["ended"]
        assert doc["ranks"][3]["log_tail"][-1].startswith("tick "), doc["ranks"][3]
        assert doc["metrics"]["step"][:3] == [0, 1, 2] and doc["remote"]["error"] is None
        later = page.until(run_id, lambda d: d["metrics"]["next"] > doc["metrics"]["next"])
        assert later["metrics"]["step"][-1] > doc["metrics"]["step"][-1]  # it goes on
        status, stopped = page.call(f"/api/runs/{run_id}/stop", method="POST")
        assert status == 200 and stopped["state"] == "stopped", stopped
        assert stopped["left"] == {} and not stopped["already"]
        assert nothing_left(cluster, run_id) == {"node1": [], "node2": []}
        ended = page.until(run_id, lambda d: d["ended"])
        assert ended["ended"] and ended["run"]["state"] == "stopped", ended["run"]
        assert served.interrupt() == EXIT_OK, served.lines
        assert "dashboard stopped" in served.lines
    finally:
        served.kill()
        cpuaccel("stop", run_id, cwd=project, env=clean_env(), timeout=180)  # if it failed


def test_run_detach_dashboard_serves_until_ctrl_c_and_the_job_goes_on(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    project = make_project(tmp_path, {"tick.py": TICKER})
    served = Serving(
        project, "run", "-i", inventory, *TWO_BY_TWO, "--master-port", master_port(), "--detach",
        "--dashboard", "tick.py", "400",
    )  # fmt: skip
    run_id = served.page.run_id
    try:
        assert run_id is not None and (project / "runs" / run_id).is_dir(), served.lines
        doc = served.page.until(run_id, every_rank_shown)
        assert every_rank_shown(doc), doc
        assert served.interrupt() == EXIT_OK, served.lines
        assert any("until Ctrl-C" in line for line in served.lines), served.lines
        assert served.out == [run_id]
        ps = cpuaccel("ps", "--json", cwd=project, env=clean_env(), timeout=120)
        assert json.loads(ps.stdout)[0]["state"] == "running", ps  # the job went on
        assert all(nothing_left(cluster, run_id).values())
    finally:
        served.kill()
        done = cpuaccel("stop", run_id or "last", cwd=project, env=clean_env(), timeout=180)
    assert done.returncode == EXIT_OK, done
    assert nothing_left(cluster, run_id) == {"node1": [], "node2": []}


def test_a_foreground_runs_page_closes_with_the_run(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    project = make_project(tmp_path, {"tick.py": TICKER})
    job = BackgroundRun(
        project, "-i", inventory, *TWO_BY_TWO, "--master-port", master_port(), "--dashboard",
        "tick.py", "40",
    )  # fmt: skip
    try:
        page = Page(job.err, job.proc)
        assert page.run_id is not None, job.report()
        doc = page.until(page.run_id, lambda d: d["metrics"]["next"] >= 3)
        assert len(doc["ranks"]) == 4 and doc["metrics"]["next"] >= 3, doc
        ended = job.finish(timeout=120)
    finally:
        job.stop()
    assert ended.code == EXIT_OK, ended
    assert "dashboard: the run has ended; its page is closed" in ended.stderr, ended
    with pytest.raises(urllib.error.URLError):
        page.call("/api/ping")


def test_a_foreground_runs_own_page_stops_it(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    project = make_project(tmp_path, {"tick.py": TICKER})
    job = BackgroundRun(
        project, "-i", inventory, *TWO_BY_TWO, "--master-port", master_port(), "--dashboard",
        "tick.py", "400",
    )  # fmt: skip
    try:
        page = Page(job.err, job.proc)
        assert page.run_id is not None, job.report()
        page.until(page.run_id, lambda d: all(r["log_tail"] for r in d["ranks"]))
        status, stopped = page.call(f"/api/runs/{page.run_id}/stop", method="POST")
        ended = job.finish(timeout=180)
    finally:
        job.stop()
    assert status == 200 and stopped["state"] == "stopped" and stopped["left"] == {}, stopped
    assert ended.code == 143, ended  # ended as `cpuaccel stop` ends it: SIGTERM to run
    assert nothing_left(cluster, page.run_id) == {"node1": [], "node2": []}
