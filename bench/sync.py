"""Sync: `cpuaccel sync` against `rsync -a` to 4 and 16 real nodes in parallel.

A generated 2,000-file, ~50 MB tree goes to the same namespace nodes (4, then 16) (each with its
own sshd and private /srv/cpuaccel-node) by both tools, in three phases:

    first       destinations wiped on every node before each run (not timed): moved
                aside, removed only once the node count is done (see Tools.wipe)
    no-change   the same sync again, right after one
    one-file    one file edited, then the sync (a different file each repeat)

cpuaccel is its real CLI (start-up included, as a user types it, its modules
byte-compiled first as an install leaves them: byte_compile); rsync is one
`rsync -a SRC/ root@ADDR:DEST/` per node, all started at once, timed until the last
ends, each over its own plain ssh (one handshake a node, as a user types it).
cpuaccel's check and sync keep ssh masters across commands (ControlPersist 60 s):
before its first sync they are ended (not timed), so that the first sync is a first
contact for both; the no-change and one-file syncs reuse the masters the first one
opened, as a user's next sync within a minute does. The two tools alternate which
goes first in each repeat so that machine noise hits both; each cell is the median of
--repeat runs. The first sync is a true first one for both: cpuaccel's controller-side
hash cache is emptied before it as well.
A cpuaccel run that fails is printed with the results, and its phase redone for both.
Afterwards both copies on every node are compared with the source, file by file.

    sudo .venv/bin/python bench/sync.py [--repeat 5] [--nodes 4,16] [--cluster-id 10]
                                        [--files 2000] [--megabytes 50] [--tmpfs]
                                        [--no-byte-compile]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from cpuaccel.connectors.choose import connector_for
from cpuaccel.connectors.connect_options import ConnectOptions
from cpuaccel.connectors.openssh_session import OpenSSHConnector
from cpuaccel.inventory.inventory import Inventory
from cpuaccel.testbed.cluster import NODE_DIR, Cluster

CLUSTER_ID = 10  # apart from the tests' (0) and the fan-out bench's (9)
NODES = "4,16"
SEED = 20240603
DEST_ROOT = NODE_DIR / "bench"  # per node: the only private path on a namespace node
CPUACCEL_DEST = DEST_ROOT / "cpuaccel"
RSYNC_DEST = DEST_ROOT / "rsync"
TRASH = NODE_DIR / "bench-trash"  # wiped trees, removed after the node count's runs
TARGETS = {"first sync": 1.2, "no-change sync": 1.0, "one-file change": 1.0}
PHASES = list(TARGETS)

# What a training project holds: mostly small source and config files, a few data files.
SMALL_KINDS = [(".py", 6), (".yaml", 2), (".json", 1), (".md", 1), (".sh", 1)]
LARGE_KINDS = [".bin", ".pt", ".npy"]


# --------------------------------------------------------------------------- the tree


def make_tree(root: Path, files: int, total_bytes: int) -> tuple[list[Path], int]:
    """A deterministic tree of `files` files in nested folders, about `total_bytes` in all.

    97.5% small files (1-30 kB, code and configs), the rest large (data, checkpoints)
    taking what is left of the total; contents are random bytes from a seeded RNG.
    """
    rng = random.Random(SEED)
    large = max(1, files // 40)
    small = files - large
    small_sizes = [rng.randint(1_000, 30_000) for _ in range(small)]
    left = max(total_bytes - sum(small_sizes), large * 100_000)
    weights = [rng.uniform(0.5, 1.5) for _ in range(large)]
    large_sizes = [int(left * w / sum(weights)) for w in weights]
    folders = [Path(".")]
    for top in range(8):
        folders.append(Path(f"pkg{top}"))
        for sub in range(rng.randint(3, 6)):
            folders.append(Path(f"pkg{top}/mod{sub}"))
            for leaf in range(rng.randint(0, 3)):
                folders.append(Path(f"pkg{top}/mod{sub}/part{leaf}"))
    folders += [Path("configs"), Path("configs/experiments"), Path("data"), Path("data/shards")]
    suffixes = [s for s, weight in SMALL_KINDS for _ in range(weight)]
    paths: list[Path] = []
    for i, size in enumerate(small_sizes):
        suffix = rng.choice(suffixes)
        rel = rng.choice(folders) / f"file{i:04d}{suffix}"
        paths.append(_write(root / rel, rng.randbytes(size), executable=suffix == ".sh"))
    for i, size in enumerate(large_sizes):
        rel = Path(rng.choice(["data", "data/shards"])) / f"blob{i:03d}{rng.choice(LARGE_KINDS)}"
        paths.append(_write(root / rel, rng.randbytes(size), executable=False))
    return paths, sum(small_sizes) + sum(large_sizes)


def _write(path: Path, data: bytes, executable: bool) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    path.chmod(0o755 if executable else 0o644)
    return path


def edit(path: Path, n: int) -> None:
    """Change a file's content (and size) as an edit would."""
    with path.open("ab") as f:
        f.write(f"\n# edit {n}\n".encode())


# --------------------------------------------------------------------------- the tools


class SyncFailed(Exception):
    """cpuaccel sync exited non-zero: the phase is redone, and the failure reported.

    Seen on CPython 3.11.7: "SystemError: AST constructor recursion depth mismatch" on
    one node, in many one-file runs. ast.literal_eval of the nodes' replies runs in
    several threads at once, which CPython before 3.11.8 gets wrong (gh-106905).
    """


class Tools:
    """The two syncs, their untimed preparations, and what each run reported."""

    def __init__(self, cluster: Cluster, src: Path, cache_home: Path, tmpfs: bool = False) -> None:
        self.cluster = cluster
        self.tmpfs = tmpfs  # destinations on a tmpfs (mount_tmpfs): wiped by removal
        self.src = src
        self.cache_home = cache_home
        self.env = dict(os.environ, XDG_CACHE_HOME=str(cache_home))
        self.cpuaccel_argv = [
            str(Path(sys.executable).with_name("cpuaccel")), "sync",
            "-i", str(cluster.inventory_path), str(src), "--dest", str(CPUACCEL_DEST), "--json",
        ]  # fmt: skip
        ssh = shlex.join(["ssh", *cluster.ssh_args()])
        self.rsync_argvs = [
            ["rsync", "-a", "-e", ssh, f"{src}/", f"root@{node.address}:{RSYNC_DEST}/"]
            for node in cluster.nodes
        ]
        self.node_seconds: dict[str, list[float]] = {phase: [] for phase in PHASES}
        self.wipes = 0

    def empty_trash(self) -> None:
        for node in self.cluster.nodes:
            self.cluster.exec(node.name, ["rm", "-rf", str(TRASH)])

    def wipe(self, dest: Path) -> None:
        """Move the tree aside, not remove it: ext4 without a journal (this machine's)
        skips every inode freed in the last 30 s when it allocates one, re-reading each,
        so thousands of files created right after as many were removed cost much kernel
        CPU a node (perf: recently_deleted, find_inode_bit), whichever tool creates them,
        and would be timed as the tool's own. A first sync to a new node pays none of
        that."""
        self.wipes += 1
        if self.tmpfs:  # no inode bookkeeping to wait out: removed at once
            for node in self.cluster.nodes:
                self.cluster.exec(node.name, ["rm", "-rf", str(dest)])
            return
        there, aside = shlex.quote(str(dest)), shlex.quote(str(TRASH / f"{self.wipes}"))
        for node in self.cluster.nodes:
            script = (
                f"mkdir -p {shlex.quote(str(TRASH))} {shlex.quote(str(DEST_ROOT))}"
                f" && if [ -e {there} ]; then mv {there} {aside}; fi"
            )
            proc = self.cluster.exec(node.name, ["sh", "-c", script])
            if proc.returncode != 0:
                raise SystemExit(f"wiping {dest} on {node.name} failed: {proc.stderr}")

    def cpuaccel(self, phase: str, expect_changed: int | None) -> float:
        started = time.perf_counter()
        proc = subprocess.run(self.cpuaccel_argv, env=self.env, capture_output=True, text=True)
        elapsed = time.perf_counter() - started
        try:
            hosts = json.loads(proc.stdout)["hosts"]
        except ValueError:
            hosts = {}
        if proc.returncode != 0:
            errors = {name: host["error"] for name, host in hosts.items() if host.get("error")}
            detail = errors or proc.stderr.strip()[-2000:]
            raise SyncFailed(f"{phase}: exit {proc.returncode}: {detail}")
        for name, host in hosts.items():
            if not host.get("in_sync"):
                raise SystemExit(f"cpuaccel sync: {name} not in sync: {host}")
            if expect_changed is not None and len(host["changed"]) != expect_changed:
                raise SystemExit(
                    f"cpuaccel sync ({phase}): {name} changed {len(host['changed'])} "
                    f"entries, expected {expect_changed}: {host['changed'][:5]}"
                )
        self.node_seconds[phase].append(max(host["seconds"] for host in hosts.values()))
        return elapsed

    def rsync(self) -> float:
        started = time.perf_counter()
        procs = [
            subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for argv in self.rsync_argvs
        ]
        outputs = [proc.communicate() for proc in procs]
        elapsed = time.perf_counter() - started
        for argv, proc, (out, err) in zip(self.rsync_argvs, procs, outputs, strict=True):
            if proc.returncode != 0:
                raise SystemExit(f"{shlex.join(argv)} exited {proc.returncode}:\n{out}\n{err}")
        return elapsed

    def end_masters(self) -> int:
        """End cpuaccel's kept ssh masters to the nodes (``ssh -O exit``, not timed);
        how many there were. The later phases reuse the masters the first one opens,
        as a user's next sync within a minute does."""
        ended = 0
        hosts = Inventory.load(self.cluster.inventory_path).hosts
        for host in hosts.values():
            conn = connector_for(host, ConnectOptions(keep=True))
            if isinstance(conn, OpenSSHConnector):
                argv = ["ssh", "-o", f"ControlPath={conn.control_path()}", "-O", "exit", "x"]
                ended += subprocess.run(argv, capture_output=True, timeout=30).returncode == 0
        return ended

    def measure(self, tool: str, phase: str, expect_changed: int | None) -> float:
        """Prepare (not timed), then time one sync of `tool` in `phase`."""
        if phase == "first sync":
            self.wipe(CPUACCEL_DEST if tool == "cpuaccel" else RSYNC_DEST)
            if tool == "cpuaccel":
                shutil.rmtree(self.cache_home / "cpuaccel", ignore_errors=True)
                self.end_masters()  # a first contact: one handshake a node, as rsync's
        os.sync()  # the previous run's writes land now, not during this one
        if tool == "cpuaccel":
            return self.cpuaccel(phase, expect_changed)
        return self.rsync()


def mount_tmpfs(cluster: Cluster) -> None:
    """A tmpfs at DEST_ROOT in every node's own mount namespace (--tmpfs): both tools'
    cost without the ext4 state of Tools.wipe, which makes even rsync's own first sync
    vary widely from one run to the next. Gone with the node."""
    for node in cluster.nodes:
        script = f"mkdir -p {shlex.quote(str(DEST_ROOT))} && mount -t tmpfs -o size=1g tmpfs "
        proc = cluster.exec(node.name, ["sh", "-c", script + shlex.quote(str(DEST_ROOT))])
        if proc.returncode != 0:
            raise SystemExit(f"tmpfs on {node.name} failed: {proc.stderr}")


# --------------------------------------------------------------------------- checks


DIGEST_SCRIPT = r"""
import hashlib, os, sys
root = sys.argv[1]
lines = []
for folder, dirs, files in os.walk(root):
    dirs[:] = [d for d in dirs if d != ".cpuaccel"] if folder == root else dirs
    for name in files:
        path = os.path.join(folder, name)
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        mode = os.lstat(path).st_mode & 0o777
        lines.append(f"{os.path.relpath(path, root)} {mode:o} {digest}")
lines.sort()
print(len(lines), hashlib.sha256("\n".join(lines).encode()).hexdigest())
"""


def tree_digest(cluster: Cluster | None, node: str, root: Path) -> tuple[int, str]:
    """(regular files, digest of paths, modes and contents) below root, here or on a node."""
    argv = [sys.executable, "-c", DIGEST_SCRIPT, str(root)]
    if cluster is None:
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    else:
        proc = cluster.exec(node, argv)
    if proc.returncode != 0:
        raise SystemExit(f"digest of {root} on {node} failed: {proc.stderr}")
    count, digest = proc.stdout.split()
    return int(count), digest


def verify(cluster: Cluster, src: Path, expected_files: int) -> None:
    want = tree_digest(None, "controller", src)
    if want[0] != expected_files:
        raise SystemExit(f"the source holds {want[0]} files, expected {expected_files}")
    for node in cluster.nodes:
        for dest in (CPUACCEL_DEST, RSYNC_DEST):
            got = tree_digest(cluster, node.name, dest)
            if got != want:
                raise SystemExit(
                    f"MISMATCH on {node.name}: {dest} holds {got[0]} files (digest "
                    f"{got[1][:12]}), the source {want[0]} (digest {want[1][:12]})"
                )


# --------------------------------------------------------------------------- main


MAX_ATTEMPTS = 20  # per phase and repeat: cpuaccel sync fails often, see SyncFailed


def interleaved(
    tools: Tools, repeat: int, warmup: int, paths: list[Path], log: Callable[[str], None]
) -> tuple[dict[tuple[str, str], list[float]], list[str]]:
    """Every phase for both tools, alternating which goes first each repeat.

    When cpuaccel sync fails (exits non-zero), the phase is redone for both tools (the
    one-file phase with a fresh edit) and the failure is returned for the report.
    """
    times: dict[tuple[str, str], list[float]] = {
        (tool, phase): [] for tool in ("cpuaccel", "rsync") for phase in PHASES
    }
    failures: list[str] = []
    # Files to edit in the one-file phase: small source files spread over the tree.
    editable = [p for p in paths if p.suffix == ".py"]
    edits = 0
    for rnd in range(-warmup, repeat):
        order = ["cpuaccel", "rsync"] if rnd % 2 == 0 else ["rsync", "cpuaccel"]
        target = editable[(rnd + warmup) * 37 % len(editable)]
        row = []
        for phase in PHASES:
            expect = {"first sync": None, "no-change sync": 0, "one-file change": 1}[phase]
            for attempt in range(1, MAX_ATTEMPTS + 1):
                if phase == "one-file change":
                    edits += 1
                    edit(target, edits)
                try:
                    got = {tool: tools.measure(tool, phase, expect) for tool in order}
                    break
                except SyncFailed as exc:
                    failures.append(str(exc))
                    log(f"cpuaccel sync FAILED ({exc}); redoing the phase")
                    if attempt == MAX_ATTEMPTS:
                        raise SystemExit(f"cpuaccel sync failed {attempt} times in a row") from exc
            for tool in order:
                if rnd >= 0:
                    times[tool, phase].append(got[tool])
                row.append(f"{tool} {phase} {got[tool]:.2f}s")
        label = "warm-up" if rnd < 0 else f"run {rnd + 1}/{repeat}"
        log(f"{label}: " + ", ".join(row))
    return times, failures


def node_counts(text: str) -> list[int]:
    """--nodes: a comma-separated list of node counts, each 1-64."""
    try:
        counts = [int(word) for word in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--nodes {text!r}: give counts like 4,16") from None
    if not counts or any(not 1 <= n <= 64 for n in counts):
        raise argparse.ArgumentTypeError(f"--nodes {text!r}: each count must be 1-64")
    return counts


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    parser.add_argument("--nodes", type=node_counts, default=node_counts(NODES))
    parser.add_argument("--cluster-id", type=int, default=CLUSTER_ID)
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--megabytes", type=float, default=50)
    parser.add_argument("--quiet", action="store_true", help="no per-run lines on stderr")
    parser.add_argument(
        "--tmpfs", action="store_true", help="destinations on a tmpfs in each node (mount_tmpfs)"
    )
    parser.add_argument(
        "--no-byte-compile",
        action="store_true",
        help="leave cpuaccel's modules as found (see byte_compile); .pyc files written "
        "by an earlier run are used all the same",
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if shutil.which("rsync") is None:
        raise SystemExit("rsync is not installed: apt-get install rsync")

    def log(line: str) -> None:
        if not args.quiet:
            print(line, file=sys.stderr, flush=True)

    started = time.perf_counter()
    load_before = os.getloadavg()[0]
    compiled = not args.no_byte_compile and byte_compile()
    work = Path(tempfile.mkdtemp(prefix="cpxl-bench-sync-"))
    results: list[tuple[int, dict[tuple[str, str], list[float]], list[str], Tools]] = []
    try:
        src = work / "project"
        paths, total = make_tree(src, args.files, int(args.megabytes * 1e6))
        log(f"tree: {len(paths)} files, {total / 1e6:.1f} MB in {src}")
        for nodes in args.nodes:
            with Cluster(nodes, cluster_id=args.cluster_id) as cluster:
                if args.tmpfs:
                    mount_tmpfs(cluster)
                tools = Tools(cluster, src, work / f"cache{nodes}", args.tmpfs)
                times, failures = interleaved(tools, args.repeat, args.warmup, paths, log)
                verify(cluster, src, len(paths))
                tools.empty_trash()
                log(f"verified: both trees match the source on all {nodes} nodes")
            results.append((nodes, times, failures, tools))
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(
        f"median of {args.repeat} runs (after {args.warmup} warm-up), wall seconds, "
        f"{os.cpu_count()}-core machine, {len(paths):,} files, {total / 1e6:.1f} MB"
    )
    print(f"CPU: {cpu_name()}")
    where = "a tmpfs on each node (--tmpfs)" if args.tmpfs else "the test bed's ext4 disk"
    print(f"destinations: {where}")
    print(f"cpuaccel's modules byte-compiled before the runs: {'yes' if compiled else 'no'}")
    print(f"load average (1 min) before: {load_before:.2f}, after: {os.getloadavg()[0]:.2f}")
    print()
    print("| nodes | phase | cpuaccel sync | rsync -a (all nodes in parallel) | ratio | target |")
    print("|---:|---|---:|---:|---:|---:|")
    for nodes, times, _, _ in results:
        for phase in PHASES:
            ours = statistics.median(times["cpuaccel", phase])
            theirs = statistics.median(times["rsync", phase])
            cells = f"{ours:.2f} | {theirs:.2f} | {ours / theirs:.2f}x | <= {TARGETS[phase]}x"
            print(f"| {nodes} | {phase} | {cells} |")
    print()
    for nodes, times, failures, tools in results:
        report(nodes, times, failures, tools, args.repeat + args.warmup)
    print(f"bench took {time.perf_counter() - started:.0f}s")


def byte_compile() -> bool:
    """Byte-compile the cpuaccel package the CLI runs, as installing it does (pip writes
    every module's .pyc): in a checkout without .pyc files, under PYTHONDONTWRITEBYTECODE=1
    (which stops Python writing them), each run would compile every module it imports
    from source first, a cost no installed cpuaccel pays. True when done."""
    import compileall

    import cpuaccel  # the one the CLI imports: the same sys.path (PYTHONPATH) as this process

    return bool(compileall.compile_dir(os.path.dirname(cpuaccel.__file__), quiet=1))


def cpu_name() -> str:
    """The CPU's model name and the flags that matter here."""
    text = Path("/proc/cpuinfo").read_text()
    names = [ln.split(":", 1)[1].strip() for ln in text.splitlines() if "model name" in ln]
    name = names[0] if names else "?"
    flags = [f for f in ("avx512f", "avx512_bf16", "amx_tile") if f" {f}" in text]
    return f"{name} ({', '.join(flags) or 'no avx512f/avx512_bf16/amx'})"


def report(
    nodes: int,
    times: dict[tuple[str, str], list[float]],
    failures: list[str],
    tools: Tools,
    rounds: int,
) -> None:
    """PASS/MISS per phase, the spread of paired ratios, the nodes' own seconds."""
    for phase in PHASES:
        ratio = statistics.median(times["cpuaccel", phase]) / statistics.median(
            times["rsync", phase]
        )
        verdict = "PASS" if ratio <= TARGETS[phase] else "MISS"
        print(f"{verdict} {nodes} nodes, {phase}: {ratio:.2f}x (target <= {TARGETS[phase]}x)")
    spread = []
    for phase in PHASES:
        pairs = zip(times["cpuaccel", phase], times["rsync", phase], strict=True)
        ratios = [ours / theirs for ours, theirs in pairs]
        spread.append(f"{phase} {min(ratios):.2f}-{max(ratios):.2f}x")
    print(f"{nodes} nodes, per-repeat cpuaccel / rsync (paired), min-max: " + ", ".join(spread))
    warmup = rounds - len(times["cpuaccel", PHASES[0]])
    slowest = {p: statistics.median(tools.node_seconds[p][warmup:]) for p in PHASES}
    print(
        f"{nodes} nodes, cpuaccel's slowest node, median (its --json seconds): "
        + ", ".join(f"{p} {s:.2f}s" for p, s in slowest.items())
    )
    for failure in failures:
        print(f"cpuaccel sync FAILED (phase redone for both tools): {failure}")
    if failures:
        print(f"cpuaccel sync failed {len(failures)} of {rounds * len(PHASES) + len(failures)}")


if __name__ == "__main__":
    main()
