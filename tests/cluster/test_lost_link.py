"""A node whose link dies, on the namespace cluster: the link is cut inside its namespace
(``ip link set eth0 down``), which is what a pulled cable or a dead switch port looks
like: no RST, no FIN, just silence. A run ends naming the node it lost, within the
keepalive window; a check ends within its connect timeout. Every test brings the link
back up in ``finally``."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cpuaccel.errors import EXIT_NODE_FAILED
from cpuaccel.testbed.cluster import Cluster
from tests.cluster.fixtures import DEAD_NODE_BOUND, link_down
from testsupport.command import cpuaccel
from testsupport.runs import ENV, BackgroundRun, make_project

pytestmark = pytest.mark.cluster

# Each rank says it started, then sleeps far longer than the test may take.
SLEEPER = """\
import time
print("started", flush=True)
time.sleep(300)
"""


def job_pids(cluster: Cluster, node: str, run_id: str | None = None) -> dict[int, str]:
    """pid -> run id of the processes inside `node` that carry a CPUACCEL_RUN_ID (of
    `run_id` only, if given)."""
    found: dict[int, str] = {}
    for pid in cluster.pids(node):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for entry in environ:
            if entry.startswith(b"CPUACCEL_RUN_ID="):
                value = entry.split(b"=", 1)[1].decode()
                if run_id is None or value == run_id:
                    found[pid] = value
    return found


def restore(cluster: Cluster, node: str, before: set[int]) -> None:
    """End what the test left in the node it cut off: the job's processes, and the sshd
    sessions of the connections cut with it (their peer is gone; nothing tells them)."""
    for pid in set(cluster.pids(node)) - before:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert cluster.wait_idle(node, timeout=10) == [], node


@pytest.mark.parametrize("lost", ["node2", "node1"], ids=["a-worker", "the-head"])
def test_a_node_whose_link_drops_mid_run_is_named_and_the_run_ends(
    cluster: Cluster, inventory: str, tmp_path: Path, lost: str
) -> None:
    proj = make_project(tmp_path, {"job.py": SLEEPER})
    before = set(cluster.pids(lost))
    job = BackgroundRun(proj, "-i", inventory, "--nodes", "3", "--ppn", "1", "job.py")
    try:
        job.wait_for("started", 3)
        run_ids = set(job_pids(cluster, "node3").values())
        assert len(run_ids) == 1, run_ids
        run_id = run_ids.pop()
        with link_down(cluster, lost):
            cut = time.monotonic()
            run = job.finish(timeout=DEAD_NODE_BOUND + 30)
            seconds = time.monotonic() - cut
            # While the node is still cut off: nothing of the job on the others.
            for node in cluster.names:
                if node != lost:
                    assert job_pids(cluster, node, run_id) == {}, (node, run)
    finally:
        job.stop()
        restore(cluster, lost, before)
    assert seconds < DEAD_NODE_BOUND, run
    assert run.code == 255, run
    assert "Traceback" not in run.stderr, run
    assert f"lost the connection to {lost}" in run.stderr, run
    assert f"still running on {lost}: not checked" in run.stderr, run
    record = run.record()
    assert record["reason"] == "lost" and record["exit_code"] == 255
    assert record["run_id"] == run_id
    assert lost in record["left"]


def test_check_of_a_node_whose_link_is_down_ends_within_the_connect_timeout(
    cluster: Cluster, inventory: str
) -> None:
    timeout = 3
    with link_down(cluster, "node3"):
        started = time.monotonic()
        proc = cpuaccel("check", "-i", inventory, "-T", str(timeout), env=ENV, timeout=60)
        seconds = time.monotonic() - started
    assert proc.returncode == EXIT_NODE_FAILED, proc
    row = next(line for line in proc.stdout.splitlines() if line.startswith("node3 "))
    assert "unreachable" in row, proc.stdout  # and its error under the table:
    assert "error   node3: cannot connect" in proc.stdout and "timed out" in proc.stdout
    assert "Traceback" not in proc.stderr
    # The connect timeout, plus the CLI's own start and the other nodes' fact probes.
    assert seconds < timeout + 10, proc


# Each rank prints its pid: what must be gone, and named, once its node is reached again.
PID_SLEEPER = """\
import os, time
print("pid", os.getpid(), flush=True)
time.sleep(300)
"""


@contextlib.contextmanager
def unheard(cluster: Cluster, sender: str, receiver: str) -> Iterator[None]:
    """Within the block nothing `sender` sends reaches `receiver` (a route rule in the
    sender: its packets to that address are dropped). It stands for a cut that outlasted
    the sender's own retries: the head's FIN for the launcher's connections, which would
    otherwise reach the node when its link comes back and end its ranks through MPI."""
    namespace, to = cluster.node(sender).namespace, cluster.node(receiver).address
    rule = ["ip", "-n", namespace, "rule", "add", "pref", "900", "to", to, "blackhole"]
    subprocess.run(rule, check=True)
    try:
        yield
    finally:
        subprocess.run(["ip", "-n", namespace, "rule", "del", "pref", "900"], check=True)


@contextlib.contextmanager
def kept_on_node2(cluster: Cluster, job: BackgroundRun, pids: list[int]) -> Iterator[str]:
    """Node2 cut off until the run ends naming it, its ranks (``pids``) kept alive after
    the link is back (the head's packets to node2 held back meanwhile): the run's id."""
    with unheard(cluster, "node1", "node2"):
        with link_down(cluster, "node2"):
            run = job.finish(timeout=DEAD_NODE_BOUND + 30)
            assert "lost the connection to node2" in run.stderr, run
        assert all(alive(pid) for pid in pids), "the ranks were ended before: no test"
        yield run.record()["run_id"]


def rank_pids(job: BackgroundRun, node: str) -> list[int]:
    """The pids the ranks on `node` printed."""
    return [int(line.rsplit(" ", 1)[1]) for line in job.out if f" {node}] pid " in line]


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


@contextlib.contextmanager
def running_job(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> Iterator[tuple[Path, BackgroundRun, list[int]]]:
    """A 3x1 run, its ranks started: (project, the run, node2's rank pids); afterwards
    the run is stopped and what it left on node2 is ended."""
    before = set(cluster.pids("node2"))
    proj = make_project(tmp_path, {"job.py": PID_SLEEPER})
    job = BackgroundRun(proj, "-i", inventory, "--nodes", "3", "--ppn", "1", "job.py")
    try:
        job.wait_for(" pid ", 3)
        pids = rank_pids(job, "node2")
        assert len(pids) == 1, job.report()
        yield proj, job, pids
    finally:
        job.stop()
        restore(cluster, "node2", before)


@pytest.mark.parametrize("verb", ["check", "sync"])
def test_a_lost_nodes_ranks_are_ended_by_the_next_check_or_sync_of_it(
    cluster: Cluster, inventory: str, tmp_path: Path, verb: str
) -> None:
    """The run ends naming node2 and cannot reach its ranks; node2 comes back with them
    still running (the head's FIN never came: ``unheard``). The next check, or sync, of
    node2 finds them, sees in ./runs that their run has ended, ends them and says so."""
    with (
        running_job(cluster, inventory, tmp_path) as (proj, job, pids),
        kept_on_node2(cluster, job, pids) as run_id,
    ):
        started = time.monotonic()
        proc = cpuaccel(verb, "-i", inventory, "--limit", "node2", cwd=proj, env=ENV)
        seconds = time.monotonic() - started
        assert proc.returncode == 0, proc
        # check's notes are on stdout; sync's warning on stderr, its stdout its report
        shown = proc.stdout if verb == "check" else proc.stderr
        said = [line for line in shown.splitlines() if run_id in line]
        assert len(said) == 1 and "node2" in said[0] and "(lost)" in said[0], proc
        assert all(str(pid) in said[0] for pid in pids), (pids, said)
        assert not any(alive(pid) for pid in pids), pids
        assert job_pids(cluster, "node2", run_id) == {}
        assert seconds < 15, proc


def test_a_lost_nodes_ranks_end_by_themselves_when_the_controller_is_silent(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    """Node2 stays cut off: nothing can reach it. The run's agent there (the kept
    prelaunch program) hears no heartbeat from the controller, and ends the ranks."""
    from cpuaccel.jobs.preflight import KEEP_IDLE

    with (
        running_job(cluster, inventory, tmp_path) as (_, job, pids),
        link_down(cluster, "node2"),
    ):
        cut = time.monotonic()
        run = job.finish(timeout=DEAD_NODE_BOUND + 30)
        assert "lost the connection to node2" in run.stderr, run
        deadline = cut + KEEP_IDLE + 20  # the silence, then the sweep's grace
        while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not any(alive(pid) for pid in pids), pids
        assert job_pids(cluster, "node2", run.record()["run_id"]) == {}


def test_stop_of_a_run_that_lost_a_node_ends_the_ranks_the_node_kept(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    """As above, but `cpuaccel stop RUN` of the ended run is what reaches node2 again."""
    with (
        running_job(cluster, inventory, tmp_path) as (proj, job, pids),
        kept_on_node2(cluster, job, pids) as run_id,
    ):
        proc = cpuaccel("stop", run_id, cwd=proj, env=ENV)
        assert proc.returncode == 0, proc
        assert f"{run_id}: had already ended (lost)" in proc.stdout, proc
        swept = [line for line in proc.stderr.splitlines() if "on node2: pids" in line]
        assert len(swept) == 1 and all(str(pid) in swept[0] for pid in pids), proc
        assert not any(alive(pid) for pid in pids), pids
