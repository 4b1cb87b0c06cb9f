"""``python -m cpuaccel.testbed up|down|status``: the test cluster from a shell."""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from cpuaccel.testbed.cluster import Cluster
from cpuaccel.testbed.netns import MAX_CLUSTER_ID, NETNS_DIR, ClusterError, lock_path_for
from cpuaccel.testbed.state import Lock, cleanup_stale, leftovers


def _cmd_up(args: argparse.Namespace) -> int:
    start = time.monotonic()
    cluster = Cluster(args.nodes, args.id, args.state_root, slurm=args.slurm)
    cluster.up()
    # This process ends here; the nodes keep running and `down` removes them.
    cluster.leave_running()
    elapsed = time.monotonic() - start
    print(f"{len(cluster.nodes)} nodes of cluster {args.id} up in {elapsed:.1f}s", file=sys.stderr)
    if cluster.slurm_bed is not None:
        print(f"Slurm: export SLURM_CONF={cluster.slurm_bed.conf_path}", file=sys.stderr)
    print(cluster.inventory_path)
    return 0


def _cmd_down(args: argparse.Namespace) -> int:
    lock = Lock(lock_path_for(args.id, args.state_root))
    if not args.force:
        lock.acquire()
    try:
        cleanup_stale(args.id, args.state_root)
    finally:
        if lock.held:
            lock.release(remove=True)
    print(f"cluster {args.id} is down", file=sys.stderr)
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    ids = [args.id] if args.id is not None else _known_ids(args.state_root)
    if not ids:
        print("no clusters")
        return 0
    for cluster_id in ids:
        try:
            cluster = Cluster.attach(cluster_id, args.state_root)
        except ClusterError:
            left = {k: v for k, v in leftovers(cluster_id, args.state_root).items() if v}
            print(f"cluster {cluster_id}: not running" + (f"; leftovers: {left}" if left else ""))
            continue
        print(f"cluster {cluster_id}: {cluster.inventory_path}")
        for row in cluster.status():
            state = "up" if row["sshd"] and row["port22"] else "DOWN"
            print(f"  {row['name']:<8} {row['address']:<14} pid {row['pid']!s:<8} {state}")
        if cluster.slurm_bed is not None:
            daemons = ", ".join(cluster.slurm_bed.pids)
            print(f"  slurm    SLURM_CONF={cluster.slurm_bed.conf_path} ({daemons})")
    return 0


def _known_ids(state_root: Path) -> list[int]:
    ids = set()
    for path in state_root.glob("cpxl-*"):
        match = re.fullmatch(r"cpxl-(\d+)", path.name)
        if match and path.is_dir():
            ids.add(int(match.group(1)))
    for name in os.listdir(NETNS_DIR) if NETNS_DIR.is_dir() else []:
        match = re.fullmatch(r"cpxl(\d+)-node\d+", name)
        if match:
            ids.add(int(match.group(1)))
    return sorted(i for i in ids if i <= MAX_CLUSTER_ID)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cpuaccel.testbed",
        description="Namespace nodes with sshd on this machine, for tests (needs root).",
    )
    parser.add_argument("--state-root", type=Path, default=Path("/tmp"), help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start nodes and print the inventory path")
    up.add_argument("--nodes", type=int, default=3)
    up.add_argument("--id", type=int, default=0, help="cluster id (default 0)")
    up.add_argument(
        "--slurm", action="store_true", help="also start Slurm (munged, slurmctld, slurmd)"
    )
    up.set_defaults(func=_cmd_up)
    down = sub.add_parser("down", help="remove everything of a cluster id")
    down.add_argument("--id", type=int, default=0, help="cluster id (default 0)")
    down.add_argument(
        "--force", action="store_true", help="even if a running process holds its lock"
    )
    down.set_defaults(func=_cmd_down)
    status = sub.add_parser("status", help="show clusters and their nodes")
    status.add_argument("--id", type=int, default=None, help="only this cluster id")
    status.set_defaults(func=_cmd_status)
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except (ClusterError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
