"""Broadcast: one large payload to every node over links of one rate, four ways.

On namespace nodes whose every link is shaped to the same rate (testsupport.shaping:
the controller's and each node's, both ways, a star through a non-blocking switch), each
payload goes from the controller to the nodes' private folder (/srv/cpuaccel-node) by:

    one copy         `rsync -a` to node1 alone: the physical floor at any node count
    parallel rsync   one `rsync -a SRC/ root@ADDR:DEST/` per node, all started at once,
                     timed until the last ends (what a user would otherwise type)
    Ansible copy     `ansible all -m copy -a 'src=SRC/ dest=DEST/' -f NODES` (ansible-core
                     from bench/ansible_venv.py, pipelining on, its remote temp folder on
                     the node's private folder), where it fits (--ansible-budget)
    cpuaccel sync    its real CLI with the cluster's inventory, `--dest DEST` (start-up
                     included, as a user types it; its modules byte-compiled first, as an
                     install leaves them: byte_compile)
    cpuaccel         `cpuaccel provision PLAYBOOK` of one play with one synchronize task
    synchronize      (SRC/ to DEST/), as provision pushes its wheelhouse: facts gathered,
                     then the push
    cpuaccel copy    the same with one copy task of the file (SRC/payload.bin to DEST/,
                     after a file task that makes DEST): Ansible's copy, cpuaccel's way;
                     the file payload only (copy takes one file, not a folder)

Payloads (--payloads): `file`, one file of seeded random bytes in a project folder
(--megabytes), and `wheelhouse`, the repo's wheelhouse folder (--wheelhouse).

Every run writes to a destination of its own on every node, created by the tool, so
every run moves every byte. Before each timed run (not timed) the previous run's
destinations are removed on the nodes, written data is flushed (os.sync), cpuaccel's
hash cache is emptied and its kept ssh masters ended, and Ansible gets a fresh
ControlPath folder: every tool makes a first contact, one handshake a node, as rsync
does. After each timed run (not timed) every node's copy is checked: the sha256 of
every file for the file payload, a listing of paths and sizes for the wheelhouse; a
wrong copy, or a tool that fails, stops the bench with what was measured so far.
The tools' order rotates from one repeat to the next, so that machine noise hits all;
each cell is the median of --repeat runs, with its ratio to one copy. The machine's CPU
busy share (both cores, /proc/stat) during each run is reported beside it.

    sudo .venv/bin/python bench/broadcast.py [--nodes 4,8,16] [--payloads file,wheelhouse]
        [--megabytes 50] [--rate 200mbit] [--repeat 3] [--ansible-budget 120]
        [--cluster-id 61] [--wheelhouse PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import random
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from ansible_venv import ensure_ansible

from cpuaccel.testbed.cluster import NODE_DIR, Cluster
from testsupport.shaping import rate_bits, shaped

ROOT = Path(__file__).resolve().parents[1]
CLUSTER_ID = 61  # apart from the tests' (0, 1, 7, 8, 40, 43) and the other benches'
NODES = "4,8,16"
PAYLOADS = ("file", "wheelhouse")
SEED = 20240611
FILE_NAME = "payload.bin"
DEST_ROOT = NODE_DIR / "broadcast"  # per node: the only private path on a namespace node
ANSIBLE_REMOTE_TMP = NODE_DIR / "broadcast-ansible-tmp"  # on the same mount as DEST_ROOT
STATE_DIR = ".cpuaccel"  # cpuaccel sync's own folder in a destination, not the payload's
METHODS = (
    "one copy",
    "parallel rsync",
    "Ansible copy",
    "cpuaccel sync",
    "cpuaccel synchronize",
    "cpuaccel copy",
)
PUSH_PLAYBOOK = """\
- name: push
  hosts: all
  tasks:
    - name: push
      synchronize: {src: "{{ src }}", dest: "{{ dest }}"}
"""
COPY_PLAYBOOK = """\
- name: copy
  hosts: all
  tasks:
    - file: {path: "{{ dest }}", state: directory}
    - name: copy
      copy: {src: "{{ src }}", dest: "{{ dest }}/"}
"""


class BenchFailure(Exception):
    """A tool failed, or a node holds the wrong bytes: the bench stops."""


# --------------------------------------------------------------------------- payloads


@dataclass
class Payload:
    """What goes to the nodes: a folder whose contents land at the destination."""

    name: str
    label: str
    src: Path
    hashed: bool  # compare contents (sha256), not only paths and sizes
    listing: list[str] = field(default_factory=list)
    total: int = 0

    def __post_init__(self) -> None:
        self.listing = local_listing(self.src, self.hashed)
        self.total = sum(int(line.split("\t")[1]) for line in self.listing)
        if not self.listing:
            raise SystemExit(f"payload {self.name}: {self.src} holds no files")


def make_file_payload(folder: Path, megabytes: float) -> Payload:
    """A project folder holding one file of seeded random bytes (incompressible)."""
    folder.mkdir(parents=True)
    size = int(megabytes * 1e6)
    (folder / FILE_NAME).write_bytes(random.Random(SEED).randbytes(size))
    return Payload("file", f"{size / 1e6:g} MB file", folder, hashed=True)


def wheelhouse_payload(path: Path) -> Payload:
    if not path.is_dir():
        raise SystemExit(f"no wheelhouse at {path}: make wheelhouse (or --wheelhouse PATH)")
    payload = Payload("wheelhouse", "", path, hashed=False)
    payload.label = f"wheelhouse, {len(payload.listing)} files, {payload.total / 1e6:.0f} MB"
    return payload


def local_listing(root: Path, hashed: bool) -> list[str]:
    """`PATH<TAB>SIZE[<TAB>SHA256]` for every regular file below root, sorted by path."""
    lines = []
    for folder, _, files in os.walk(root):
        for name in files:
            path = Path(folder, name)
            if not path.is_file() or path.is_symlink():
                continue
            line = f"{path.relative_to(root)}\t{path.stat().st_size}"
            if hashed:
                with path.open("rb") as f:
                    line += f"\t{hashlib.file_digest(f, 'sha256').hexdigest()}"
            lines.append(line)
    return sorted(lines, key=_path_bytes)


def _path_bytes(line: str) -> bytes:
    return line.split("\t", 1)[0].encode()


# On a node: the same listing of DEST, without cpuaccel sync's own folder at its top.
NODE_LISTING = rf"""
cd "$1" || exit 3
find . -path ./{STATE_DIR} -prune -o -type f -printf '%P\t%s\n'
if [ "$2" = hashed ]; then
  echo ---
  find . -path ./{STATE_DIR} -prune -o -type f -exec sha256sum {{}} +
fi
"""


def node_listing(cluster: Cluster, node: str, dest: Path, hashed: bool) -> list[str]:
    argv = ["sh", "-c", NODE_LISTING, "listing", str(dest), "hashed" if hashed else "sizes"]
    proc = cluster.exec(node, argv, timeout=300)
    if proc.returncode != 0:
        raise BenchFailure(f"{node}: cannot list {dest}: exit {proc.returncode} {proc.stderr}")
    sizes, _, hashes = proc.stdout.partition("---\n")
    lines = sorted((line for line in sizes.splitlines() if line), key=_path_bytes)
    if not hashed:
        return lines
    digest = {}
    for line in hashes.splitlines():
        value, _, path = line.partition("  ")
        digest[path.removeprefix("./")] = value
    return [f"{line}\t{digest.get(line.split(chr(9))[0], '?')}" for line in lines]


# --------------------------------------------------------------------------- the tools


@dataclass
class Run:
    """One timed run: wall seconds, and the machine's CPU busy share meanwhile."""

    seconds: float
    cpu: float


def cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot; idle and iowait are not busy."""
    fields = [int(word) for word in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    total = sum(fields[:8])  # user .. steal; guest time is already in user
    return total - fields[3] - fields[4], total


class Tools:
    """The four ways to the nodes, their untimed preparations and checks."""

    def __init__(
        self, cluster: Cluster, work: Path, ansible: Path | None, log: Callable[[str], None]
    ) -> None:
        self.cluster = cluster
        self.work = work
        self.log = log
        self.cache_home = work / "cache"
        self.cpuaccel = str(Path(sys.executable).with_name("cpuaccel"))
        self.ssh = shlex.join(["ssh", *cluster.ssh_args()])
        self.ansible = ansible
        self.ansible_home = work / "ansible"
        self.runs = 0
        self.masters_note = ""

    # ---- the nodes' folders

    def on_every_node(self, argv: Sequence[str], nodes: Sequence[str] | None = None) -> None:
        names = list(nodes or self.cluster.names)
        with ThreadPoolExecutor(len(names)) as pool:
            procs = list(pool.map(lambda name: self.cluster.exec(name, argv, timeout=300), names))
        for name, proc in zip(names, procs, strict=True):
            if proc.returncode != 0:
                raise BenchFailure(f"{name}: {shlex.join(argv)}: {proc.stderr.strip()}")

    def prepare_nodes(self) -> None:
        self.on_every_node(["mkdir", "-p", str(DEST_ROOT), str(ANSIBLE_REMOTE_TMP)])

    def remove(self, dest: Path) -> None:
        self.on_every_node(["rm", "-rf", str(dest)])

    def clean_nodes(self) -> None:
        self.on_every_node(["rm", "-rf", str(DEST_ROOT), str(ANSIBLE_REMOTE_TMP)])

    def verify(self, payload: Payload, dest: Path, nodes: Sequence[str], method: str) -> None:
        """Every node in `nodes` holds exactly the payload's files at dest, else fail."""
        with ThreadPoolExecutor(len(nodes)) as pool:
            listings = list(
                pool.map(lambda n: node_listing(self.cluster, n, dest, payload.hashed), nodes)
            )
        for name, got in zip(nodes, listings, strict=True):
            if got != payload.listing:
                missing = sorted(set(payload.listing) - set(got))[:3]
                extra = sorted(set(got) - set(payload.listing))[:3]
                raise BenchFailure(
                    f"WRONG COPY by {method} on {name} at {dest}: {len(got)} files, "
                    f"expected {len(payload.listing)}; missing or different {missing}, "
                    f"unexpected {extra}"
                )

    # ---- untimed preparations

    def end_masters(self) -> None:
        """End cpuaccel's kept ssh masters to these nodes (``ssh -O exit``), so that its
        next sync is a first contact, as every rsync is. Should the connector's interface
        change, the runs go on with the masters kept, and the report says so."""
        try:
            from cpuaccel.connectors.choose import connector_for
            from cpuaccel.connectors.connect_options import ConnectOptions
            from cpuaccel.connectors.openssh_session import OpenSSHConnector
            from cpuaccel.inventory.inventory import Inventory

            hosts = Inventory.load(self.cluster.inventory_path).hosts
            for host in hosts.values():
                conn = connector_for(host, ConnectOptions(keep=True))
                if isinstance(conn, OpenSSHConnector):
                    argv = ["ssh", "-o", f"ControlPath={conn.control_path()}", "-O", "exit", "x"]
                    subprocess.run(argv, capture_output=True, timeout=30, check=False)
        except Exception as exc:  # the other tools' runs do not depend on it
            if not self.masters_note:
                self.masters_note = f"cpuaccel's kept ssh masters not ended ({exc!r})"
                self.log(self.masters_note)

    def argvs(self, method: str, payload: Payload, dest: Path) -> list[list[str]]:
        src = f"{payload.src}/"
        if method == "one copy":
            return [
                [
                    "rsync",
                    "-a",
                    "-e",
                    self.ssh,
                    src,
                    f"root@{self.cluster.nodes[0].address}:{dest}/",
                ]
            ]
        if method == "parallel rsync":
            return [
                ["rsync", "-a", "-e", self.ssh, src, f"root@{node.address}:{dest}/"]
                for node in self.cluster.nodes
            ]
        if method == "Ansible copy":
            assert self.ansible is not None
            forks = str(len(self.cluster.nodes))
            return [
                [
                    str(self.ansible), "all", "-i", str(self.cluster.inventory_path),
                    "-f", forks, "-m", "copy", "-a", f"src={src} dest={dest}/",
                ]
            ]  # fmt: skip
        if method == "cpuaccel copy":
            return [self.provision("copy.yaml", COPY_PLAYBOOK, payload.src / FILE_NAME, str(dest))]
        if method == "cpuaccel synchronize":
            return [self.provision("push.yaml", PUSH_PLAYBOOK, src, f"{dest}/")]
        return [
            [
                self.cpuaccel, "sync", "-i", str(self.cluster.inventory_path),
                str(payload.src), "--dest", str(dest),
            ]
        ]  # fmt: skip

    def provision(self, name: str, playbook: str, src: object, dest: str) -> list[str]:
        """`cpuaccel provision` of ``playbook`` (written as ``name``), with src and dest."""
        book = self.work / name
        book.write_text(playbook)
        return [
            self.cpuaccel, "provision", str(book), "-i", str(self.cluster.inventory_path),
            "-e", f"src={src}", "-e", f"dest={dest}",
        ]  # fmt: skip

    def env(self, method: str) -> dict[str, str]:
        env = dict(os.environ, XDG_CACHE_HOME=str(self.cache_home))
        if method == "Ansible copy":
            env.update(
                ANSIBLE_HOME=str(self.ansible_home),
                ANSIBLE_LOCAL_TEMP=str(self.ansible_home / "tmp"),
                ANSIBLE_REMOTE_TMP=str(ANSIBLE_REMOTE_TMP),
                ANSIBLE_HOST_KEY_CHECKING="True",
                ANSIBLE_PIPELINING="True",
                # A folder of its own each run: no master of an earlier run is reused.
                ANSIBLE_SSH_CONTROL_PATH_DIR=str(self.ansible_home / f"cp{self.runs}"),
            )
        return env

    # ---- one timed run

    def measure(self, method: str, payload: Payload, timeout: float) -> Run:
        """Prepare (not timed), time one copy by `method`, check every copy, remove it."""
        self.runs += 1
        tag = "-".join(method.lower().split())
        dest = DEST_ROOT / f"{tag}-{payload.name}-{self.runs}"
        nodes = self.cluster.names[:1] if method == "one copy" else self.cluster.names
        self.remove(dest)
        if method.startswith("cpuaccel"):
            shutil.rmtree(self.cache_home, ignore_errors=True)
            self.end_masters()
        argvs = self.argvs(method, payload, dest)
        env = self.env(method)
        os.sync()  # the previous run's writes land now, not during this one
        run = timed(argvs, env, timeout)
        self.verify(payload, dest, nodes, method)
        self.remove(dest)
        return run


def timed(argvs: list[list[str]], env: dict[str, str], timeout: float) -> Run:
    """Start every argv at once; wall seconds until the last ends, and the CPU busy share.
    A non-zero exit or the timeout fails the bench. Each argv runs in a process group of
    its own, killed whole if it is still there when this returns (rsync's ssh included)."""
    procs: list[subprocess.Popen[bytes]] = []
    with contextlib.ExitStack() as stack:
        # Output to files, not pipes: a pipe nobody reads while waiting could fill and block.
        outputs = [stack.enter_context(tempfile.TemporaryFile()) for _ in argvs]
        stack.callback(_kill_groups, procs)
        busy0, total0 = cpu_ticks()
        started = time.perf_counter()
        for argv, out in zip(argvs, outputs, strict=True):
            procs.append(
                subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                    env=env, start_new_session=True,
                )
            )  # fmt: skip
        deadline = started + timeout
        for argv, proc in zip(argvs, procs, strict=True):
            try:
                proc.wait(timeout=max(0.1, deadline - time.perf_counter()))
            except subprocess.TimeoutExpired:
                raise BenchFailure(f"{shlex.join(argv)} took over {timeout:.0f}s") from None
        elapsed = time.perf_counter() - started
        busy1, total1 = cpu_ticks()
        for argv, proc, out in zip(argvs, procs, outputs, strict=True):
            if proc.returncode != 0:
                out.seek(0)
                said = out.read().decode(errors="replace")[-3000:]
                raise BenchFailure(f"{shlex.join(argv)} exited {proc.returncode}:\n{said}")
    return Run(elapsed, (busy1 - busy0) / max(1, total1 - total0))


def _kill_groups(procs: list[subprocess.Popen[bytes]]) -> None:
    """End what is still running of the process groups started here (each Popen's own
    session): a tool stopped by a failure, a timeout or Ctrl-C, with its children."""
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


# --------------------------------------------------------------------------- main


@dataclass
class Cell:
    """One payload at one node count: each method's runs, or why it was skipped."""

    payload: Payload
    nodes: int
    runs: dict[str, list[Run]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)

    def median(self, method: str) -> float:
        return statistics.median(run.seconds for run in self.runs[method])


def wire_seconds(payload: Payload, rate: str) -> float:
    """The payload's time on one link at the rate, protocol overhead aside."""
    return payload.total * 8 / rate_bits(rate)


def measure_cell(
    tools: Tools, cell: Cell, args: argparse.Namespace, log: Callable[[str], None]
) -> None:
    """Every method's --repeat runs of one payload at one node count, into `cell` as they
    come (a failure leaves the runs so far for the report)."""
    payload, nodes = cell.payload, cell.nodes
    star = wire_seconds(payload, args.rate) * nodes
    if tools.ansible is None:
        cell.skipped["Ansible copy"] = "not asked for (--ansible-budget 0)"
    elif star > args.ansible_budget:
        cell.skipped["Ansible copy"] = (
            f"a copy a node from the controller needs {star:.0f}s of wire time a run at "
            f"{args.rate}, over --ansible-budget {args.ansible_budget:g}s"
        )
    if payload.name != "file":
        cell.skipped["cpuaccel copy"] = "copy takes one file, and this payload is a folder"
    methods = [m for m in METHODS if m not in cell.skipped]
    for method, reason in cell.skipped.items():
        log(f"{payload.name}, {nodes} nodes: {method} skipped: {reason}")
    timeout = 120 + 4 * star
    for rnd in range(args.repeat):
        shift = rnd % len(methods)
        order = methods[shift:] + methods[:shift]
        row = []
        for method in order:
            run = tools.measure(method, payload, timeout)
            cell.runs.setdefault(method, []).append(run)
            row.append(f"{method} {run.seconds:.2f}s ({100 * run.cpu:.0f}% CPU)")
        log(f"{payload.name}, {nodes} nodes, run {rnd + 1}/{args.repeat}: " + ", ".join(row))


def report(cells: list[Cell], args: argparse.Namespace, notes: list[str]) -> None:
    print(
        f"median of {args.repeat} runs, wall seconds (ratio to one copy); every link "
        f"shaped to {args.rate} (tbf, both ways, controller included)"
    )
    print(f"CPU: {cpu_line()}")
    print(f"cpuaccel: {Path(sys.executable).with_name('cpuaccel')} at {git_head()}")
    print()
    header = "| payload | nodes | wire time, one link | " + " | ".join(METHODS) + " |"
    print(header)
    print("|---|---:|---:|" + "---:|" * len(METHODS))
    footnotes: list[str] = []
    for cell in cells:
        floor = cell.median("one copy") if "one copy" in cell.runs else None
        cells_text = []
        for method in METHODS:
            if method in cell.skipped:
                footnotes.append(f"{method} skipped: {cell.skipped[method]}")
                cells_text.append(f"skipped ({len(footnotes)})")
            elif method not in cell.runs:
                cells_text.append("not run")
            else:
                med = cell.median(method)
                ratio = f" ({med / floor:.2f}x)" if floor else ""
                cells_text.append(f"{med:.2f} s{ratio}")
        wire = wire_seconds(cell.payload, args.rate)
        print(
            f"| {cell.payload.label} | {cell.nodes} | {wire:.2f} s | "
            + " | ".join(cells_text)
            + " |"
        )
    for number, text in enumerate(footnotes, 1):
        print(f"({number}) {text}")
    print()
    print("machine CPU busy during the run (both cores, median):")
    print()
    print("| payload | nodes | " + " | ".join(METHODS) + " |")
    print("|---|---:|" + "---:|" * len(METHODS))
    for cell in cells:
        shares = [
            f"{100 * statistics.median(r.cpu for r in cell.runs[m]):.0f}%"
            if m in cell.runs
            else "-"
            for m in METHODS
        ]
        print(f"| {cell.payload.label} | {cell.nodes} | " + " | ".join(shares) + " |")
    print()
    for cell in cells:
        spread = [
            f"{m} {min(r.seconds for r in runs):.2f}-{max(r.seconds for r in runs):.2f}s"
            for m, runs in cell.runs.items()
        ]
        print(f"{cell.payload.name}, {cell.nodes} nodes, min-max: " + ", ".join(spread))
    for note in notes:
        print(note)


def cpu_line() -> str:
    """The CPU's model name, its core count, and whether it has AMX."""
    text = Path("/proc/cpuinfo").read_text()
    names = [ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("model name")]
    flags = next(
        (ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), []
    )
    amx = [f for f in flags if f.startswith("amx")]
    has = f"yes ({' '.join(sorted(amx))})" if amx else "no"
    return f"{names[0] if names else '?'}, {os.cpu_count()} cores, AMX: {has}"


def git_head() -> str:
    proc = subprocess.run(
        ["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return proc.stdout.strip() or "?"


def byte_compile() -> bool:
    """Byte-compile the cpuaccel package the CLI runs, as installing it does: under
    PYTHONDONTWRITEBYTECODE=1, each run would otherwise compile every module it imports,
    a cost no installed cpuaccel pays. True when done."""
    import compileall

    import cpuaccel  # the one the CLI imports: the same sys.path as this process

    return bool(compileall.compile_dir(os.path.dirname(cpuaccel.__file__), quiet=1))


def csv_of(kind: Callable[[str], Any], allowed: Sequence[str] = ()) -> Callable[[str], list[Any]]:
    """An argparse type: a comma-separated list of `kind`, each in `allowed` if given."""

    def parse(text: str) -> list[Any]:
        try:
            values = [kind(word) for word in text.split(",") if word]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: a comma-separated list") from None
        if not values or (allowed and any(v not in allowed for v in values)):
            raise argparse.ArgumentTypeError(
                f"{text!r}: choose from {', '.join(map(str, allowed))}"
            )
        return values

    return parse


def node_count(word: str) -> int:
    count = int(word)
    if not 1 <= count <= 64:
        raise ValueError(word)
    return count


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=csv_of(node_count), default=csv_of(node_count)(NODES))
    parser.add_argument(
        "--payloads", type=csv_of(str, PAYLOADS), default=list(PAYLOADS), help="file,wheelhouse"
    )
    parser.add_argument("--megabytes", type=float, default=50, help="the file payload's size")
    parser.add_argument("--wheelhouse", type=Path, default=ROOT / ".wheelhouse" / "upstream")
    parser.add_argument("--rate", default="200mbit", help="every link's, in tc's units")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--ansible-budget",
        type=float,
        default=120,
        help="skip Ansible's copy where a copy a node from the controller needs more wire "
        "seconds a run than this (0: never run it)",
    )
    parser.add_argument("--cluster-id", type=int, default=CLUSTER_ID)
    parser.add_argument("--quiet", action="store_true", help="no per-run lines on stderr")
    args = parser.parse_args()
    try:
        rate_bits(args.rate)
    except ValueError as exc:
        parser.error(str(exc))
    if args.repeat < 1 or args.megabytes <= 0:
        parser.error("--repeat must be >= 1 and --megabytes > 0")
    return args


def _terminated(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds through every `finally`: qdiscs, cluster


def main() -> None:
    args = parse_args()
    if shutil.which("rsync") is None:
        raise SystemExit("rsync is not installed: apt-get install rsync")
    signal.signal(signal.SIGTERM, _terminated)

    def log(line: str) -> None:
        if not args.quiet:
            print(f"[{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)

    started = time.perf_counter()
    load_before = os.getloadavg()[0]
    ansible = ensure_ansible("ansible") if args.ansible_budget > 0 else None
    compiled = byte_compile()
    work = Path(tempfile.mkdtemp(prefix="cpxl-bench-broadcast-"))
    cells: list[Cell] = []
    notes: list[str] = []
    failure: BenchFailure | None = None
    try:
        payloads = []
        if "file" in args.payloads:
            payloads.append(make_file_payload(work / "project", args.megabytes))
        if "wheelhouse" in args.payloads:
            payloads.append(wheelhouse_payload(args.wheelhouse))
        for payload in payloads:
            log(f"payload {payload.label}: {wire_seconds(payload, args.rate):.2f}s on one link")
        for nodes in args.nodes:
            log(f"{nodes} nodes: bringing up cluster {args.cluster_id}, links at {args.rate}")
            with Cluster(nodes, cluster_id=args.cluster_id) as cluster, shaped(cluster, args.rate):
                tools = Tools(cluster, work, ansible, log)
                tools.prepare_nodes()
                try:
                    for payload in payloads:
                        cells.append(Cell(payload, nodes))
                        measure_cell(tools, cells[-1], args, log)
                finally:
                    tools.clean_nodes()
                    if tools.masters_note:
                        notes.append(tools.masters_note)
    except BenchFailure as exc:
        failure = exc
    finally:
        shutil.rmtree(work, ignore_errors=True)
    notes += [
        f"cpuaccel's modules byte-compiled before the runs: {'yes' if compiled else 'no'}",
        f"load average (1 min) before: {load_before:.2f}, after: {os.getloadavg()[0]:.2f}",
        f"bench took {time.perf_counter() - started:.0f}s",
    ]
    if cells and failure is None:
        notes.insert(0, "every copy checked on every node: " + "; ".join(
            f"{p.name} by {'sha256' if p.hashed else 'paths and sizes'}"
            for p in {c.payload.name: c.payload for c in cells}.values()
        ))  # fmt: skip
    if cells:
        report(cells, args, notes)
    if failure is not None:
        print(f"\nBENCH FAILED: {failure}", file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
