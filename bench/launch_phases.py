"""`cpuaccel` with a clock at each phase of `cpuaccel run`: bench/launch.py's breakdown.

    python bench/launch_phases.py run -i INV --nodes 16 --ppn 2 init.py

is `cpuaccel run ...` (the same entry point as the console script, in the same
process) with a wall-clock stamp taken at the start and end of each phase; at exit the
stamps go as JSON to $CPXL_BENCH_PHASES. The stamps are a handful of time.time() calls
per host, nothing the run would notice. With $CPXL_BENCH_PROFILE set, the whole command
also runs under cProfile and its stats go to that file (`python -m pstats FILE`).

Phases (name: the function timed; each span is [first start, last end] over hosts):
    launch     job.launch: everything after start-up (settings are resolved before it)
    preflight  job._preflight_and_sync: connect + probe + look + the launcher's ssh
    connect    SSHConnector.connect, per host (inside preflight)
    facts      the fact probe (with the project's manifest look, one call), per host
    reach      the head's ssh.sh to every other node (LauncherReach)
    render     _Foreground.files: the run's files rendered
    copy       nodes.copy_files: the run's files written on every node
    job        supervise.Job.run: launch.sh started on the head to the end of the sweep
    waitexit   Job._launcher_exit: the launcher's exit status, after its output ended
    sweep      teardown.sweep_hosts: every node swept for the job's processes
"""

from __future__ import annotations

import time

T0 = time.time()  # before any import of ours: the interpreter's start is before it

import atexit  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import threading  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

SPANS: dict[str, list[tuple[float, float]]] = {}
_LOCK = threading.Lock()


def _timed(owner: Any, name: str, key: str) -> None:
    original: Callable[..., Any] = getattr(owner, name)

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.time()
        try:
            return original(*args, **kwargs)
        finally:
            with _LOCK:
                SPANS.setdefault(key, []).append((start, time.time()))

    setattr(owner, name, wrapper)


def _write() -> None:
    path = os.environ.get("CPXL_BENCH_PHASES")
    if path:
        with open(path, "w") as out:
            json.dump({"t0": T0, "end": time.time(), "spans": SPANS}, out)


def main() -> None:
    imported = time.time()
    from cpuaccel.connectors import ssh
    from cpuaccel.jobs import foreground, launcher_reach, preflight
    from cpuaccel.jobs import launch as job
    from cpuaccel.node import supervisor

    SPANS["imports"] = [(imported, time.time())]  # the launch modules, as run would load them
    _timed(job, "launch", "launch")
    _timed(job, "_preflight_and_sync", "preflight")
    _timed(ssh.SSHConnector, "connect", "connect")
    _timed(preflight, "gather", "facts")
    _timed(preflight, "gather_look_and_keep", "facts")
    _timed(launcher_reach, "check_launcher_reach", "reach")
    _timed(job, "render_job_files", "render")
    _timed(foreground, "copy_files", "copy")
    _timed(supervisor, "watch", "job")
    _timed(foreground._OverConnection, "wait", "waitexit")
    _timed(foreground, "sweep_hosts", "sweep")
    atexit.register(_write)
    from cpuaccel.cli.main import main as cpuaccel_main

    profile = os.environ.get("CPXL_BENCH_PROFILE")
    if not profile:
        cpuaccel_main()
        return
    import cProfile

    profiler = cProfile.Profile()
    try:
        profiler.runcall(cpuaccel_main)
    finally:
        profiler.dump_stats(profile)


# ---------------------------------------------------------------- read by bench/launch.py

# The parts of one run, in order; they add up to its wall time from the bench's clock.
PARTS = (
    ("start-up", "interpreter, imports, inventory, settings: the process start to job.launch"),
    ("connect", "job.launch (draft plan, manifest) to the last node's SSH connection open"),
    ("preflight", "after the last connection: fact probes, project looks, the head's ssh.sh"),
    ("render", "plan and the run's files rendered"),
    ("copy", "the run's files written on every node (and run.json)"),
    ("launch-to-end", "launch.sh started on the head to the launcher's exit status"),
    ("sweep", "every node swept for the job's processes"),
    ("exit", "the summary, run.json, connections closed, the interpreter's exit"),
)


def breakdown(stamps: dict[str, Any], wall_start: float, elapsed: float) -> dict[str, float]:
    """One run's parts (seconds), from its stamps and the bench's own start and end."""
    spans = stamps["spans"]

    def first(key: str) -> float:
        return min(start for start, _ in spans[key])

    def last(key: str) -> float:
        return max(end for _, end in spans[key])

    end = wall_start + elapsed
    parts = {
        "start-up": first("launch") - wall_start,
        "connect": last("connect") - first("launch"),
        "preflight": last("preflight") - last("connect"),
        "render": last("render") - last("preflight"),
        "copy": first("job") - last("render"),  # with run.json and status.json
        "launch-to-end": last("waitexit") - first("job"),
        "sweep": last("sweep") - last("waitexit"),
        "exit": end - last("sweep"),  # with the output reader's last lines
        # Not parts of the sum: the head's ssh.sh check within preflight, and the
        # slowest single SSH connection.
        "reach": last("reach") - first("reach") if "reach" in spans else 0.0,
        "connect each": max(stop - start for start, stop in spans["connect"]),
    }
    return parts


def cpu_name() -> str:
    """The CPU model and the flags that matter for training, as docs/benchmarks.md says."""
    text = Path("/proc/cpuinfo").read_text()
    model = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    flags = set((re.search(r"^flags\s*:\s*(.+)$", text, re.M) or ["", ""])[1].split())
    has = [f for f in ("avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    return f"{model[1] if model else 'unknown CPU'} ({', '.join(has) or 'no AVX512/AMX'})"


def print_breakdown(cases: Sequence[Any]) -> None:
    """Where cpuaccel run's time goes: each part's median (launch_phases.PARTS)."""
    print("where cpuaccel run's time goes (medians, seconds; bench/launch_phases.py's clocks):")
    names = [name for name, _ in PARTS]
    print("| nodes x ppn | " + " | ".join(names) + " | sum | CPU (controller) |")
    print("|---|" + "---:|" * (len(names) + 2))
    for case in cases:
        med = {k: statistics.median(b[k] for b in case.breakdown) for k in case.breakdown[0]}
        cells = " | ".join(f"{med[name]:.2f}" for name in names)
        total = sum(med[name] for name in names)
        cpu = statistics.median(case.cpu)
        print(f"| {case.nodes} x {case.world // case.nodes} | {cells} | {total:.2f} | {cpu:.2f} |")
    for case in cases:
        med = {k: statistics.median(b[k] for b in case.breakdown) for k in case.breakdown[0]}
        print(
            f"  {case.nodes} x {case.world // case.nodes}: within preflight, the head's ssh.sh "
            f"to every other node"
            f" {med['reach']:.2f} s; the slowest single SSH connection {med['connect each']:.2f} s"
        )
    for name, meaning in PARTS:
        print(f"  {name}: {meaning}")


if __name__ == "__main__":
    import sys

    sys.argv[0] = "cpuaccel"
    main()
