"""The Slurm test bed's files and its bounded waits, without a cluster (the bed itself is
tested for real in tests/cluster/test_slurm_bed.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any, cast

import pytest

from cpuaccel.testbed import slurm, slurm_files
from cpuaccel.testbed.netns import ClusterError, make_nodes


def _conf(cluster_id: int, tmp_path: Path, accounting: bool = True) -> str:
    nodes = make_nodes(cluster_id, 2, tmp_path)
    paths = slurm_files.BedPaths(tmp_path / "slurm")
    return slurm_files.slurm_conf(
        paths, cluster_id, f"10.77.{cluster_id}.254", nodes, 4, accounting
    )


def test_each_cluster_id_has_its_own_ports_and_paths(tmp_path: Path) -> None:
    ranges = [set(slurm_files.ports(cid).values()) for cid in range(256)]
    assert all(len(ports) == 4 for ports in ranges)
    assert len(set().union(*ranges)) == 4 * 256  # no two ids share a port
    assert max(max(ports) for ports in ranges) < 32768  # below Linux's ephemeral ports
    conf = _conf(5, tmp_path)
    lines = [line for line in conf.splitlines() if "=" in line and " " not in line]
    settings = dict(line.split("=", 1) for line in lines)
    assert settings["SlurmctldPort"] == str(slurm_files.ports(5)["slurmctld"])
    assert settings["AuthInfo"] == f"socket={tmp_path}/slurm/munge/munge.socket"
    # slurmdbd's connection takes its munge socket from this setting, not from AuthInfo.
    assert settings["AccountingStoragePass"] == f"{tmp_path}/slurm/munge/munge.socket"
    assert settings["ClusterName"] == "cpxl5"
    assert settings["SlurmctldHost"].endswith("(10.77.5.254)")
    assert "NodeName=node2 NodeAddr=10.77.5.2 CPUs=4 State=UNKNOWN" in conf.splitlines()
    assert "PartitionName=debug Nodes=node1,node2 Default=YES" in conf
    assert "AccountingStorageType" not in _conf(5, tmp_path, accounting=False)


def _bed(tmp_path: Path) -> slurm.SlurmBed:
    paths = slurm_files.BedPaths(tmp_path / "slurm")
    # No cluster: these tests start stand-in daemons, not Slurm.
    return slurm.SlurmBed(cluster=cast(Any, None), paths=paths, accounting=False)


def test_a_daemon_that_dies_is_named_with_its_log(tmp_path: Path) -> None:
    bed = _bed(tmp_path)
    slurm._spawn(bed, "slurmctld", ["sh", "-c", "echo bind failed >&2; exit 1"])
    with pytest.raises(ClusterError) as caught:
        slurm._wait_for(bed, "slurmctld", lambda: False, 20.0)
    message = str(caught.value)
    assert message.startswith("slurmctld (pid ")
    assert "died" in message
    assert str(bed.paths.log("slurmctld")) in message
    assert f"{bed.paths.stderr('slurmctld')}: bind failed" in message
    assert slurm_files.marked_with(os.getpid(), bed.paths.root) is False


def test_a_daemon_that_never_answers_is_a_bounded_wait(tmp_path: Path) -> None:
    bed = _bed(tmp_path)
    slurm._spawn(bed, "slurmd-node1", ["sleep", "60"])
    pid = bed.pids["slurmd-node1"]
    try:
        # Found again by its marker, once the child has exec'd (before, /proc shows the
        # environment it was forked with).
        deadline = time.monotonic() + 10
        while not slurm_files.marked_with(pid, bed.paths.root) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert slurm_files.marked_with(pid, bed.paths.root)
        with pytest.raises(ClusterError, match=r"^slurmd-node1 did not answer within 0s; "):
            slurm._wait_for(bed, "slurmd-node1", lambda: False, 0.2)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        for proc in bed._procs:
            proc.wait(timeout=10)
