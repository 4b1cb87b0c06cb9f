"""Restart: from a rank's death to the next attempt's first step, `cpuaccel run
--max-restarts 1` on 3 nodes x 2 ranks against `torchrun --max-restarts 1` on one node
x 2 (torchrun cannot restart across machines without a rendezvous server).

The job (JOB_PY) initialises torch.distributed (gloo) from the variables both tools set,
then all-reduces a number every 50 ms for 30 steps. In attempt 0 the last rank writes
the time and SIGKILLs itself at step 10; in the next attempt rank 0 writes when its
process started and when its first step ended. Both files go to a folder every node
shares (/tmp is shared by the namespace nodes), and the clock is one machine's.

cpuaccel's time is split with its own record (attempts.jsonl):

    detect + teardown   death -> attempt 0 "ended": the worker's report, SIGTERM to the
                        launcher's group, its end, every node swept
    between attempts    -> attempt 1 "started": the checkpoint lookup on every node,
                        the delay (--restart-delay 0 here; the default adds 3 s), the
                        preflight again
    launch              -> the rank's process starts: files rendered and copied,
                        mpirun's ssh to each node, the worker and the interpreter
    init + 1st step     -> first step done: import torch, rendezvous, one all-reduce

    sudo .venv/bin/python bench/restart.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cpuaccel.testbed.cluster import Cluster

CLUSTER_ID = 53  # ft-restart's, apart from the other benches' and helpers'
NODES, PPN = 3, 2
TARGET = 10.0  # seconds from death to the first resumed step
REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
MASTER_PORTS = iter(range(31700, 32700))

JOB_PY = """\
import json, os, signal, sys, time
started = time.time()
attempt = os.environ.get("CPUACCEL_RESTART") or os.environ.get("TORCHELASTIC_RESTART_COUNT")
out = sys.argv[1]

def note(name, value):
    with open(f"{out}/{name}.tmp", "w") as f:
        json.dump(value, f)
    os.replace(f"{out}/{name}.tmp", f"{out}/{name}")

import torch
import torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
number = torch.ones(1)
for step in range(1, 31):
    dist.all_reduce(number)
    if step == 1 and rank == 0:
        note(f"first-{attempt}", {"started": started, "step": time.time()})
    if attempt == "0" and rank == world - 1 and step == 10:
        note("death", time.time())
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.05)
"""


def read(folder: Path, name: str) -> object:
    return json.loads((folder / name).read_text())


def cpuaccel_once(project: Path, inventory: Path, out: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1"}
    argv = [
        sys.executable, "-m", "cpuaccel", "run", "-i", str(inventory), "--nodes", str(NODES),
        "--ppn", str(PPN), "--max-restarts", "1", "--restart-delay", "0", "--master-port",
        str(next(MASTER_PORTS)), "--json", "job.py", str(out),
    ]  # fmt: skip
    proc = subprocess.run(argv, cwd=project, env=env, capture_output=True, text=True, timeout=300)
    report = json.loads(proc.stdout)
    attempts = report.get("attempts", [])
    if proc.returncode != 0 or len(attempts) != 2:
        raise SystemExit(f"cpuaccel run: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    death, first = read(out, "death"), read(out, "first-1")
    assert isinstance(death, float) and isinstance(first, dict)
    return {
        "detect + teardown": attempts[0]["ended"] - death,
        "between attempts": attempts[1]["started"] - attempts[0]["ended"],
        "launch": first["started"] - attempts[1]["started"],
        "init + 1st step": first["step"] - first["started"],
        "total": first["step"] - death,
    }


def torchrun_once(project: Path, out: Path) -> dict[str, float] | None:
    """On the controller itself (this machine is "one node"; inside a namespace node,
    gloo's rendezvous did not complete)."""
    argv = [
        str(VENV_BIN / "torchrun"), "--standalone", "--nproc-per-node", str(PPN),
        "--max-restarts", "1", str(project / "job.py"), str(out),
    ]  # fmt: skip
    # Its second attempt reaches its first step and (here, torch 2.x) then does not end
    # by itself: once the step is written, its process group is ended.
    with (out / "torchrun.log").open("w") as log:
        proc = subprocess.Popen(argv, cwd=project, stdout=log, stderr=log, start_new_session=True)
    deadline = time.monotonic() + 30
    try:
        while not (out / "first-1").exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                return None  # counted: its second attempt never reached a step
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    death, first = read(out, "death"), read(out, "first-1")
    assert isinstance(death, float) and isinstance(first, dict)
    return {
        "detect + restart": first["started"] - death,
        "init + 1st step": first["step"] - first["started"],
        "total": first["step"] - death,
    }


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def table(title: str, runs: list[dict[str, float]]) -> None:
    print(f"\n{title}")
    print("| phase | median s | min s | max s |\n|---|---:|---:|---:|")
    for phase in runs[0]:
        values = [run[phase] for run in runs]
        print(
            f"| {phase} | {statistics.median(values):.2f} | {min(values):.2f} | {max(values):.2f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cpxl-bench-restart-"))
    ours: list[dict[str, float]] = []
    theirs: list[dict[str, float]] = []
    stuck = 0  # torchrun runs whose second attempt did not reach its first step in 30 s
    try:
        with Cluster(NODES, cluster_id=CLUSTER_ID) as cluster:
            project = work / "restart-bench"
            project.mkdir()
            (project / "job.py").write_text(JOB_PY)
            inventory = cluster.write_inventory(work / "inventory.yaml")
            for k in range(args.repeat + 1):  # the first of each: an untimed warm-up
                for tool, runs in (("cpuaccel", ours), ("torchrun", theirs)):
                    out = work / f"{tool}-{k}"
                    out.mkdir()
                    if tool == "cpuaccel":
                        result = cpuaccel_once(project, inventory, out)
                    else:
                        result = torchrun_once(project, out)
                    if result is None:
                        print(f"{tool} run {k}: no second attempt", file=sys.stderr)
                        stuck += 1
                        continue
                    print(f"{tool} run {k}: {result['total']:.2f} s", file=sys.stderr)
                    if k:
                        runs.append(result)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"# restart: a rank's death to the next attempt's first step ({cpu_name()}, ")
    print(f"# {os.cpu_count()} cores, median of {args.repeat} after a warm-up, {time.ctime()})")
    table(f"cpuaccel run --max-restarts 1 --restart-delay 0, {NODES} nodes x {PPN}", ours)
    if theirs:
        table(f"torchrun --standalone --max-restarts 1, 1 node x {PPN}", theirs)
    print(f"torchrun runs whose second attempt never reached a step within 30 s: {stuck}")
    total = statistics.median(run["total"] for run in ours)
    verdict = "PASS" if total <= TARGET else "MISS"
    print(f"\n{verdict}: cpuaccel {total:.2f} s from death to first step (target <= {TARGET} s)")


if __name__ == "__main__":
    main()
