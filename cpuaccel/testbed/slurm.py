"""A real Slurm in a test cluster: munged, slurmctld (controller side), one slurmd per node.

``Cluster.start_slurm()`` (or ``Cluster(n, slurm=True)``, or ``python -m
cpuaccel.testbed up --slurm``) starts it; the cluster's ``down`` removes it. Its
files are in ``{state_dir}/slurm/`` (:mod:`~cpuaccel.testbed.slurm_files`), its ports follow
from the cluster id, and every daemon is started here, remembered by pid and ended by pid.

How a daemon is started, and why:

- ``munged`` runs as the munge user (``setpriv``: it execs, so the pid is munged's) on a
  socket in the bed's directory; one key and one socket serve every namespace, since a
  Unix socket is a path.
- ``slurmctld`` runs on the controller side (the bridge address); slurmdbd and a private
  MariaDB beside it when accounting is on (:mod:`~cpuaccel.testbed.slurm_db`).
- ``slurmd`` runs in the node's network namespace, entered with ``nsenter --net`` inside a
  fresh mount+UTS namespace made into the node (hostname, /etc/hosts, the node's private
  dir). Not ``ip netns exec``: that mounts a fresh /sys without cgroups and slurmd dies.

Every wait is bounded; a daemon that dies or does not answer is one ClusterError naming
the daemon and its log.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from cpuaccel.testbed import slurm_db, slurm_files
from cpuaccel.testbed.netns import (
    NETNS_DIR,
    ClusterError,
    Node,
    _alive,
    _cmdline,
    _descendants,
    _node_prelude,
    _terminate,
    namespace_pids,
)
from cpuaccel.testbed.slurm_files import MARKER, PARTITION, BedPaths, bed_dir


class Cluster(Protocol):
    """What the bed needs of its test cluster (testbed/cluster.py's ``Cluster``)."""

    cluster_id: int
    state_dir: Path
    hosts_path: Path
    controller_address: str
    fresh_bashrc: bool
    nodes: list[Node]
    slurm_bed: SlurmBed | None

    @property
    def names(self) -> list[str]: ...


Completed = subprocess.CompletedProcess[str]
SLURMCTLD = "/usr/sbin/slurmctld"
SLURMD = "/usr/sbin/slurmd"
MUNGED = "/usr/sbin/munged"
# Node states that come back to idle by themselves once the jobs are gone.
OK_STATES = ("idle", "allocated", "mixed", "completing")
# How long a job that is completing may take to leave the queue before it counts as left.
COMPLETING_BOUND = 15.0
START_TIMEOUT = 30.0  # seconds for each daemon to answer: far above a healthy start


def unavailable_reason() -> str | None:
    """Why a Slurm bed cannot start here (missing packages), or None."""
    needed = [SLURMCTLD, SLURMD, MUNGED, "/usr/bin/setpriv", "/usr/bin/sinfo"]
    missing = [path for path in needed if not Path(path).exists()]
    if missing:
        return f"missing {', '.join(missing)} (tools/system-deps.sh installs slurm-wlm, munge)"
    return None


@dataclass
class SlurmBed:
    """The Slurm of one test cluster; see the module docstring."""

    cluster: Cluster
    paths: BedPaths
    accounting: bool
    cpus: int = 2
    """CPUs of each node, as slurm.conf gives them."""
    pids: dict[str, int] = field(default_factory=dict)
    """daemon name (``munged``, ``slurmctld``, ``slurmd-node1``, ...) -> pid."""
    _procs: list[subprocess.Popen[bytes]] = field(default_factory=list, repr=False)
    ready_after: dict[str, float] = field(default_factory=dict)
    """daemon -> seconds from the start of start() until it answered (for the report)."""

    partition: str = PARTITION

    @property
    def conf_path(self) -> Path:
        return self.paths.conf

    @property
    def nodes(self) -> list[str]:
        return self.cluster.names

    @property
    def env(self) -> dict[str, str]:
        """What a Slurm client command needs (merge into os.environ)."""
        return {"SLURM_CONF": str(self.paths.conf)}

    def log_path(self, daemon: str) -> Path:
        return self.paths.log(daemon)

    def client(self, argv: Sequence[str], timeout: float = 30.0) -> Completed:
        """Run a Slurm client command against this bed (not checked; bounded)."""
        return subprocess.run(
            list(argv), env={**os.environ, **self.env}, capture_output=True, text=True,
            timeout=timeout, check=False,
        )  # fmt: skip

    def node_states(self) -> dict[str, str]:
        """Each node's state as sinfo says it (``idle``, ``alloc``, ``down*``, ...)."""
        done = self.client(["sinfo", "-h", "-N", "-o", "%N %T"], timeout=15)
        states = {}
        for line in done.stdout.splitlines():
            name, _, state = line.partition(" ")
            states[name] = state.strip().lower()
        return states

    def wait_idle(self, timeout: float = START_TIMEOUT) -> None:
        """Wait until every node is idle; ClusterError naming the others and slurmd's log."""
        deadline = time.monotonic() + timeout
        while True:
            self._check_alive()
            states = self.node_states()
            busy = {n: states.get(n, "missing") for n in self.nodes if states.get(n) != "idle"}
            if not busy:
                return
            if time.monotonic() > deadline:
                first = next(iter(busy))
                raise ClusterError(
                    f"Slurm nodes not idle within {timeout:.0f}s: {busy}; slurmd of {first}: "
                    f"{_logs(self.paths, f'slurmd-{first}')}"
                )
            time.sleep(0.1)

    def _check_alive(self) -> None:
        for daemon, pid in self.pids.items():
            if not _alive(pid):
                raise ClusterError(f"{daemon} (pid {pid}) died; {_logs(self.paths, daemon)}")

    @property
    def running(self) -> bool:
        return bool(self.pids) and all(
            _alive(pid) and slurm_files.marked_with(pid, self.paths.root)
            for pid in self.pids.values()
        )

    def stop(self) -> None:
        """End every daemon of this bed (by pid), the jobs' steps, and remove its files."""
        stop_bed(self.cluster.state_dir, self.cluster.nodes, list(self.pids.values()))
        for proc in self._procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=2)
        self._procs.clear()
        self.pids.clear()
        shutil.rmtree(self.paths.root, ignore_errors=True)


def stop_bed(state_dir: Path, nodes: Sequence[Node], pids: Sequence[int] = ()) -> None:
    """Kill the bed's daemons (these pids, and any carrying its marker), and the job steps
    they left in the nodes (slurmstepd and what it started, inside the nodes' namespaces)."""
    root = bed_dir(state_dir)
    daemons = {pid for pid in pids if slurm_files.marked_with(pid, root)}
    daemons |= slurm_files.bed_pids(state_dir)
    in_nodes = namespace_pids(nodes) if (NETNS_DIR).is_dir() else set()
    steps = {pid for pid in in_nodes if _is_slurmstepd(pid)}
    targets = set(daemons) | steps
    for pid in list(targets):
        targets |= _descendants(pid)
    # The daemons were started with setsid: each is its own process group. Their state is
    # thrown away, so a daemon slow to save it (slurmctld, mariadbd) gets SIGKILL soon.
    _terminate(targets, groups=sorted(daemons), timeout=1.0)


def _is_slurmstepd(pid: int) -> bool:
    argv = _cmdline(pid)
    return bool(argv) and argv[0].startswith("slurmstepd")


def start(cluster: Cluster, cpus: int | None = None, accounting: bool | None = None) -> SlurmBed:
    """Start the Slurm of `cluster` (its nodes up) and wait until every node is idle.

    `accounting` (slurmdbd and its MariaDB, for sacct): by default when installed.
    """
    reason = unavailable_reason()
    if reason is not None:
        raise ClusterError(f"cannot start Slurm on the test cluster: {reason}")
    if accounting is None:
        accounting = slurm_db.unavailable_reason() is None
    paths = BedPaths(bed_dir(cluster.state_dir))
    stop_bed(cluster.state_dir, cluster.nodes)  # a crashed run's leftovers of this id
    _check_ports_free(cluster.cluster_id)
    shutil.rmtree(paths.root, ignore_errors=True)
    bed = SlurmBed(cluster=cluster, paths=paths, accounting=accounting)
    try:
        bed.cpus = cpus if cpus is not None else max(2, os.cpu_count() or 2)
        _write_files(bed)
        _spawn(bed, "munged", _munged_argv(paths), cwd=paths.munge_dir)
        _wait_for(bed, "munged", lambda: paths.munge_socket.is_socket(), 10.0)
        if accounting:
            slurm_db.start(
                paths,
                cluster.cluster_id,
                cluster.controller_address,
                lambda daemon, argv: _spawn(bed, daemon, argv),
                lambda daemon, ready, timeout: _wait_for(bed, daemon, ready, timeout),
            )
        _spawn(bed, "slurmctld", [SLURMCTLD, "-D", "-f", str(paths.conf)])
        _wait_for(bed, "slurmctld", lambda: _ctld_answers(bed), START_TIMEOUT)
        for node in cluster.nodes:
            _spawn(bed, f"slurmd-{node.name}", _slurmd_argv(cluster, node, paths))
        began = time.monotonic()
        bed.wait_idle(START_TIMEOUT)
        bed.ready_after["nodes idle"] = time.monotonic() - began
    except BaseException:
        with contextlib.suppress(Exception):
            bed.stop()
        raise
    return bed


def _check_ports_free(cluster_id: int) -> None:
    """ClusterError if a controller-side port of the bed is taken: slurmctld does not exit
    when it cannot bind, it retries and never answers (a 30 s wait for nothing)."""
    for daemon, port in slurm_files.ports(cluster_id).items():
        if daemon == "slurmd":
            continue  # bound in each node's own network namespace
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("0.0.0.0", port))
            except OSError as exc:
                raise ClusterError(
                    f"port {port} ({daemon} of test cluster {cluster_id}) is in use on this "
                    f"machine ({exc.strerror}): see `ss -ltnp 'sport = :{port}'`, or use "
                    "another cluster id"
                ) from None


def _write_files(bed: SlurmBed) -> None:
    cluster, paths = bed.cluster, bed.paths
    slurm_files.make_dirs(paths, cluster.nodes)
    slurm_files.write_munge_key(paths)
    text = slurm_files.slurm_conf(
        paths, cluster.cluster_id, cluster.controller_address, cluster.nodes, bed.cpus,
        bed.accounting,
    )  # fmt: skip
    paths.conf.write_text(text)


def _munged_argv(paths: BedPaths) -> list[str]:
    # 8 threads, not 2: every task of an srun step authenticates at once (munge's own
    # advice when it is short of them is 10).
    user = slurm_files.MUNGE_USER
    return [
        "/usr/bin/setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups",
        MUNGED, "--foreground", f"--socket={paths.munge_socket}", "--num-threads=8",
        f"--key-file={paths.munge_key}", f"--pid-file={paths.munge_dir / 'munged.pid'}",
        f"--seed-file={paths.munge_dir / 'munged.seed'}",
        f"--log-file={paths.log('munged')}",
    ]  # fmt: skip


def _slurmd_argv(cluster: Cluster, node: Node, paths: BedPaths) -> list[str]:
    prelude = _node_prelude(node, cluster.hosts_path, cluster.fresh_bashrc)
    slurmd = shlex.join([SLURMD, "-D", "-f", str(paths.conf), "-N", node.name])
    # unshare and nsenter (without --pid) exec, and sh execs slurmd: the pid is slurmd's.
    return [
        "unshare", "--mount", "--uts", "--propagation", "private",
        "nsenter", f"--net={NETNS_DIR / node.namespace}",
        "sh", "-c", f"{prelude} && exec {slurmd}",
    ]  # fmt: skip


def _spawn(
    bed: SlurmBed, daemon: str, argv: Sequence[str], cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> None:  # fmt: skip
    """Start a daemon in the foreground, in its own session, marked as this bed's."""
    log = bed.paths.stderr(daemon)
    log.parent.mkdir(parents=True, exist_ok=True)
    full_env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "HOME": "/root",
        **bed.env, **(env or {}), MARKER: str(bed.paths.root),
    }  # fmt: skip
    with log.open("ab") as out:
        proc = subprocess.Popen(
            ["setsid", *argv], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            cwd=str(cwd or "/"), env=full_env, close_fds=True,
        )  # fmt: skip
    bed._procs.append(proc)
    bed.pids[daemon] = proc.pid
    # For a later process (``down``, ``Cluster.attach``): which pid is which daemon.
    bed.paths.pids_file.write_text(json.dumps(bed.pids) + "\n")


def _wait_for(bed: SlurmBed, daemon: str, ready: Callable[[], bool], timeout: float) -> None:
    """Wait until ready() is true; ClusterError naming the daemon and its log if it dies
    or does not get ready within `timeout` seconds."""
    began = time.monotonic()
    deadline = began + timeout
    while not ready():
        bed._check_alive()
        if time.monotonic() > deadline:
            raise ClusterError(
                f"{daemon} did not answer within {timeout:.0f}s; {_logs(bed.paths, daemon)}"
            )
        time.sleep(0.05)
    bed.ready_after[daemon] = time.monotonic() - began


def _ctld_answers(bed: SlurmBed) -> bool:
    try:
        done = bed.client(["scontrol", "ping"], timeout=5)
    except subprocess.TimeoutExpired:
        return False  # something holds the port but does not answer: _wait_for's deadline
    return "UP" in done.stdout and "DOWN" not in done.stdout


def _logs(paths: BedPaths, daemon: str, size: int = 1200) -> str:
    """Where a daemon logs, and the end of its log (and of its stderr, if it wrote any)."""
    log, stderr = paths.log(daemon), paths.stderr(daemon)
    parts = [f"its log {log}: {_tail(log, size) or '(empty or not written)'}"]
    said = _tail(stderr, size)
    if said:
        parts.append(f"{stderr}: {said}")
    return "; ".join(parts)


def _tail(path: Path, size: int) -> str:
    try:
        return path.read_text(errors="replace").strip()[-size:]
    except OSError:
        return ""


def _jobs_left(bed: SlurmBed, bound: float) -> list[str]:
    """The jobs in the queue, once those only completing (state CG: a test's salloc or
    sbatch job whose end Slurm is still winding up) have left it, or after ``bound``
    seconds."""
    deadline = time.monotonic() + bound
    while True:
        done = bed.client(["squeue", "-h", "-o", "%i %t"], timeout=15)
        jobs = [line.split() for line in done.stdout.splitlines() if line.strip()]
        if all(state != "CG" for _, state in jobs) or time.monotonic() > deadline:
            return [job for job, _ in jobs]
        time.sleep(0.2)


def restore(bed: SlurmBed, timeout: float = START_TIMEOUT) -> list[str]:
    """Bring the bed back to how tests find it: every daemon running, no job left, every
    node idle. Returns what was wrong (empty when nothing was), for the test's warning."""
    wrong = []
    if not bed.running:
        dead = sorted(d for d, pid in bed.pids.items() if not _alive(pid))
        wrong.append(f"daemons not running: {', '.join(dead)} (restarted the bed)")
        fresh = start(bed.cluster, bed.cpus, bed.accounting)
        vars(bed).update(vars(fresh))  # the same object: a session fixture holds it
        bed.cluster.slurm_bed = bed
        return wrong
    jobs = _jobs_left(bed, COMPLETING_BOUND)
    if jobs:
        wrong.append(f"jobs left: {', '.join(jobs)} (cancelled)")
        bed.client(["scancel", *jobs], timeout=15)
    states = bed.node_states()
    off = sorted(n for n in bed.nodes if not states.get(n, "").startswith(OK_STATES))
    if off:
        wrong.append(f"nodes {', '.join(f'{n} {states.get(n)}' for n in off)} (resumed)")
        bed.client(["scontrol", "update", f"nodename={','.join(off)}", "state=resume"])
    if wrong:
        bed.wait_idle(timeout)
    return wrong


def without_daemons(bed: SlurmBed | None, pids: list[int]) -> list[int]:
    """`pids` but the bed's daemons (a node's slurmd is no process of a test's job)."""
    if bed is None:
        return pids
    daemons = set(bed.pids.values())
    return [pid for pid in pids if pid not in daemons]


def attach(cluster: Cluster) -> SlurmBed | None:
    """The bed of a cluster started by another process (``up --slurm``), if it runs."""
    paths = BedPaths(bed_dir(cluster.state_dir))
    if not paths.conf.is_file():
        return None
    conf = paths.conf.read_text()
    bed = SlurmBed(cluster=cluster, paths=paths, accounting="slurmdbd" in conf)
    cpus = re.search(r" CPUs=(\d+) ", conf)
    bed.cpus = int(cpus.group(1)) if cpus else bed.cpus
    try:
        saved = json.loads(paths.pids_file.read_text())
        bed.pids = {str(daemon): int(pid) for daemon, pid in saved.items()}
    except (OSError, ValueError, AttributeError):
        return None
    # All of them, or it is no running bed (start() then cleans up and starts afresh).
    return bed if bed.pids and bed.running else None
