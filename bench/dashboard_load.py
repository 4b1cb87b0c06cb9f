"""Load of the dashboard's data endpoint: 64 ranks and 100k metric lines, the real server.

A synthetic run (testsupport/fake_run.py: 16 nodes x 4 ranks, 100k lines in
metrics.jsonl, rank logs) is served by the real uvicorn server on 127.0.0.1 while a
writer thread appends metric lines (and a log line to each rank) every 50 ms, as a live
run does. Measured through urllib, gzip accepted as a browser does:

    first load   GET /api/runs/{id} with a fresh server (no parsed cache): the whole
                 file parsed, 2000 points sent; each repeat a new server process state
    update       GET /api/runs/{id}?since=N every 1 s (the page's poll), N the last next

Medians (and max) of time and bytes over --repeat runs, and the CPU.

    .venv/bin/python bench/dashboard_load.py [--repeat 10] [--lines 100000] [--ranks 64]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from cpuaccel.dashboard.server import Server, Services, build_app
from testsupport.fake_run import FakeRun, make_run

TOKEN = "bench"


def cpu() -> str:
    done = subprocess.run(
        ["grep", "-m1", "model name", "/proc/cpuinfo"], capture_output=True, text=True
    )
    return done.stdout.split(":", 1)[-1].strip() or "unknown"


def fetch(port: int, path: str) -> tuple[float, int, dict[str, object]]:
    """Seconds, bytes on the wire (gzip'ed), and the decoded answer."""
    import gzip

    headers = {"X-Cpuaccel-Token": TOKEN, "Accept-Encoding": "gzip"}
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers)
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=120) as answer:
        body = answer.read()
        zipped = answer.headers.get("Content-Encoding") == "gzip"
    seconds = time.perf_counter() - started
    doc = json.loads(gzip.decompress(body) if zipped else body)
    return seconds, len(body), doc


def writer(run: FakeRun, stop: threading.Event) -> None:
    while not stop.wait(0.05):
        run.append_metrics(1)
        run.append_logs(1)


def summary(name: str, values: list[float], unit: str, scale: float = 1.0) -> str:
    med, top = statistics.median(values) * scale, max(values) * scale
    return f"{name:<22} median {med:9.1f} {unit}   max {top:9.1f} {unit}   (n={len(values)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--lines", type=int, default=100_000)
    parser.add_argument("--ranks", type=int, default=64)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(tmp) / "runs"
        run = make_run(runs, nodes=args.ranks // 4, ppn=4, metrics=args.lines)
        size = (run.path / "metrics.jsonl").stat().st_size
        stop = threading.Event()
        thread = threading.Thread(target=writer, args=(run, stop), daemon=True)
        thread.start()
        first_t, first_b, upd_t, upd_b, points = [], [], [], [], []
        try:
            for _ in range(args.repeat):
                services = Services(runs, TOKEN, {"127.0.0.1"})  # a fresh cache each time
                server = Server(build_app(services), "127.0.0.1", 0)
                server.start()
                try:
                    seconds, count, doc = fetch(server.port, f"/api/runs/{run.run_id}")
                    first_t.append(seconds)
                    first_b.append(count)
                    following = doc["metrics"]["next"]  # type: ignore[index]
                    for _ in range(3):
                        time.sleep(1.0)  # the page's poll
                        path = f"/api/runs/{run.run_id}?since={following}"
                        seconds, count, doc = fetch(server.port, path)
                        upd_t.append(seconds)
                        upd_b.append(count)
                        points.append(len(doc["metrics"]["step"]))  # type: ignore[index]
                        following = doc["metrics"]["next"]  # type: ignore[index]
                finally:
                    server.stop()
        finally:
            stop.set()
            thread.join()
    print(f"CPU: {cpu()}")
    mb = size / 1e6
    print(f"{args.ranks} ranks, {args.lines} metric lines ({mb:.1f} MB), writer at 20 lines/s")
    print(summary("first load (time)", first_t, "ms", 1000))
    print(summary("first load (gzip)", first_b, "kB", 1e-3))
    print(summary("update (time)", upd_t, "ms", 1000))
    print(summary("update (gzip)", upd_b, "kB", 1e-3))
    print(f"points per update: median {statistics.median(points):.0f}")


if __name__ == "__main__":
    main()
