"""A/B: the same cpuaccel commands from two source trees, alternating, with medians.

A change that must not slow anything (a refactor, a moved module) is measured here:
the tree at --base (a git revision, checked out into a temporary worktree) and this
checkout run the same commands against the same real namespace nodes, alternating
which goes first in each repeat so that the machine's noise hits both alike. Each
command is a whole `python -m cpuaccel ...` as a user types it, start-up included.

    sudo .venv/bin/python bench/ab.py --base REV [--repeat 9] [--only check,sync]

Scenarios (3 namespace nodes, each with its own sshd; the venv is shared):
    check               `cpuaccel check -i INV`: the one-round-trip fact fan-out
    sync, no change     `cpuaccel sync -i INV SRC --dest D` after an untimed first sync
                        (each tree has its own destination and its own sync cache)
    run --dry-run       the controller's whole path from flags to the mpirun argv
    run 1 x 2 (local)   `cpuaccel run --nodes 1 --ppn 2 init.py` on this machine
    run 3 x 1           the same across the 3 nodes: preflight, copy, launch, sweep
    run 3 x 2           the same with 2 ranks a node (bench/launch.py's 3-node case)

--nodes N runs them on N nodes instead (run N x 1, run N x 2).

Both trees ship their own node programs (probe, sync receiver, job operations), read
from their own source. Inside the ranks, both import the installed cpuaccel (its
runtime): the ranks' side is not what an A/B of the controller measures.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from cpuaccel.testbed.cluster import Cluster

ROOT = Path(__file__).resolve().parent.parent
CLUSTER_ID = 19  # apart from the tests' (0) and the other benches' (9, 10, 11)
NODES = 3
FILES = 300
# A fresh rendezvous port for every run: a port the previous job just closed can still
# be in TIME_WAIT, and preflight would then refuse it.
MASTER_PORTS = iter(range(31000, 32000))

INIT_PY = """\
import torch.distributed as dist

dist.init_process_group("gloo")
dist.barrier()
print(f"init-ok {dist.get_rank()} {dist.get_world_size()}", flush=True)
dist.destroy_process_group()
"""


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def make_project(root: Path) -> Path:
    project = root / "project"
    (project / "data").mkdir(parents=True)
    (project / "init.py").write_text(INIT_PY)
    for k in range(FILES):
        (project / "data" / f"part{k:04d}.txt").write_text(f"{k}\n" * (50 + k % 200))
    return project


class Tree:
    """One source tree of cpuaccel and how to run its CLI."""

    def __init__(self, label: str, path: Path, scratch: Path) -> None:
        self.label = label
        self.path = path
        self.cache = scratch / f"cache-{label}"
        self.dest = f"/tmp/cpxl{CLUSTER_ID}-ab-{label}"

    def run(self, argv: list[str], cwd: Path, expect: str | None = None) -> float:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CPUACCEL_")}
        env.update(PYTHONPATH=str(self.path), XDG_CACHE_HOME=str(self.cache), NO_COLOR="1")
        started = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "cpuaccel", *argv],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        elapsed = time.perf_counter() - started
        output = proc.stdout + proc.stderr
        if proc.returncode != 0 or (expect is not None and expect not in output):
            raise SystemExit(
                f"[{self.label}] cpuaccel {' '.join(argv)} exited {proc.returncode}:\n"
                f"{output[-3000:]}"
            )
        return elapsed


Scenario = Callable[[Tree], float]


def scenarios(inventory: Path, project: Path, local: Path, nodes: int) -> dict[str, Scenario]:
    inv = ["-i", str(inventory)]
    n = nodes

    def run_args(nodes: int, ppn: int) -> list[str]:
        return ["--nodes", str(nodes), "--ppn", str(ppn), "--master-port", str(next(MASTER_PORTS))]

    return {
        "check": lambda t: t.run(["check", *inv], project),
        "sync, no change": lambda t: t.run(["sync", *inv, str(project), "--dest", t.dest], project),
        "run --dry-run": lambda t: t.run(["run", *inv, "--dry-run", "init.py"], project),
        "run 1 x 2 (local)": lambda t: t.run(
            ["run", *run_args(1, 2), "init.py"], local, expect="init-ok 1 2"
        ),
        f"run {n} x 1": lambda t: t.run(
            ["run", *inv, *run_args(n, 1), "init.py"], project, expect=f"init-ok {n - 1} {n}"
        ),
        f"run {n} x 2": lambda t: t.run(
            ["run", *inv, *run_args(n, 2), "init.py"],
            project,
            expect=f"init-ok {2 * n - 1} {2 * n}",
        ),
    }


def measure(
    name: str, scenario: Scenario, trees: list[Tree], repeat: int
) -> dict[str, list[float]]:
    for tree in trees:  # untimed warm-up: first sync, page cache, known ports
        scenario(tree)
    times: dict[str, list[float]] = {t.label: [] for t in trees}
    for k in range(repeat):
        order = trees if k % 2 == 0 else trees[::-1]
        for tree in order:
            times[tree.label].append(scenario(tree))
    print(f"  {name}: done", file=sys.stderr, flush=True)
    return times


def report(results: dict[str, dict[str, list[float]]], base: str, repeat: int) -> None:
    print(f"A/B of {base} (base) and this checkout (new): median of {repeat} alternating runs,")
    print(f"wall seconds; {os.cpu_count()} cores, {cpu_model()}; {time.strftime('%Y-%m-%d')}")
    print()
    print("| command | base | new | new / base | paired new / base, min-max |")
    print("|---|---:|---:|---:|---:|")
    for name, times in results.items():
        a, b = times["base"], times["new"]
        pairs = sorted(y / x for x, y in zip(a, b, strict=True))
        ma, mb = statistics.median(a), statistics.median(b)
        print(
            f"| {name} | {ma:.2f} | {mb:.2f} | {mb / ma:.2f}x | {pairs[0]:.2f}-{pairs[-1]:.2f}x |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--base", required=True, help="git revision to compare against")
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--only", default="", help="comma list of scenario names (prefixes)")
    parser.add_argument("--nodes", type=int, default=NODES, help="namespace nodes")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix=f"cpxl{CLUSTER_ID}-ab-"))
    base_tree = scratch / "base"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base_tree), args.base],
        check=True,
        capture_output=True,
    )
    trees = [Tree("base", base_tree, scratch), Tree("new", ROOT, scratch)]
    try:
        project = make_project(scratch)
        local = scratch / "local"
        local.mkdir()
        (local / "init.py").write_text(INIT_PY)
        with Cluster(args.nodes, cluster_id=CLUSTER_ID) as cluster:
            wanted = [w for w in args.only.split(",") if w]
            results = {
                name: measure(name, scenario, trees, args.repeat)
                for name, scenario in scenarios(
                    cluster.inventory_path, project, local, args.nodes
                ).items()
                if not wanted or any(name.startswith(w) for w in wanted)
            }
        report(results, args.base, args.repeat)
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base_tree)],
            capture_output=True,
        )
        shutil.rmtree(scratch, ignore_errors=True)
        for tree in trees:  # the nodes' sync destinations (/tmp is shared with them)
            shutil.rmtree(tree.dest, ignore_errors=True)


if __name__ == "__main__":
    main()
