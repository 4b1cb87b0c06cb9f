"""Fan-out curve: `cpuaccel check` against `ansible all -m ping` and `-m setup`.

At 1, 16, 32 and 64 namespace nodes (one 64-node test bed, the smaller sizes as
inventories of its first N nodes), with 0, 2 and 10 ms added per direction. Both tools
read the same inventory file and reach the same sshd; both get the same --forks. Runs
alternate (cpuaccel, ping, setup, cpuaccel, ...) after one warm-up run of ansible ping
(it opens Ansible's ControlPersist sockets, its advantage on re-runs) and one of
cpuaccel check (which keeps ssh masters the same way: ControlPersist 60 s, the
controller's to every node and the head's to the others for the launcher-reach pass;
-m setup, the slowest, runs --setup-repeat times); each cell is the median of --repeat runs of the
whole command, start-up included. The controller's own CPU (user + sys of the cpuaccel
process and its children, from os.wait4) is reported per host, apart from the rest of
the machine's.

Latency: this kernel has no netem qdisc, so testsupport/relay.py (one asyncio
process, one port per node on the bridge's address) holds every chunk it forwards for
D ms in each direction; the inventory names the relay's address and port. 0 ms goes
direct. Node-to-node traffic (the head's ssh to the others in check's launcher-reach
pass) also goes through the relay, as the inventory's address is what the run uses.

--rc slow gives every node a root ~/.bashrc that burns about 0.1 s of CPU after
Debian's default (as `conda init` or `pyenv init` do): bash reads it for every command
sshd runs, so each session a tool opens on a node pays it (--rc-seconds to change).

    sudo .venv/bin/python bench/fanout.py [--sizes 1,16,32,64] [--latency 0,2,10] [--repeat 3]
        [--rc default|slow]
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
from dataclasses import dataclass, field
from pathlib import Path

from ansible_venv import ensure_ansible

from cpuaccel.testbed import netns
from cpuaccel.testbed.cluster import Cluster
from testsupport.relay import Relay, relayed_hosts

CLUSTER_ID = int(os.environ.get("CPUACCEL_BENCH_CLUSTER_ID", "71"))
TARGET_VS_PING = {"default": 0.2, "slow": 0.3}
RELAY_PORT_BASE = 30000
TOOLS = ("cpuaccel", "ping", "setup")


@dataclass
class Cell:
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)  # user + sys of the process and children
    rss_kb: list[int] = field(default_factory=list)
    machine_cpu: list[float] = field(default_factory=list)  # every core's busy time, /proc/stat

    def med(self, what: str) -> float:
        return float(statistics.median(getattr(self, what)))


def busy_seconds() -> float:
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def measure(argv: list[str], env: dict[str, str], cell: Cell | None) -> None:
    busy, started = busy_seconds(), time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{argv[:4]} exited {proc.returncode}:\n{out[-3000:].decode()}")
    if cell is not None:
        cell.wall.append(elapsed)
        cell.cpu.append(usage.ru_utime + usage.ru_stime)
        cell.rss_kb.append(usage.ru_maxrss)
        cell.machine_cpu.append(busy_seconds() - busy)


def slow_bashrc(path: Path, seconds: float) -> Path:
    """A shell loop that burns ``seconds`` of CPU here, then Debian's default ~/.bashrc
    (counted once now: the nodes share this machine's cores)."""
    probe = 200000
    loop = 'i=0; while [ "$i" -lt {n} ]; do i=$((i+1)); done'
    before = os.times()
    subprocess.run(["bash", "-c", loop.format(n=probe)], check=True)
    after = os.times()
    used = (after.children_user + after.children_system) - (
        before.children_user + before.children_system
    )
    burn = loop.format(n=int(probe / max(1e-3, used) * seconds))
    text = netns.SKEL_BASHRC.read_text() if netns.SKEL_BASHRC.is_file() else ""
    # First: Debian's file returns at once when the shell is not interactive, and
    # sshd's commands are not.
    path.write_text(f"# cpuaccel bench: a slow shell start-up\n{burn}\n\n{text}")
    return path


def inventories(cluster: Cluster, sizes: list[int], delay_ms: float, out: Path) -> dict[int, str]:
    """One inventory per size: direct at 0 ms, else every node at the relay's port."""
    overrides: dict[str, dict[str, object]] = {}
    extra: dict[str, object] = {}
    if delay_ms:
        overrides, extra["ansible_ssh_common_args"] = relayed_hosts(cluster, RELAY_PORT_BASE, out)
    paths = {}
    for n in sizes:
        only = cluster.names[:n]
        path = out / f"inventory-{n}-{delay_ms:g}ms.yaml"
        cluster.write_inventory(
            path, {k: overrides[k] for k in only if k in overrides}, only=only, **extra
        )
        paths[n] = str(path)
    return paths


def commands(inv: str, forks: int, ansible: Path, cpuaccel: str) -> dict[str, list[str]]:
    f = ["-f", str(forks)]
    return {
        "cpuaccel": [cpuaccel, "check", "-i", inv, *f],
        "ping": [str(ansible), "all", "-i", inv, "-m", "ping", *f],
        "setup": [str(ansible), "all", "-i", inv, "-m", "setup", *f],
    }


def run_curve(args: argparse.Namespace, cluster: Cluster, env: dict[str, str], tmp: Path) -> dict:
    ansible = ensure_ansible("ansible")
    cpuaccel = str(Path(sys.executable).with_name("cpuaccel"))
    cells: dict[tuple[float, int, str], Cell] = {}
    for delay in args.latency:
        relay = None
        if delay:
            routes = [(RELAY_PORT_BASE + n.index, n.address, 22) for n in cluster.nodes]
            relay = Relay.start(routes, cluster.controller_address, delay / 1000)
        try:
            invs = inventories(cluster, args.sizes, delay, tmp)
            for n in args.sizes:
                cmds = commands(invs[n], args.forks, ansible, cpuaccel)
                measure(cmds["ping"], env, None)  # warm-up: Ansible's ControlPersist sockets
                measure(cmds["cpuaccel"], env, None)  # and check's (connectors/openssh_session)
                for i in range(args.repeat):
                    for tool in TOOLS if i < args.setup_repeat else TOOLS[:2]:
                        measure(cmds[tool], env, cells.setdefault((delay, n, tool), Cell()))
                print(f"  done: {delay:g} ms, {n} nodes", file=sys.stderr, flush=True)
        finally:
            if relay is not None:
                relay.stop()
    return cells


def report(args: argparse.Namespace, cells: dict, took: float, loads: tuple[str, str]) -> None:
    cpu = (
        subprocess.run(
            ["grep", "-m1", "model name", "/proc/cpuinfo"], capture_output=True, text=True
        )
        .stdout.split(":", 1)[-1]
        .strip()
    )
    flags = Path("/proc/cpuinfo").read_text().split("flags", 1)[-1].split("\n", 1)[0].split()
    shown = [f for f in ("avx512f", "avx512_bf16", "amx_tile") if f in flags] or ["no avx512/amx"]
    print(f"CPU: {cpu} ({os.cpu_count()} cores; {', '.join(shown)})")
    print(
        f"median of {args.repeat} alternating runs ({min(args.setup_repeat, args.repeat)} of "
        f"ansible -m setup), wall seconds, --forks {args.forks} for both"
    )
    print(f"load average (1 min) before: {loads[0]}, after: {loads[1]}; bench took {took:.0f}s\n")
    print(
        "| added latency | nodes | cpuaccel check | ansible -m ping | ansible -m setup "
        "| check / ping | check / setup | target |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    verdicts = []
    for delay in args.latency:
        for n in args.sizes:
            ours, ping = (cells[(delay, n, t)].med("wall") for t in TOOLS[:2])
            setup = cells[(delay, n, "setup")].med("wall") if args.setup_repeat else float("nan")
            ok = ours / ping <= TARGET_VS_PING[args.rc]
            verdicts.append(ok)
            print(
                f"| {delay:g} ms | {n} | {ours:.2f} | {ping:.2f} | {setup:.2f} | "
                f"{ours / ping:.2f}x | {ours / setup:.2f}x | {'PASS' if ok else 'MISS'} |"
            )
    print(
        f"\nnodes' ~/.bashrc: {args.rc}; check <= {TARGET_VS_PING[args.rc]}x ansible ping "
        "at every size and latency: "
        f"{'PASS' if all(verdicts) else 'MISS'} ({sum(verdicts)}/{len(verdicts)} cells)\n"
    )
    print(
        "| added latency | nodes | controller CPU / host (cpuaccel) | peak RSS (cpuaccel) "
        "| rest of the machine's CPU / host | ansible ping: its CPU / host |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    for delay in args.latency:
        for n in args.sizes:
            c, p = cells[(delay, n, "cpuaccel")], cells[(delay, n, "ping")]
            rest = c.med("machine_cpu") - c.med("cpu")
            print(
                f"| {delay:g} ms | {n} | {1000 * c.med('cpu') / n:.1f} ms | "
                f"{c.med('rss_kb') / 1024:.0f} MB | {1000 * rest / n:.1f} ms | "
                f"{1000 * p.med('cpu') / n:.1f} ms |"
            )
    small, big = min(args.sizes), max(args.sizes)
    lo = [n for n in args.sizes if n >= 16] or [small]
    for delay in args.latency:
        a, b = (cells[(delay, n, "cpuaccel")].med("cpu") / n for n in (lo[0], big))
        verdict = "PASS" if b <= a * 1.1 else "MISS"  # 10%: the noise of a shared machine
        print(
            f"{delay:g} ms: controller CPU per host {lo[0]} -> {big} nodes: "
            f"{1000 * a:.1f} -> {1000 * b:.1f} ms ({verdict}: does not grow, 10% noise)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="1,16,32,64")
    parser.add_argument("--latency", default="0,2,10", help="ms added per direction")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--setup-repeat", type=int, default=1, help="runs of -m setup (slow; 0: none)"
    )
    parser.add_argument("--forks", type=int, default=32, help="both tools' (cpuaccel's default)")
    parser.add_argument("--rc", choices=("default", "slow"), default="default")
    parser.add_argument("--rc-seconds", type=float, default=0.1, help="CPU of --rc slow")
    args = parser.parse_args()
    args.sizes = sorted(int(s) for s in args.sizes.split(","))
    args.latency = [float(s) for s in args.latency.split(",")]
    if not (args.sizes[0] >= 1 and args.sizes[-1] <= 253 and args.repeat >= 1):
        parser.error("--sizes in 1..253, --repeat >= 1")
    home = Path(tempfile.mkdtemp(prefix="cpxl-bench-fanout-"))
    env = dict(os.environ, ANSIBLE_HOME=str(home), ANSIBLE_LOCAL_TEMP=str(home / "tmp"))
    env["ANSIBLE_PYTHON_INTERPRETER"] = sys.executable  # the same interpreter cpuaccel probes
    loads = [Path("/proc/loadavg").read_text().split()[0]]
    started = time.monotonic()
    if args.rc == "slow":  # what the bed mounts over each node's ~/.bashrc
        netns.SKEL_BASHRC = slow_bashrc(home / "bashrc", args.rc_seconds)
    try:
        with Cluster(args.sizes[-1], cluster_id=CLUSTER_ID) as cluster:
            cells = run_curve(args, cluster, env, home)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    loads.append(Path("/proc/loadavg").read_text().split()[0])
    report(args, cells, time.monotonic() - started, (loads[0], loads[1]))


if __name__ == "__main__":
    main()
