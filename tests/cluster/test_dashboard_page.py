"""The live run page in a real headless browser on a real job: a detached 2 nodes x 2
training on the namespace cluster (a tiny model trained with cpuaccel's runtime, ctx.log
every step, slowed so the page watches it), served by ``cpuaccel dashboard``. The page
shows the 4 ranks running, its loss chart gains points while the job runs, and its Stop
button (confirmed) ends the job: the page says stopped, ``ps --json`` says stopped, and
no process of the job is left on any node. Screenshots: artifacts/dashboard/cluster-*.png.
The data behind the page on real nodes: test_dashboard_server.py; the page's cases on
fake runs: tests/unit/dashboard/test_page.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import IO, Any

import pytest

from cpuaccel.errors import EXIT_OK
from cpuaccel.testbed.cluster import Cluster
from tests.cluster.fixtures import master_port
from testsupport.command import clean_env, cpuaccel, start_cpuaccel
from testsupport.runs import cpuaccel_run, job_processes, make_project

pytestmark = pytest.mark.cluster

pytest.importorskip("playwright")
from testsupport.browser import CHROMIUM, Browser, points, wait_for  # noqa: E402

URL = re.compile(r"dashboard: (http://[^/\s]+)/\?token=(\S+)")
# A tiny regression trained data-parallel with the runtime: every step logged (loss,
# samples/s, sync share) and printed by every rank; 0.3 s a step keeps it running
# while the page watches (stopped by the test long before its last step).
TRAIN = """\
import os, sys, time
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
import cpuaccel

ctx = cpuaccel.init(seed=0)
g = torch.Generator().manual_seed(1)
x = torch.randn(512, 8, generator=g)
y = x @ torch.randn(8, 1, generator=g)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
model, opt, loader = ctx.prepare(model, opt, loader)
rank, steps, step = os.environ["RANK"], int(sys.argv[1]), 0
while step < steps:
    for xb, yb in loader:
        loss = nn.functional.mse_loss(model(xb), yb)
        ctx.backward(loss)
        opt.step()
        opt.zero_grad()
        step += 1
        ctx.log(step=step, loss=loss.item(), samples=8 * ctx.world_size)
        print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
        time.sleep(0.3)
        if step >= steps:
            break
"""


class Dashboard:
    """``cpuaccel dashboard --port 0 --no-browser`` in the project; its URL from stderr."""

    def __init__(self, project: Path) -> None:
        self.proc = start_cpuaccel(
            "dashboard", "--port", "0", "--no-browser",
            cwd=project, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        self.lines: list[str] = []
        for stream in (self.proc.stderr, self.proc.stdout):
            threading.Thread(target=self._read, args=(stream,), daemon=True).start()
        deadline = time.monotonic() + 120
        while not any(URL.search(line) for line in self.lines):
            assert self.proc.poll() is None and time.monotonic() < deadline, self.lines
            time.sleep(0.1)
        found = next(m for m in map(URL.search, self.lines) if m)
        self.base, self.token = found[1], found[2]

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self.lines.append(line.rstrip("\n"))

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # Ctrl-C, as a user ends it
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def states(page: Any) -> list[str]:
    found: list[str] = page.eval_on_selector_all(
        "#ranks [data-rank]", "cells => cells.map(c => c.dataset.state)"
    )
    return found


def ps_row(project: Path, run_id: str) -> dict[str, Any]:
    ps = cpuaccel("ps", "--json", cwd=project, env=clean_env(), timeout=180)
    assert ps.returncode == EXIT_OK, ps
    rows: list[dict[str, Any]] = json.loads(ps.stdout)
    return next(row for row in rows if row["id"] == run_id)


@pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK), reason=f"no {CHROMIUM}")
def test_the_page_watches_a_detached_2x2_job_and_its_stop_button_ends_it(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    project = make_project(tmp_path, {"train_slow.py": TRAIN})
    started = cpuaccel_run(
        project, "-i", inventory, "--nodes", "2", "--ppn", "2",
        "--master-port", master_port(), "--detach",
        "train_slow.py", "3000",
    )  # fmt: skip
    assert started.code == EXIT_OK, started
    run_id = started.stdout.strip().splitlines()[-1]
    hosts = ps_row(project, run_id)["hosts"]
    assert len(hosts) == 2, hosts
    served = Dashboard(project)
    try:
        with Browser(served.base) as browser:
            page = browser.open(f"/run/{run_id}?token={served.token}")
            wait_for(page, lambda: len(states(page)) == 4, "the 4 ranks", timeout=120)
            assert states(page) == ["running"] * 4
            assert page.text_content("#state") == "running"
            # Torch's import on 4 ranks sharing 2 cores: the first steps take a while.
            wait_for(page, lambda: points(page) >= 3, "the first steps", timeout=300)
            first = points(page)
            wait_for(page, lambda: points(page) >= first + 3, "more steps", timeout=120)
            assert page.text_content("#f-precision") in ("fp32", "bf16")
            wait_for(page, lambda: "step" in (page.text_content("#logs") or ""), "log lines")
            browser.shot(page, "cluster-running")

            page.on("dialog", lambda dialog: dialog.accept())
            page.click("#stop")
            page.wait_for_selector("#stop-result[data-result]", timeout=240_000)
            assert page.get_attribute("#stop-result", "data-result") == "ok", page.text_content(
                "#stop-result"
            )
            assert page.text_content("#stop-result") == "stopped: nothing left on any node"
            wait_for(page, lambda: page.text_content("#state") == "stopped", "stopped", 120)
            wait_for(page, lambda: page.is_hidden("#stop"), "the Stop button hidden", 30)
            assert set(states(page)) <= {"stopped", "failed", "succeeded"}, states(page)
            browser.shot(page, "cluster-stopped")
        assert ps_row(project, run_id)["state"] == "stopped"
        assert {host: job_processes(cluster, host, run_id) for host in hosts} == {
            host: [] for host in hosts
        }
    finally:
        served.close()
        cpuaccel("stop", run_id, cwd=project, env=clean_env(), timeout=180)  # if it failed
