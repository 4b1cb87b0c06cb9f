"""Launch: `cpuaccel run` against a hand-written `mpirun` line and `accelerate launch`.

The job is a script that only initialises torch.distributed (gloo), meets at a barrier
and exits, on 1 node x 2 ranks and 3 nodes x 2 ranks of real namespace nodes (each with
its own sshd, hostname and /etc/hosts; the venv and /tmp are shared, like an NFS home).
Each measurement is the wall time of the whole command from the controller, as a user
types it:

    cpuaccel run       `cpuaccel run -i INV --nodes K --ppn 2 init.py` from the project
                       folder: preflight (the project is already synced by an untimed
                       warm-up), rendering, copy of the run files, launch, supervision
                       and the final sweep of every node
    bare mpirun        `ssh node1 "cd PROJECT && I_MPI_HYDRA_BOOTSTRAP=ssh ... mpirun -f
                       hostfile -n N -ppn 2 python init.py"`: what a user types after
                       logging in to the head node, ssh included
    accelerate launch  `ssh node1 "... accelerate launch --config_file CFG init.py"`
                       with a MULTI_CPU config naming the same hostfile (Accelerate then
                       runs `mpirun -f hostfile -ppn 2 -n N python init.py` itself)

The three tools alternate which goes first in each repeat so that machine noise hits
all of them; each cell is the median of --repeat runs after one untimed warm-up each.
Every run gets a master port of its own (see MASTER_PORTS), and every run is checked:
all N ranks must report the world size.

At scale (`--scale`: 16 nodes x 2 ranks, cpuaccel against bare mpirun, 3 repeats) the
rank script is trivial (RANK_PY: print the rank and exit, the same file for both
tools): 32 ranks each importing torch on this 2-core test bed would measure torch's
import, not the launch. cpuaccel is then started through bench/launch_phases.py (its own
entry point, with a clock at each phase) so that the table comes with where cpuaccel's
extra time goes: start-up, connect, preflight, render + copy of the run files, launch
to end, sweep, exit.

    sudo .venv/bin/python bench/launch.py [--sizes 1,3] [--repeat 5]
    sudo .venv/bin/python bench/launch.py --scale [--cluster-id 75]   # 16 x 2

Its Slurm column (cpuaccel run inside `salloc` against plain `srun`, on the test bed's
real Slurm) is bench/launch_slurm.py: `make bench-launch-slurm`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from launch_phases import breakdown, cpu_name, print_breakdown

from cpuaccel.testbed.cluster import Cluster

CLUSTER_ID = 11  # apart from the tests' (0), the fan-out bench's (9) and the sync bench's (10)
PPN = 2
TARGET_OVERHEAD = 1.5  # seconds of cpuaccel run over bare mpirun, at 3 nodes
TARGET_NODES = 3
# At scale, 16 nodes x 2: at most +2 s over bare mpirun, preflight included.
TARGETS = {TARGET_NODES: TARGET_OVERHEAD, 16: 2.0}
PHASES_PY = Path(__file__).with_name("launch_phases.py")
TOOLS = ("bare mpirun", "cpuaccel run", "accelerate launch")
# A fresh master port for every run, of every tool, so that no run can meet the previous
# job's sockets on it: cpuaccel's preflight tests the port with a plain bind() (no
# SO_REUSEADDR), which refuses a port whose last job's connections are in TIME_WAIT.
MASTER_PORTS = iter(range(29700, 30700))
VENV_BIN = Path(sys.executable).parent
SUMMARY = re.compile(r"^completed: (\d+) rank\(s\) on (\d+) node\(s\), ([\d.]+) s", re.M)
RUN_DIR = re.compile(r"^run directory: (.+)$", re.M)

INIT_PY = """\
import os

# Under a bare mpirun (or accelerate launch) only MPI's variables are set; under plain
# srun (launch_slurm.py) Slurm's.
os.environ.setdefault("RANK", os.environ.get("PMI_RANK", os.environ.get("SLURM_PROCID", "0")))
os.environ.setdefault("WORLD_SIZE", os.environ.get("PMI_SIZE", os.environ.get("SLURM_NTASKS", "1")))
os.environ.setdefault("MASTER_ADDR", "node1")
os.environ.setdefault("MASTER_PORT", "29500")

import torch.distributed as dist

dist.init_process_group("gloo")
dist.barrier()
print(f"init-ok {dist.get_rank()} {dist.get_world_size()}", flush=True)
dist.destroy_process_group()
"""

# --scale's rank script: no torch, no rendezvous; the rank as its launcher gave it
# (cpuaccel's worker sets RANK; a bare mpirun only PMI_RANK).
RANK_PY = """\
import os

env = os.environ
rank = env.get("RANK", env.get("PMI_RANK", env.get("SLURM_PROCID", "0")))
world = env.get("WORLD_SIZE", env.get("PMI_SIZE", env.get("SLURM_NTASKS", "1")))
print(f"init-ok {rank} {world}", flush=True)
"""


@dataclass
class Case:
    """One cluster size: its files and the three commands."""

    nodes: int
    cluster: Cluster
    project: Path
    inventory: Path
    hostfile: Path
    accelerate_config: Path
    times: dict[str, list[float]] = field(default_factory=lambda: {t: [] for t in TOOLS})
    # cpuaccel's own split of each timed run: before the launch, the job (launch to
    # sweep, its summary line), after it; and the CPU seconds its process used.
    phases: list[tuple[float, float, float]] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    breakdown: list[dict[str, float]] = field(default_factory=list)  # launch_phases' split
    script: str = "init.py"

    @property
    def world(self) -> int:
        return self.nodes * PPN


def write_case(cluster: Cluster, work: Path, project: Path, nodes: int) -> Case:
    names = cluster.names[:nodes]
    base = work / f"{nodes}-nodes"
    base.mkdir()
    inventory = cluster.write_inventory(base / "inventory.yaml", only=names)
    hostfile = base / "hostfile"
    hostfile.write_text("".join(f"{name}\n" for name in names))
    config = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "MULTI_CPU",
        "downcast_bf16": "no",
        "machine_rank": 0,
        "main_process_ip": names[0],
        "main_process_port": 29500,  # replaced before every run
        "main_training_function": "main",
        "mixed_precision": "no",
        "mpirun_config": {"mpirun_ccl": "1", "mpirun_hostfile": str(hostfile)},
        "num_machines": nodes,
        "num_processes": nodes * PPN,
        "rdzv_backend": "static",
        "same_network": True,
        "use_cpu": True,
    }
    accelerate_config = base / "accelerate.yaml"
    accelerate_config.write_text(yaml.safe_dump(config, sort_keys=False))
    return Case(nodes, cluster, project, inventory, hostfile, accelerate_config)


class ToolFailed(Exception):
    pass


def check_ranks(tool: str, case: Case, stdout: str) -> None:
    """Every rank must have reported the full world size."""
    seen = {
        int(m[1])
        for m in re.finditer(r"init-ok (\d+) (\d+)$", stdout, re.M)
        if int(m[2]) == case.world
    }
    if seen != set(range(case.world)):
        raise ToolFailed(f"{tool}: ranks {sorted(seen)} of {case.world} reported\n{stdout[-2000:]}")


def on_head(case: Case, command: str, port: int) -> list[str]:
    """ssh to node1 and run `command` there, with Intel MPI's ssh bootstrap set up."""
    ssh_args = case.cluster.ssh_args()
    exports = {
        "I_MPI_HYDRA_BOOTSTRAP": "ssh",
        "I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS": shlex.join(ssh_args),
        "MASTER_PORT": str(port),
        "HF_HOME": str(case.project.parent / "hf-home"),  # Accelerate's state, not the user's
    }
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in exports.items())
    script = (
        f"cd {shlex.quote(str(case.project))} && "
        f'PATH={shlex.quote(str(VENV_BIN))}:"$PATH" {prefix} {command}'
    )
    return case.cluster.ssh_argv("node1", script)


def run_tool(tool: str, case: Case) -> float:
    port = next(MASTER_PORTS)
    cwd = None
    env = dict(os.environ, NO_COLOR="1")
    script = case.script
    if tool == "bare mpirun":
        mpirun = f"mpirun -f {shlex.quote(str(case.hostfile))} -n {case.world} -ppn {PPN}"
        argv = on_head(case, f"{mpirun} python {script}", port)
    elif tool == "accelerate launch":
        config = yaml.safe_load(case.accelerate_config.read_text())
        config["main_process_port"] = port
        case.accelerate_config.write_text(yaml.safe_dump(config, sort_keys=False))
        cfg = shlex.quote(str(case.accelerate_config))
        argv = on_head(case, f"accelerate launch --config_file {cfg} {script}", port)
    else:
        # cpuaccel's own entry point with a clock at each phase (launch_phases.py).
        argv = [
            sys.executable, str(PHASES_PY), "run", "-i", str(case.inventory),
            "--nodes", str(case.nodes), "--ppn", str(PPN), "--master-port", str(port), script,
        ]  # fmt: skip
        cwd = case.project
        env["CPXL_BENCH_PHASES"] = str(case.project.parent / "phases.json")
    cpu_before = children_cpu()
    wall_start = time.time()
    started = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=180)
    elapsed = time.perf_counter() - started
    cpu = children_cpu() - cpu_before
    if proc.returncode != 0:
        raise ToolFailed(
            f"{tool} on {case.nodes} node(s) exited {proc.returncode}:\n"
            f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        )
    check_ranks(tool, case, proc.stdout)
    if tool == "cpuaccel run":
        case.phases.append(cpuaccel_phases(proc.stderr, wall_start, elapsed))
        case.cpu.append(cpu)
        stamps = json.loads(Path(env["CPXL_BENCH_PHASES"]).read_text())
        case.breakdown.append(breakdown(stamps, wall_start, elapsed))
    return elapsed


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cpuaccel_phases(stderr: str, wall_start: float, elapsed: float) -> tuple[float, float, float]:
    """(before launch, job, after) seconds of one cpuaccel run, from its summary and record.

    run.json's `started` is written just before the launch (after preflight, rendering
    and the copy of the run files); the summary's seconds run from the launch to the end
    of the sweep of every node.
    """
    summary, run_dir = SUMMARY.search(stderr), RUN_DIR.search(stderr)
    if summary is None or run_dir is None:
        raise ToolFailed(f"cpuaccel run: no summary line in\n{stderr[-2000:]}")
    record = json.loads((Path(run_dir[1]) / "run.json").read_text())
    before = record["started"] - wall_start
    job = float(summary[3])
    return before, job, elapsed - before - job


def measure(
    cases: list[Case], repeat: int, skip: dict[tuple[str, int], str], log: Callable[[str], None]
) -> None:
    """Warm-up, then `repeat` rounds; in each, every tool on every size, in rotating order."""
    for rnd in range(-1, repeat):
        for case in cases:
            tools = [t for t in TOOLS if (t, case.nodes) not in skip]
            order = tools[rnd % len(tools) :] + tools[: rnd % len(tools)]
            row = []
            for tool in order:
                try:
                    seconds = run_tool(tool, case)
                except ToolFailed as exc:
                    if tool != "accelerate launch":
                        raise SystemExit(str(exc)) from exc
                    # Reported with the table; the other tools go on.
                    skip[tool, case.nodes] = str(exc)
                    log(f"accelerate launch FAILED on {case.nodes} node(s): {exc}")
                    continue
                if rnd >= 0:
                    case.times[tool].append(seconds)
                row.append(f"{tool} {seconds:.2f}s")
            label = "warm-up" if rnd < 0 else f"run {rnd + 1}/{repeat}"
            log(f"{label}, {case.nodes}x{PPN}: " + ", ".join(row))
        if rnd < 0:
            for case in cases:
                case.phases.clear()
                case.cpu.clear()
                case.breakdown.clear()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default=f"1,{TARGET_NODES}")
    parser.add_argument("--repeat", type=int, help="runs of each tool (5; 3 with --scale)")
    parser.add_argument("--cluster-id", type=int, default=CLUSTER_ID)
    parser.add_argument(
        "--scale", action="store_true",
        help="16 nodes x 2, the trivial rank script, no accelerate, 3 repeats (issue 17)",
    )  # fmt: skip
    parser.add_argument("--quiet", action="store_true", help="no per-run lines on stderr")
    args = parser.parse_args()
    sizes = [16] if args.scale else [int(s) for s in args.sizes.split(",")]
    repeat = args.repeat or (3 if args.scale else 5)

    def log(line: str) -> None:
        if not args.quiet:
            print(line, file=sys.stderr, flush=True)

    started = time.perf_counter()
    load_before = os.getloadavg()
    skip: dict[tuple[str, int], str] = {}
    if args.scale:  # the target is against bare mpirun; accelerate's own run is the small sizes'
        skip.update({("accelerate launch", n): "left out at --scale" for n in sizes})
    work = Path(tempfile.mkdtemp(prefix="cpxl-bench-launch-"))
    try:
        with Cluster(max(sizes), cluster_id=args.cluster_id) as cluster:
            # One project folder for every case: cpuaccel syncs it to each node once, in
            # the warm-up; bare mpirun and Accelerate read it in place (shared filesystem).
            project = work / "launch-bench"
            project.mkdir()
            (project / "init.py").write_text(INIT_PY)
            (project / "rank.py").write_text(RANK_PY)
            cases = [write_case(cluster, work, project, n) for n in sizes]
            for case in cases:
                case.script = "rank.py" if args.scale else "init.py"
            measure(cases, repeat, skip, log)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report(cases, repeat, skip, load_before, started)


def report(
    cases: list[Case],
    repeat: int,
    skip: dict[tuple[str, int], str],
    load_before: tuple[float, float, float],
    started: float,
) -> None:
    script = cases[0].script
    print(
        f"median of {repeat} runs (after 1 warm-up), wall seconds from the controller, "
        f"{os.cpu_count()}-core {cpu_name()}, {PPN} ranks per node, rank script {script}"
    )
    load_after = os.getloadavg()
    print(
        f"load average (1/5 min) before: {load_before[0]:.2f}/{load_before[1]:.2f}, "
        f"after: {load_after[0]:.2f}/{load_after[1]:.2f}"
    )
    print()
    print("| nodes x ppn | bare mpirun | cpuaccel run | accelerate launch | cpuaccel - mpirun |")
    print("|---|---:|---:|---:|---:|")
    overheads: dict[int, float] = {}
    for case in cases:
        med = {t: statistics.median(v) if v else None for t, v in case.times.items()}
        bare, ours, acc = med["bare mpirun"], med["cpuaccel run"], med["accelerate launch"]
        assert bare is not None and ours is not None
        overheads[case.nodes] = ours - bare
        acc_cell = f"{acc:.2f}" if acc is not None else "-"
        print(
            f"| {case.nodes} x {PPN} | {bare:.2f} | {ours:.2f} | {acc_cell} | "
            f"{ours - bare:+.2f} s ({ours / bare:.2f}x) |"
        )
    print()
    for nodes, target in TARGETS.items():
        if nodes in overheads:
            over = overheads[nodes]
            verdict = "PASS" if over <= target else "MISS"
            print(
                f"{verdict} cpuaccel run overhead over bare mpirun at {nodes} nodes: "
                f"{over:+.2f} s (target <= {target} s)"
            )
    for case in cases:
        pairs = zip(case.times["cpuaccel run"], case.times["bare mpirun"], strict=True)
        diffs = [ours - bare for ours, bare in pairs]
        line = (
            f"{case.nodes} x {PPN}: cpuaccel - mpirun in paired runs: median "
            f"{statistics.median(diffs):+.2f} s, min-max {min(diffs):+.2f} to {max(diffs):+.2f} s"
        )
        if case.times["accelerate launch"]:
            acc_med = statistics.median(case.times["accelerate launch"])
            bare_med = statistics.median(case.times["bare mpirun"])
            line += f"; accelerate - mpirun (medians): {acc_med - bare_med:+.2f} s"
        print(line)
    print()
    print_breakdown(cases)
    for (tool, nodes), error in sorted(skip.items()):
        lines = [line for line in error.splitlines() if line.strip()]
        reason = " ... ".join(dict.fromkeys([lines[0], lines[-1]]))
        print(f"{tool} has no time on {nodes} node(s): {reason}")
    print(f"bench took {time.perf_counter() - started:.0f}s")


if __name__ == "__main__":
    main()
