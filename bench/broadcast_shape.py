"""Broadcast shape: a chain against trees of small fan-out, on links of one rate.

The same namespace bed as bench/broadcast.py (every link shaped to --rate, controller
included). One file of seeded random bytes (--megabytes) goes to every node's private
folder through cpuaccel's broadcast (cpuaccel.connectors.broadcast.Broadcast, the code
`cpuaccel sync` and provision's synchronize call), with each fan-out of --fanouts:
1 is the chain (each node passes the stream to one other, the default), 2 and 3 trees.
Each run opens its own connections (a fresh pool: every handshake is in the time) and
writes to a destination of its own; every node's copy is checked by sha256 after each
run (not timed), then removed. The shapes' order rotates between repeats. Each cell is
the median of --repeat runs with its ratio to the chain, the machine's CPU busy share
meanwhile, and the set-up: the seconds until the first byte moved (the connections,
the relays, the hops); `one copy` (rsync -a to node1 alone) is the floor.

    sudo .venv/bin/python bench/broadcast_shape.py [--nodes 8,16] [--fanouts 1,2,3]
        [--megabytes 50] [--rate 200mbit] [--repeat 3] [--cluster-id 62]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from broadcast import (
    DEST_ROOT,
    BenchFailure,
    Payload,
    Run,
    Tools,
    cpu_line,
    cpu_ticks,
    csv_of,
    git_head,
    make_file_payload,
    node_count,
    wire_seconds,
)

from cpuaccel.connectors.broadcast import Broadcast, Listeners, payload_file
from cpuaccel.connectors.connect_options import ConnectOptions
from cpuaccel.executor import ConnectionPool
from cpuaccel.inventory.inventory import Inventory
from cpuaccel.testbed.cluster import Cluster
from testsupport.shaping import rate_bits, shaped

CLUSTER_ID = 62  # apart from the tests' and bench/broadcast.py's (61)


def through_broadcast(
    tools: Tools, payload: Payload, fanout: int, dest: Path, timeout: float
) -> Shaped:
    """One broadcast of the payload's files to every node at ``dest``, timed."""
    cluster = tools.cluster
    hosts = Inventory.load(cluster.inventory_path).select(None)
    files = [
        payload_file(str(payload.src / line.split("\t")[0]), line.split("\t")[0])
        for line in payload.listing
    ]
    notes: list[str] = []
    busy0, total0 = cpu_ticks()
    started = time.perf_counter()
    with ConnectionPool(ConnectOptions()) as pool:
        sender = Broadcast(
            pool,
            hosts,
            dict.fromkeys(cluster.names, str(dest)),
            files,
            fanout=fanout,
            listen=Listeners(note=notes.append),
        )
        out = sender.run()
    elapsed = time.perf_counter() - started
    busy1, total1 = cpu_ticks()
    failed = {name: d.error for name, d in out.items() if not d.ok}
    if failed or elapsed > timeout:
        raise BenchFailure(f"fan-out {fanout}: failed {failed}, {elapsed:.0f}s; {notes}")
    if notes:
        tools.log(f"fan-out {fanout}: " + "; ".join(notes))
    setup = sender.setup_seconds if sender.setup_seconds is not None else elapsed
    return Shaped(elapsed, (busy1 - busy0) / max(1, total1 - total0), setup)


@dataclass
class Shaped(Run):
    """A broadcast's run, with its set-up: seconds until the first byte moved (the
    connections, the relays, the hops; the rest is the stream and the end)."""

    setup: float = 0.0


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=csv_of(node_count), default=[8, 16])
    parser.add_argument("--fanouts", type=csv_of(int), default=[1, 2, 3])
    parser.add_argument("--megabytes", type=float, default=50)
    parser.add_argument("--rate", default="200mbit")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cluster-id", type=int, default=CLUSTER_ID)
    args = parser.parse_args()
    rate_bits(args.rate)

    def log(line: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)

    work = Path(tempfile.mkdtemp(prefix="cpxl-bench-shape-"))
    payload = make_file_payload(work / "project", args.megabytes)
    shapes = [f"fan-out {f}" for f in args.fanouts]
    rows = []
    for nodes in args.nodes:
        runs: dict[str, list[Run]] = {}
        with Cluster(nodes, cluster_id=args.cluster_id) as cluster, shaped(cluster, args.rate):
            tools = Tools(cluster, work, None, log)
            tools.prepare_nodes()
            timeout = 120 + 4 * wire_seconds(payload, args.rate) * nodes
            try:
                for rnd in range(args.repeat):
                    order = ["one copy", *shapes]
                    order = order[rnd % len(order) :] + order[: rnd % len(order)]
                    for shape in order:
                        if shape == "one copy":
                            run = tools.measure("one copy", payload, timeout)
                        else:
                            tools.runs += 1
                            dest = DEST_ROOT / f"shape-{tools.runs}"
                            fanout = int(shape.split()[-1])
                            run = through_broadcast(tools, payload, fanout, dest, timeout)
                            tools.verify(payload, dest, cluster.names, shape)
                            tools.remove(dest)
                        runs.setdefault(shape, []).append(run)
                        setup = f", set-up {run.setup:.2f}s" if isinstance(run, Shaped) else ""
                        said = f"{run.seconds:.2f}s ({run.cpu:.0%} CPU{setup})"
                        log(f"{nodes} nodes, {shape}: {said}")
            finally:
                tools.clean_nodes()
        rows.append((nodes, runs))
    print(f"median of {args.repeat} runs, {payload.label}, every link shaped to {args.rate}")
    print(f"CPU: {cpu_line()}")
    print(f"cpuaccel at {git_head()}")
    print()
    print("| nodes | one copy | " + " | ".join(shapes) + " |")
    print("|---:|---:|" + "---:|" * len(shapes))
    for nodes, runs in rows:
        chain = (
            statistics.median(r.seconds for r in runs["fan-out 1"]) if "fan-out 1" in runs else 0
        )
        cells = []
        for shape in ["one copy", *shapes]:
            med = statistics.median(r.seconds for r in runs[shape])
            cpu = statistics.median(r.cpu for r in runs[shape])
            ratio = f" ({med / chain:.2f}x)" if chain and shape != "one copy" else ""
            setups = [r.setup for r in runs[shape] if isinstance(r, Shaped)]
            setup = f", set-up {statistics.median(setups):.2f} s" if setups else ""
            cells.append(f"{med:.2f} s{ratio}, {cpu:.0%} CPU{setup}")
        print(f"| {nodes} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
