"""The live run page's own cost in a real browser: 64 ranks and 100k metric lines.

A synthetic run (testsupport/fake_run.py: 16 nodes x 4 ranks, 100k lines) served
by the real server on 127.0.0.1, opened in headless chromium (testsupport/browser.py):

    first load   page opened -> the charts drawn (``#charts[data-points]`` > 0), each
                 repeat a new tab (the server keeps its parsed metrics after the first)
    updates      while 20 metric lines and one log line a rank are appended each second,
                 the page's main-thread tasks of 50 ms or more (PerformanceObserver
                 'longtask'), over --polls polls: what would make the page stutter

The server's side alone (JSON sizes, times per poll): bench/dashboard_load.py.

    .venv/bin/python bench/dashboard_page.py [--repeat 3] [--polls 20] [--lines 100000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from cpuaccel.dashboard.server import Server, Services, build_app
from testsupport.browser import Browser, points, wait_for
from testsupport.fake_run import make_run

TOKEN = "bench"
WATCH = """window.__long = [];
new PerformanceObserver((list) => {
  for (const entry of list.getEntries()) window.__long.push(entry.duration);
}).observe({entryTypes: ["longtask"]});"""


def cpu() -> str:
    done = subprocess.run(
        ["grep", "-m1", "model name", "/proc/cpuinfo"], capture_output=True, text=True
    )
    return done.stdout.split(":", 1)[-1].strip() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--polls", type=int, default=20)
    parser.add_argument("--lines", type=int, default=100_000)
    args = parser.parse_args()
    runs = Path(tempfile.mkdtemp(prefix="cpuaccel-bench-")) / "runs"
    run = make_run(runs, nodes=16, ppn=4, metrics=args.lines)
    server = Server(build_app(Services(runs, TOKEN, {"127.0.0.1"})), "127.0.0.1", 0)
    server.start()
    firsts: list[float] = []
    try:
        with Browser(f"http://127.0.0.1:{server.port}", Path(tempfile.mkdtemp())) as browser:
            for _ in range(args.repeat):
                started = time.monotonic()
                page = browser.open(f"/run/{run.run_id}?token={TOKEN}")
                wait_for(page, lambda p=page: points(p) > 0, "the charts", 300, every=0.02)
                firsts.append(time.monotonic() - started)
                page.close()
            page = browser.open(f"/run/{run.run_id}?token={TOKEN}")
            wait_for(page, lambda: points(page) > 0, "the charts", 300)
            page.evaluate(WATCH)
            for _ in range(args.polls):
                run.append_metrics(20)
                run.append_logs(1)
                page.wait_for_timeout(1000)
            long_tasks: list[float] = page.evaluate("window.__long")
            shown = points(page)
    finally:
        server.stop()
    print(
        json.dumps(
            {
                "cpu": cpu(),
                "ranks": 64,
                "lines": args.lines,
                "first_load_s": {
                    "median": round(statistics.median(firsts), 2),
                    "max": round(max(firsts), 2),
                },
                "polls": args.polls,
                "long_tasks_ms": [round(d) for d in long_tasks],
                "points_shown": shown,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
