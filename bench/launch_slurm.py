"""Launch under Slurm: `cpuaccel run` inside an allocation against plain `srun`.

bench/launch.py's Slurm column. The job is launch.py's script (torch.distributed with
gloo, a barrier, exit) on 3 nodes x 2 ranks of the namespace test bed with a real Slurm
on it (slurmctld, one slurmd per node; cpuaccel/testbed/slurm.py). Each measurement is
the wall time of the whole command from the controller (the login side), as a user
types it, and both tools get the same allocation request, so that Slurm's own price
(allocation, step launch, release) is in both:

    cpuaccel run   `salloc -N 3 --ntasks-per-node 2 cpuaccel run --ppn 2 init.py` from
                   the project folder: the allocation is detected, preflight (one srun
                   step over every node; the project is already synced by an untimed
                   warm-up), the run's files, `srun --mpi=pmi2` launch, supervision,
                   scancel check and the sweep of every node, all through srun
    plain srun     `salloc -N 3 --ntasks-per-node 2 srun --ntasks-per-node 2 python
                   init.py`: what a Slurm user types without cpuaccel

The two alternate which goes first in each repeat; each cell is the median of --repeat
runs after one untimed warm-up each. Every run gets a master port of its own and is
checked: all 6 ranks must report the world size.

    sudo .venv/bin/python bench/launch_slurm.py [--repeat 3]     # or: make bench-launch-slurm
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from launch import (
    INIT_PY,
    MASTER_PORTS,
    PPN,
    TARGET_OVERHEAD,
    VENV_BIN,
    ToolFailed,
    children_cpu,
    cpuaccel_phases,
)

from cpuaccel.testbed.cluster import Cluster
from cpuaccel.testbed.slurm import SlurmBed
from testsupport.command import CLEAN_PATH, clean_env

CLUSTER_ID = 68  # apart from the tests' and the other benches' (launch.py's SSH bench: 11)
NODES = 3
TOOLS = ("plain srun", "cpuaccel run")
# The nodes' work folder is their private directory, as the SSH inventory sets it.
WORKDIR = "cpuaccel_workdir=/srv/cpuaccel-node/work"


def command(tool: str, port: int) -> list[str]:
    salloc = ["salloc", "-N", str(NODES), "--ntasks-per-node", str(PPN)]
    if tool == "plain srun":
        return [*salloc, "srun", "--ntasks-per-node", str(PPN), "python", "init.py"]
    return [
        *salloc, str(VENV_BIN / "cpuaccel"), "run", "-e", WORKDIR, "--ppn", str(PPN),
        "--master-port", str(port), "init.py",
    ]  # fmt: skip


def check_ranks(tool: str, stdout: str) -> None:
    """Every rank must have reported the full world size."""
    world = NODES * PPN
    found = re.finditer(r"init-ok (\d+) (\d+)$", stdout, re.M)
    seen = {int(m[1]) for m in found if int(m[2]) == world}
    if seen != set(range(world)):
        raise ToolFailed(f"{tool}: ranks {sorted(seen)} of {world} reported\n{stdout[-2000:]}")


class Bench:
    """The timed runs of both tools, and cpuaccel's split of its own."""

    def __init__(self, bed: SlurmBed, project: Path) -> None:
        self.project = project
        # A user's shell with the venv on the PATH (`python` is the one with torch) and
        # the bed's SLURM_CONF; PYTHONPATH (the tree under test) reaches every rank
        # because srun passes the whole environment on.
        self.env = clean_env(path=f"{VENV_BIN}:{CLEAN_PATH}", **bed.env)
        self.times: dict[str, list[float]] = {t: [] for t in TOOLS}
        self.phases: list[tuple[float, float, float]] = []
        self.cpu: list[float] = []

    def run(self, tool: str) -> float:
        port = next(MASTER_PORTS)
        env = {**self.env, "MASTER_PORT": str(port)}  # read by init.py under plain srun
        cpu_before = children_cpu()
        wall_start = time.time()
        started = time.perf_counter()
        proc = subprocess.run(
            command(tool, port), cwd=self.project, env=env, capture_output=True, text=True,
            timeout=180, check=False,
        )  # fmt: skip
        elapsed = time.perf_counter() - started
        if proc.returncode != 0:
            raise ToolFailed(
                f"{tool} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
            )
        check_ranks(tool, proc.stdout)
        if tool == "cpuaccel run":
            self.phases.append(cpuaccel_phases(proc.stderr, wall_start, elapsed))
            self.cpu.append(children_cpu() - cpu_before)
        return elapsed

    def measure(self, repeat: int, log: bool) -> None:
        """Warm-up, then `repeat` rounds, the two tools in alternating order."""
        for rnd in range(-1, repeat):
            order = TOOLS if rnd % 2 else TOOLS[::-1]
            row = []
            for tool in order:
                seconds = self.run(tool)
                if rnd >= 0:
                    self.times[tool].append(seconds)
                row.append(f"{tool} {seconds:.2f}s")
            if log:
                label = "warm-up" if rnd < 0 else f"run {rnd + 1}/{repeat}"
                print(f"{label}, {NODES}x{PPN}: " + ", ".join(row), file=sys.stderr, flush=True)
            if rnd < 0:
                self.phases.clear()
                self.cpu.clear()


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def report(bench: Bench, version: str, repeat: int, load_before: float, started: float) -> None:
    print(
        f"median of {repeat} runs (after 1 warm-up), wall seconds from the controller, "
        f"{os.cpu_count()}-core {cpu_name()}, {PPN} ranks per node, Slurm "
        f"{version}"
    )
    print(f"load average (1 min) before: {load_before:.2f}, after: {os.getloadavg()[0]:.2f}")
    print()
    print("| nodes x ppn | plain srun | cpuaccel run | cpuaccel - srun |")
    print("|---|---:|---:|---:|")
    plain, ours = (statistics.median(bench.times[t]) for t in TOOLS)
    ratio = f"{ours - plain:+.2f} s ({ours / plain:.2f}x)"
    print(f"| {NODES} x {PPN} | {plain:.2f} | {ours:.2f} | {ratio} |")
    print()
    over = ours - plain
    verdict = "PASS" if over <= TARGET_OVERHEAD else "MISS"
    print(
        f"{verdict} cpuaccel run overhead over plain srun at {NODES} nodes: "
        f"{over:+.2f} s (target <= {TARGET_OVERHEAD} s)"
    )
    pairs = zip(bench.times["cpuaccel run"], bench.times["plain srun"], strict=True)
    diffs = [a - b for a, b in pairs]
    print(
        f"{NODES} x {PPN}: cpuaccel - srun in paired runs: median "
        f"{statistics.median(diffs):+.2f} s, min-max {min(diffs):+.2f} to {max(diffs):+.2f} s"
    )
    before, job, after = (statistics.median(p[i] for p in bench.phases) for i in range(3))
    print(
        f"where cpuaccel run's time goes (medians): start-up + allocation + preflight + render "
        f"+ copy of run files {before:.2f} s, launch to end of sweep {job:.2f} s, exit and "
        f"release {after:.2f} s; its own CPU on the controller {statistics.median(bench.cpu):.2f} s"
    )
    print(f"bench took {time.perf_counter() - started:.0f}s")


def slurm_version(bed: SlurmBed) -> str:
    done = bed.client(["srun", "--version"])
    return done.stdout.split()[-1] if done.stdout.strip() else "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quiet", action="store_true", help="no per-run lines on stderr")
    args = parser.parse_args()
    started = time.perf_counter()
    load_before = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="cpxl-bench-launch-slurm-"))
    try:
        # The with-block brings the cluster and its Slurm down even when a run fails.
        with Cluster(NODES, cluster_id=CLUSTER_ID, slurm=True) as cluster:
            bed = cluster.start_slurm()
            bed.wait_idle()
            project = work / "launch-bench"
            project.mkdir()
            (project / "init.py").write_text(INIT_PY)
            bench = Bench(bed, project)
            version = slurm_version(bed)
            try:
                bench.measure(args.repeat, log=not args.quiet)
            except ToolFailed as exc:
                raise SystemExit(str(exc)) from exc
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report(bench, version, args.repeat, load_before, started)


if __name__ == "__main__":
    main()
