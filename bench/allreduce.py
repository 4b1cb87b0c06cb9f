"""Allreduce: gloo (torch.distributed) against MPI (mpi4py), and each summed in rank order.

Every rank does each kind, in place on float32 buffers of 1, 4 and 16 MB, alternating
kinds call by call so that machine noise hits all; before each call the ranks meet at
an MPI barrier, and a call's time is the slowest rank's. Each cell is the median of
--repeat calls after --warmup untimed ones. The kinds are cpuaccel's gradient-sync hooks
(cpuaccel/runtime/gradsync.py: the sum and the division by the world size) under each
``grad_reduce``:

    gloo            pg_hook, library: dist.all_reduce
    gloo ordered    pg_hook, ordered: all-to-all, sum in rank order, all-gather
    MPI             the MPI hook, library: comm.Allreduce(MPI.IN_PLACE, ...)
    MPI ordered     the MPI hook, ordered (the default under an MPI launcher):
                    Alltoallv, sum in rank order, Allgatherv

With two ranks "ordered" is the library's allreduce (a sum of two has one order).

    1 node x 2 ranks    the venv's `mpirun -n 2 python bench/allreduce.py --worker`
    1 node x 4 ranks    the same with -n 4 (on a 2-core machine, two ranks a core)
    2 nodes x 1 rank    `cpuaccel run -i INV --nodes 2 --ppn 1 bench/allreduce.py --worker`
    2 nodes x 2 ranks   the same with --ppn 2, on the namespace test cluster
                        (cpuaccel/testbed/cluster.py, needs root); gloo meets at
                        cpuaccel's MASTER_ADDR/MASTER_PORT

    sudo .venv/bin/python bench/allreduce.py [--repeat 50] [--no-cluster]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
SIZES_MB = (1, 4, 16)
CLUSTER_ID = 14  # apart from the tests' (0) and the other benches' (9, 10, 11)
MARKER = "ALLREDUCE-RESULT "
TARGETS = {"1 node x 2 ranks": 2.5, "2 nodes x 1 rank": 1.5}  # MPI / gloo at 16 MB
KINDS = ("gloo", "gloo ordered", "mpi", "mpi ordered")


class Bucket:
    """What a DDP comm hook reads of a gradient bucket."""

    def __init__(self, tensor: object) -> None:
        self.tensor = tensor

    def buffer(self) -> object:
        return self.tensor


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from mpi4py import MPI

    from cpuaccel.runtime import gradsync

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(args.port))
    dist.init_process_group("gloo", rank=rank, world_size=size)
    mpi = {ordered: gradsync.mpi_state(comm, size, ordered=ordered) for ordered in (False, True)}
    pg = {ordered: gradsync.PgState(size, rank=rank, ordered=ordered) for ordered in (False, True)}
    results = {}
    for mb in SIZES_MB:
        tensor = torch.ones(mb * 2**20 // 4, dtype=torch.float32)
        times: dict[str, list[float]] = {kind: [] for kind in KINDS}
        for i in range(args.warmup + args.repeat):
            for kind in KINDS:
                comm.Barrier()
                start = time.perf_counter()
                ordered = kind.endswith("ordered")
                if kind.startswith("gloo"):
                    gradsync.pg_hook(pg[ordered], Bucket(tensor)).wait()  # type: ignore[arg-type]
                else:
                    gradsync.mpi_allreduce_mean_(tensor, mpi[ordered])
                elapsed = time.perf_counter() - start
                tensor.fill_(1.0)
                if i >= args.warmup:
                    times[kind].append(elapsed)
        # The slowest rank's time for each call, then the median over calls.
        everyone = comm.gather(times, root=0)
        if rank == 0:
            results[mb] = {
                kind: statistics.median(
                    max(t[kind][i] for t in everyone) for i in range(args.repeat)
                )
                for kind in KINDS
            }
    if rank == 0:
        print(MARKER + json.dumps({"world": size, "results": results}), flush=True)
    dist.destroy_process_group()


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def log(message: str) -> None:
    print(f"[bench/allreduce {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def parse(output: str) -> dict[str, dict[str, float]]:
    for line in output.splitlines():
        if MARKER in line:
            return json.loads(line.split(MARKER, 1)[1])["results"]
    raise RuntimeError("no result line in the output:\n" + output[-3000:])


def run(argv: list[str], env: dict[str, str]) -> tuple[str, float]:
    log("$ " + " ".join(argv))
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"exit {proc.returncode}:\n{(proc.stdout + proc.stderr)[-3000:]}")
    return proc.stdout + proc.stderr, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--no-cluster", action="store_true", help="only the local layouts")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=29500, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return

    began = time.perf_counter()
    me = str(Path(__file__).resolve())
    counts = [f"--repeat={args.repeat}", f"--warmup={args.warmup}"]
    env = dict(os.environ, NO_COLOR="1", PATH=f"{VENV_BIN}:{os.environ.get('PATH', '')}")
    env.setdefault("OMP_NUM_THREADS", "1")
    layouts: dict[str, dict[str, dict[str, float]] | str] = {}
    seconds: dict[str, float] = {}

    def measure(name: str, argv: list[str]) -> None:
        """One layout's cells, or why it failed (reported in the table)."""
        try:
            output, seconds[name] = run(argv, env)
            layouts[name] = parse(output)
        except Exception as exc:
            layouts[name] = f"failed: {str(exc).splitlines()[0]}"
            log(f"{name} FAILED: {exc}")

    for n in (2, 4):
        name = f"1 node x {n} ranks"
        argv = [str(VENV_BIN / "mpirun"), "-n", str(n), sys.executable, me, "--worker", *counts]
        measure(name, [*argv, f"--port={free_port()}"])

    on_cluster = ("2 nodes x 1 rank", "2 nodes x 2 ranks")
    if args.no_cluster or os.geteuid() != 0:
        why = "--no-cluster" if args.no_cluster else "the namespace cluster needs root"
        layouts.update({name: f"skipped ({why})" for name in on_cluster})
    else:
        from cpuaccel.testbed.cluster import Cluster

        with Cluster(2, cluster_id=CLUSTER_ID) as cluster, tempfile.TemporaryDirectory() as tmp:
            inventory = cluster.write_inventory(Path(tmp) / "inventory.yaml")
            for ppn, name in enumerate(on_cluster, 1):
                argv = [
                    str(VENV_BIN / "cpuaccel"), "run", "-i", str(inventory), "--nodes=2",
                    f"--ppn={ppn}", f"--master-port={free_port()}",
                    "bench/allreduce.py", "--worker", *counts,
                ]  # fmt: skip
                measure(name, argv)

    print(
        f"\n## bench/allreduce: the gradient hooks on float32 buckets, median of "
        f"{args.repeat} calls (slowest rank) after {args.warmup} warm-up; {cpu_name()}\n"
    )
    print(
        "| layout | size | gloo | gloo ordered | MPI | MPI ordered | MPI speed-up "
        "| ordered cost (MPI) | target at 16 MB | result |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for name, cells in layouts.items():
        if isinstance(cells, str):
            target = f">= {TARGETS[name]}x" if name in TARGETS else ""
            print(f"| {name} | | | | | | | | {target} | {cells} |")
            continue
        for mb in SIZES_MB:
            cell = cells[str(mb)]
            ratio = cell["gloo"] / cell["mpi"]
            cost = cell["mpi ordered"] / cell["mpi"]
            target = verdict = ""
            if mb == max(SIZES_MB) and name in TARGETS:
                target = f">= {TARGETS[name]}x"
                verdict = "PASS" if ratio >= TARGETS[name] else "MISS"
            ms = " | ".join(f"{1000 * cell[kind]:.2f} ms" for kind in KINDS)
            row = f"| {name} | {mb} MB | {ms} | {ratio:.2f}x | {cost:.2f}x | {target} | {verdict} |"
            print(row)
    print()
    for name, value in seconds.items():
        print(f"- {name}: wall {value:.0f} s")
    print(f"\nbench/allreduce wall time: {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
