"""The real Slurm of the test cluster (cpuaccel.testbed.slurm): jobs run on the namespace
nodes, sacct reports their end, and ``down`` leaves no daemon, socket or file behind."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cpuaccel.testbed import slurm_files
from cpuaccel.testbed.cluster import NODE_DIR, Cluster, ClusterError
from cpuaccel.testbed.netns import _alive, state_dir_for
from cpuaccel.testbed.slurm import SlurmBed, restore
from cpuaccel.testbed.state import leftovers

pytestmark = pytest.mark.cluster

FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}


def _client(bed: SlurmBed, *argv: str, cwd: Path | None = None) -> str:
    done = subprocess.run(
        list(argv), env={**os.environ, **bed.env}, capture_output=True, text=True,
        timeout=60, check=False, cwd=cwd,
    )  # fmt: skip
    assert done.returncode == 0, f"{argv}: {done.stderr}"
    return done.stdout


def _sacct_end(bed: SlurmBed, job: str, timeout: float = 60) -> tuple[str, str]:
    """(State, ExitCode) of a job once sacct reports it ended."""
    deadline = time.monotonic() + timeout
    while True:
        out = _client(bed, "sacct", "-X", "-n", "-P", "-j", job, "-o", "State,ExitCode")
        rows = [line.split("|") for line in out.splitlines() if line.strip()]
        if rows and rows[0][0].split()[0] in FINAL_STATES:
            return rows[0][0].split()[0], rows[0][1]
        assert time.monotonic() < deadline, f"job {job} not ended within {timeout}s: {out!r}"
        time.sleep(0.2)


def test_srun_runs_one_task_on_every_node(slurm: SlurmBed) -> None:
    # A task sees its node as an SSH session does: hostname, /etc/hosts, private dir.
    for node in slurm.cluster.nodes:
        (node.private_dir / "whoami").write_text(f"private-{node.name}\n")
    script = f"echo $(hostname) $SLURM_NODEID $(cat {NODE_DIR}/whoami) $(getent hosts node2)"
    out = _client(slurm, "srun", "-N", "3", "-l", "sh", "-c", script)
    tasks = sorted(line.split(": ", 1)[1] for line in out.splitlines())
    node2 = slurm.cluster.node("node2").address
    assert tasks == [f"node{k} {k - 1} private-node{k} {node2} node2" for k in (1, 2, 3)]
    assert slurm.cluster.start_slurm() is slurm  # started once: the same bed
    assert slurm.nodes == ["node1", "node2", "node3"]
    assert slurm.partition == "debug"
    # A node's slurmd is the bed's, not a process a test's job left behind.
    slurmd = slurm.pids["slurmd-node2"]
    assert slurmd not in slurm.cluster.pids("node2")
    assert slurm.cluster.wait_idle("node2") == []


def test_batch_jobs_end_in_sacct_with_their_exit_code(slurm: SlurmBed, tmp_path: Path) -> None:
    ok = _client(
        slurm, "sbatch", "--parsable", "-N", "2", "-o", str(tmp_path / "ok.out"),
        "--wrap", "srun hostname", cwd=tmp_path,
    ).strip()  # fmt: skip
    bad = _client(
        slurm, "sbatch", "--parsable", "-o", str(tmp_path / "bad.out"),
        "--wrap", "echo failing; exit 3", cwd=tmp_path,
    ).strip()  # fmt: skip
    assert _sacct_end(slurm, ok) == ("COMPLETED", "0:0")
    assert _sacct_end(slurm, bad) == ("FAILED", "3:0")
    assert sorted((tmp_path / "ok.out").read_text().split()) == ["node1", "node2"]
    assert (tmp_path / "bad.out").read_text() == "failing\n"
    slurm.wait_idle(30)


def test_up_slurm_then_down_leaves_nothing(slurm: SlurmBed) -> None:
    # A second, one-node cluster through the shell commands; the session's keeps running.
    scratch = (slurm.cluster.cluster_id + 1) % 256
    command = [sys.executable, "-m", "cpuaccel.testbed"]
    up = subprocess.run(
        [*command, "up", "--nodes", "1", "--id", str(scratch), "--slurm"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    state_dir = state_dir_for(scratch)
    paths = slurm_files.BedPaths(slurm_files.bed_dir(state_dir))
    try:
        assert up.returncode == 0, up.stderr
        assert f"SLURM_CONF={paths.conf}" in up.stderr
        pids = json.loads(paths.pids_file.read_text())
        assert {"munged", "slurmctld", "slurmd-node1"} <= set(pids)
        assert all(_alive(pid) for pid in pids.values())
        assert paths.munge_socket.is_socket()
        env = {**os.environ, "SLURM_CONF": str(paths.conf)}
        hostname = subprocess.run(
            ["srun", "-N", "1", "hostname"], env=env, capture_output=True, text=True,
            timeout=60, check=False,
        )  # fmt: skip
        assert hostname.stdout.strip() == "node1", hostname.stderr
    finally:
        down = subprocess.run(
            [*command, "down", "--id", str(scratch)], capture_output=True, text=True,
            timeout=120, check=False,
        )  # fmt: skip
    assert down.returncode == 0, down.stderr
    assert [daemon for daemon, pid in pids.items() if _alive(pid)] == []
    assert slurm_files.bed_pids(state_dir) == set()
    assert not state_dir.exists()
    assert not paths.munge_socket.exists()
    ports = slurm_files.ports(scratch)
    for port in (ports["slurmctld"], ports["mariadb"]):
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
    # The session's bed was not touched.
    assert slurm.running


def test_restore_cancels_a_left_job_and_resumes_a_drained_node(slurm: SlurmBed) -> None:
    job = _client(
        slurm, "sbatch", "--parsable", "-w", "node1", "-o", "/dev/null", "--wrap", "sleep 300"
    ).strip()
    _client(slurm, "scontrol", "update", "nodename=node3", "state=drain", "reason=maint")
    assert slurm.node_states()["node3"].startswith("drain")
    wrong = restore(slurm)
    assert wrong == [f"jobs left: {job} (cancelled)", "nodes node3 drained (resumed)"]
    assert _sacct_end(slurm, job)[0] == "CANCELLED"
    assert slurm.node_states() == {"node1": "idle", "node2": "idle", "node3": "idle"}
    assert restore(slurm) == []


def test_a_taken_port_is_one_error_naming_it_and_nothing_is_left(slurm: SlurmBed) -> None:
    scratch = (slurm.cluster.cluster_id + 1) % 256
    port = slurm_files.ports(scratch)["slurmctld"]
    with socket.create_server(("127.0.0.1", port)), pytest.raises(ClusterError) as caught:
        Cluster(1, cluster_id=scratch, slurm=True).__enter__()
    assert str(caught.value).startswith(f"port {port} (slurmctld of test cluster {scratch}) ")
    assert all(not found for found in leftovers(scratch).values())
