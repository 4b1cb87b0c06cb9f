"""Allreduce: gloo (torch.distributed) against MPI (mpi4py), the path of cpuaccel's hook.

Every rank does both, in place on float32 buffers of 1, 4 and 16 MB, alternating gloo
and MPI call by call so that machine noise hits both; before each call the ranks meet
at an MPI barrier, and a call's time is the slowest rank's. Each cell is the median of
--repeat calls after --warmup untimed ones. cpuaccel's gradient hook does exactly
``comm.Allreduce(MPI.IN_PLACE, tensor.numpy(), op=MPI.SUM)`` (cpuaccel/runtime/gradsync.py).

    1 node x 2 ranks    the venv's `mpirun -n 2 python bench/allreduce.py --worker`
                        (gloo meets at 127.0.0.1 on a free port, RANK from PMI_RANK)
    2 nodes x 1 rank    `cpuaccel run -i INV --nodes 2 --ppn 1 bench/allreduce.py --worker`
                        on the namespace test cluster (cpuaccel/testing/cluster.py, needs
                        root); gloo meets at cpuaccel's MASTER_ADDR/MASTER_PORT

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


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(args.port))
    dist.init_process_group("gloo", rank=rank, world_size=size)
    results = {}
    for mb in SIZES_MB:
        tensor = torch.ones(mb * 2**20 // 4, dtype=torch.float32)
        array = tensor.numpy()
        times: dict[str, list[float]] = {"gloo": [], "mpi": []}
        for i in range(args.warmup + args.repeat):
            for kind in ("gloo", "mpi"):
                comm.Barrier()
                start = time.perf_counter()
                if kind == "gloo":
                    dist.all_reduce(tensor)
                else:
                    comm.Allreduce(MPI.IN_PLACE, array, op=MPI.SUM)
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
                for kind in ("gloo", "mpi")
            }
    if rank == 0:
        print(MARKER + json.dumps({"world": size, "results": results}), flush=True)
    dist.destroy_process_group()


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
    parser.add_argument("--no-cluster", action="store_true", help="only 1 node x 2 ranks")
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

    name = "1 node x 2 ranks"
    argv = [str(VENV_BIN / "mpirun"), "-n", "2", sys.executable, me, "--worker", *counts]
    argv += [f"--port={free_port()}"]
    try:
        output, seconds[name] = run(argv, env)
        layouts[name] = parse(output)
    except Exception as exc:  # reported in the table
        layouts[name] = f"failed: {str(exc).splitlines()[0]}"
        log(f"{name} FAILED: {exc}")

    name = "2 nodes x 1 rank"
    if args.no_cluster:
        layouts[name] = "skipped (--no-cluster)"
    elif os.geteuid() != 0:
        layouts[name] = "skipped (the namespace cluster needs root)"
    else:
        from cpuaccel.testing.cluster import Cluster

        try:
            with Cluster(2, cluster_id=CLUSTER_ID) as cluster, tempfile.TemporaryDirectory() as tmp:
                inventory = cluster.write_inventory(Path(tmp) / "inventory.yaml")
                argv = [
                    str(VENV_BIN / "cpuaccel"),
                    "run",
                    "-i",
                    str(inventory),
                    "--nodes=2",
                    "--ppn=1",
                    f"--master-port={free_port()}",
                    "bench/allreduce.py",
                    "--worker",
                    *counts,
                ]
                output, seconds[name] = run(argv, env)
                layouts[name] = parse(output)
        except Exception as exc:  # reported in the table
            layouts[name] = f"failed: {str(exc).splitlines()[0]}"
            log(f"{name} FAILED: {exc}")

    print(
        f"\n## bench/allreduce: in-place float32 allreduce, median of {args.repeat} calls "
        f"(slowest rank) after {args.warmup} warm-up\n"
    )
    print("| layout | size | gloo | MPI (mpi4py) | MPI speed-up | target at 16 MB | result |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for name, cells in layouts.items():
        if isinstance(cells, str):
            print(f"| {name} | | | | | >= {TARGETS[name]}x | {cells} |")
            continue
        for mb in SIZES_MB:
            cell = cells[str(mb)]
            ratio = cell["gloo"] / cell["mpi"]
            target = verdict = ""
            if mb == max(SIZES_MB):
                target = f">= {TARGETS[name]}x"
                verdict = "PASS" if ratio >= TARGETS[name] else "MISS"
            print(
                f"| {name} | {mb} MB | {1000 * cell['gloo']:.2f} ms | {1000 * cell['mpi']:.2f} ms "
                f"| {ratio:.2f}x | {target} | {verdict} |"
            )
    print()
    for name, value in seconds.items():
        print(f"- {name}: wall {value:.0f} s")
    print(f"\nbench/allreduce wall time: {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
