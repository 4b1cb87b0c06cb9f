"""What the cluster tests share, beyond the session fixtures of tests/conftest.py and
cpuaccel.testbed (the nodes, ``make_project``, ``cpuaccel_run``, ``job_processes``):

- the checkout: REPO (its examples/ are copied into projects) and TREE, the ``--env``
  that makes the ranks import cpuaccel from the tree under test (a worktree's, when it
  is one) rather than from the nodes' venv;
- the job shapes and ends: TWO_BY_TWO, ``master_port`` for each job, and
  ``assert_nothing_left`` of a job on NODES;
- a node cut off: ``link_down`` and the longest a run may take to end without it
  (DEAD_NODE_BOUND);
- a node reached on another port as another user: ``second_sshd`` (PORT, USER).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import cpuaccel
from cpuaccel.connectors.connect_options import KEEPALIVE_COUNT, KEEPALIVE_INTERVAL
from cpuaccel.jobs.teardown import TEARDOWN
from cpuaccel.node.supervisor import GRACE
from cpuaccel.testbed import sshd
from cpuaccel.testbed.cluster import NODE_DIR, Cluster
from cpuaccel.testbed.netns import SSHD, _descendants
from testsupport.runs import job_processes

REPO = Path(__file__).resolve().parents[2]
# Ranks import cpuaccel from the tree under test (a worktree's, when it is one).
TREE = ("--env", f"PYTHONPATH={Path(cpuaccel.__file__).resolve().parent.parent}")

# ---------------------------------------------------------------- jobs


def train_args(
    steps: int, save_every: int, log_every: int, seed: int = 5, corpus_bytes: int = 20000
) -> tuple[str, ...]:
    """examples/train.py's flags for the tiny fp32 model the cluster tests train (one
    layer of width 32, a 32-token context, batches of 4), checkpointed every
    ``save_every`` steps."""
    return (
        "--steps", str(steps), "--precision", "fp32", "--seed", str(seed),
        "--save-every", str(save_every), "--log-every", str(log_every),
        "--corpus-bytes", str(corpus_bytes), "--context", "32", "--batch", "4",
        "--width", "32", "--layers", "1", "--heads", "2",
    )  # fmt: skip


TWO_BY_TWO = ("--nodes", "2", "--ppn", "2")

# Master ports for the jobs: a new one each job (a job just ended leaves its port in
# TIME_WAIT), all below the kernel's ephemeral range (32768-60999), from which the
# nodes' own outgoing connections (ssh, slurmd) take their local ports. Each pytest
# worker counts in a range of its own: the workers' jobs share the cluster's nodes, and
# two jobs at once on one master port fail the second's preflight.
PORTS = range(20000, 30000)


def _first_port() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    index = int(worker) % count if worker.isdigit() and count > 0 else 0
    width = len(PORTS) // max(1, count)
    # a random start in the first half of the worker's range: a run after this one
    # (whose jobs' ports may still be in TIME_WAIT) likely counts from elsewhere
    return PORTS.start + index * width + random.randrange(0, max(1, width // 2), 100)


_MASTER_PORTS = itertools.count(_first_port())


def master_port(span: int = 1) -> str:
    """A master port no job of this session had, with the ``span - 1`` after it (for a
    command that starts several jobs on consecutive ports)."""
    first = next(_MASTER_PORTS)
    for _ in range(span - 1):
        next(_MASTER_PORTS)
    return str(first)


NODES = ("node1", "node2", "node3")

# An unmodified torch.distributed script: the environment alone (MASTER_ADDR, RANK, ...,
# and the interface gloo uses) decides where its ranks meet. Each rank prints the sum of
# every rank's number plus one: "sum 6.0" for three ranks.
SUM_SCRIPT = """\
import torch
import torch.distributed as dist
dist.init_process_group()
value = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(value)
print(f"sum {value.item()}", flush=True)
dist.destroy_process_group()
"""


def assert_nothing_left(cluster: Cluster, run_id: str) -> None:
    """No process of the job on any node at once, and soon no process at all but sshd."""
    for node in NODES:
        assert job_processes(cluster, node, run_id) == [], node
    for node in NODES:
        # Only the sessions of cpuaccel's own connections may take a moment to close.
        left = cluster.wait_idle(node, timeout=5)
        assert left == [], (node, [Path(f"/proc/{p}/cmdline").read_bytes() for p in left])


# ---------------------------------------------------------------- a node cut off


@contextlib.contextmanager
def link_down(cluster: Cluster, name: str) -> Iterator[None]:
    """Within the block, node `name` neither sends nor receives a packet."""
    namespace = cluster.node(name).namespace
    subprocess.run(["ip", "-n", namespace, "link", "set", "eth0", "down"], check=True)
    try:
        yield
    finally:
        subprocess.run(["ip", "-n", namespace, "link", "set", "eth0", "up"], check=True)


# The longest a dead node may take to end a run: the keepalive window (plus the interval
# before the first unanswered probe), the launcher's SIGTERM grace, and the teardown bound.
DEAD_NODE_BOUND = KEEPALIVE_INTERVAL * (KEEPALIVE_COUNT + 1) + GRACE + TEARDOWN

# ---------------------------------------------------------------- a second sshd

PORT = 2222
USER = "cpxuser"
HOME = NODE_DIR / "home-cpx"


def _wait_for_port(address: str, port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((address, port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@contextlib.contextmanager
def second_sshd(cluster: Cluster, name: str, allow: str) -> Iterator[None]:
    """Another sshd in node ``name`` on PORT, letting in ``allow`` (AllowUsers) only,
    with USER added to that node's /etc/passwd (a bind mount in its namespace)."""
    node = cluster.node(name)
    state = cluster.state_dir
    passwd = state / f"passwd-{name}"
    passwd.write_text(
        Path("/etc/passwd").read_text() + f"{USER}:x:0:0:cpuaccel test:{HOME}:/bin/sh\n"
    )
    (node.private_dir / HOME.name).mkdir(exist_ok=True)
    pid_file = state / f"sshd-{name}-{PORT}.pid"
    config = state / "sshd" / f"{name}-{PORT}.conf"
    text = sshd.sshd_config(
        node, cluster.cluster_id, cluster.host_key_path(name), Path(f"{cluster.key_path}.pub")
    )
    text = text.replace("Port 22\n", f"Port {PORT}\n").replace(
        "PidFile none", f"PidFile {pid_file}"
    )
    config.write_text(text + f"AllowUsers {allow}\n")
    mounted = cluster.exec(name, ["mount", "--bind", str(passwd), "/etc/passwd"])
    assert mounted.returncode == 0, mounted.stderr
    try:
        started = cluster.exec(name, [SSHD, "-f", str(config)])  # it forks into the background
        assert started.returncode == 0, started.stderr
        _wait_for_port(node.address, PORT)
        yield
    finally:
        with contextlib.suppress(OSError, ValueError):
            listener = int(pid_file.read_text())
            # Its sessions too: a master kept from a check (the controller's, or the
            # head's for the launcher reach) would outlive the listener, and a later
            # test's sshd that refuses the head would still be reached through it.
            for pid in [listener, *_descendants(listener)]:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGTERM)
        if node.pid is not None:  # the node's own namespace (sshd_stopped replaces it)
            cluster.exec(name, ["umount", "/etc/passwd"])


def lying_python(folder: Path) -> Path:
    """An interpreter for a node whose broadcast relay reports every kept file's sha256
    falsified; any other program (and the feed) runs as it is."""
    liar = folder / "liar"
    liar.write_text(
        f"#!{sys.executable}\n"
        "import os, sys\n"
        "if len(sys.argv) < 5:  # not a node program (the feed): as it is\n"
        f"    os.execv({sys.executable!r}, [{sys.executable!r}, *sys.argv[1:]])\n"
        "source = sys.stdin.buffer.read(int(sys.argv[4]))\n"
        "source = source.replace(b'Kept(rel, got)', b'Kept(rel, \"0\" * 64)')\n"
        "sys.argv = [sys.argv[0], *sys.argv[4:]]\n"
        "exec(compile(source, 'cpuaccel', 'exec'))\n"
    )
    liar.chmod(0o755)
    return liar
