"""Fan-out: `cpuaccel check` against `ansible all -m ping` on 1 and 16 real nodes.

Both tools read the same inventory file (it is Ansible's format) and reach the same
namespace nodes over real sshd. Each measurement is the median of --repeat runs of the
whole command, start-up included, as a user would type it.

    sudo .venv/bin/python bench/fanout.py [--sizes 1,16] [--repeat 5]

ansible-core is installed into bench/.venv-ansible for the benchmark only.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ansible_venv import ensure_ansible

from cpuaccel.testing.cluster import Cluster

ROOT = Path(__file__).resolve().parent.parent
CLUSTER_ID = 9  # apart from the tests' cluster (0), so both can run at once
TARGET_SCALING = 2.0
TARGET_VS_ANSIBLE = 0.3


def timed(argv: list[str], env: dict[str, str], expect: int = 0) -> float:
    started = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    if proc.returncode != expect:
        raise SystemExit(
            f"{argv[0]} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        )
    return elapsed


def median_of(argv: list[str], env: dict[str, str], repeat: int) -> float:
    timed(argv, env)  # warm the page cache and Ansible's ssh control sockets alike
    return statistics.median(timed(argv, env) for _ in range(repeat))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="1,16")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    ansible = ensure_ansible("ansible")
    cpuaccel = str(Path(sys.executable).with_name("cpuaccel"))
    home = Path(tempfile.mkdtemp(prefix="cpxl-bench-ansible-"))
    env = dict(os.environ, ANSIBLE_HOME=str(home), ANSIBLE_LOCAL_TEMP=str(home / "tmp"))
    env["ANSIBLE_PYTHON_INTERPRETER"] = sys.executable  # the same interpreter cpuaccel probes
    # Nodes with Debian's default root ~/.bashrc (a fresh node), and with this
    # machine's own (`pyenv init`, ~100 ms of CPU in every SSH command, as a heavy
    # login script costs on a cluster with a shared home).
    variants = [("fresh", True), ("heavy", False)]
    rows = []
    try:
        for label, fresh in variants:
            for n in sizes:
                with Cluster(n, cluster_id=CLUSTER_ID, fresh_bashrc=fresh) as cluster:
                    inv = str(cluster.inventory_path)
                    ours = median_of([cpuaccel, "check", "-i", inv], env, args.repeat)
                    ping = [str(ansible), "all", "-i", inv, "-m", "ping", "-f", str(max(n, 5))]
                    theirs = median_of(ping, env, args.repeat)
                rows.append((label, n, ours, theirs))
    finally:
        shutil.rmtree(home, ignore_errors=True)
    print(f"median of {args.repeat} runs, wall seconds, 2-core machine")
    print("login script: fresh = Debian's default ~/.bashrc; heavy = one running `pyenv init`\n")
    print("| login script | nodes | cpuaccel check | ansible all -m ping | cpuaccel / ansible |")
    print("|---|---:|---:|---:|---:|")
    for label, n, ours, theirs in rows:
        print(f"| {label} | {n} | {ours:.2f} | {theirs:.2f} | {ours / theirs:.2f}x |")
    print()
    for label, _ in variants:
        mine = [r for r in rows if r[0] == label]
        if len(mine) < 2:
            continue
        (_, n1, ours1, theirs1), (_, nk, oursk, theirsk) = mine[0], mine[-1]
        print(
            f"{label}: scaling {n1} -> {nk} nodes: cpuaccel {oursk / ours1:.2f}x "
            f"(target <= {TARGET_SCALING}x), ansible {theirsk / theirs1:.2f}x; "
            f"cpuaccel vs ansible at {nk}: {oursk / theirsk:.2f}x (target <= {TARGET_VS_ANSIBLE}x)"
        )


if __name__ == "__main__":
    main()
