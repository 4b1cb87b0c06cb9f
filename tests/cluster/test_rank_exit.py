"""A rank is finished when its script's process exits, on real nodes: a script that
keeps a copy of stderr open (as DeepSpeed's op builder does) ends the job at once with
its own exit code, and a background helper left holding a rank's output is ended and
named in that rank's log, with nothing of the job left on any node. Ranks import
cpuaccel from the tree under test. Without nodes: the worker tests of
tests/unit/jobs/test_run.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cpuaccel.testbed.cluster import Cluster
from cpuaccel.testbed.slurm import SlurmBed
from tests.cluster.fixtures import TREE, TWO_BY_TWO, assert_nothing_left, master_port
from tests.cluster.test_slurm_run import in_allocation, run_id_of
from testsupport.runs import cpuaccel_run, job_processes, make_project

pytestmark = pytest.mark.cluster

DUP = "import os, sys\nos.dup(sys.stderr.fileno())\n"
# A helper started in the background inherits stdout and outlives the script.
HELPER = (
    "import os, subprocess, sys\n"
    "os.dup(sys.stderr.fileno())\n"
    "helper = subprocess.Popen(['sleep', '600'])\n"
    "print('helper', helper.pid, flush=True)\n"
)
# Each run's whole time, nodes' preflight and sync included, is well under this;
# a rank that waited for its output to close would run to cpuaccel_run's own timeout.
BOUND = 90


def test_a_kept_copy_of_stderr_does_not_keep_the_job(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    proj = make_project(tmp_path, {"repro.py": DUP})
    run = cpuaccel_run(
        proj, "-i", inventory, *TWO_BY_TWO, *TREE, "--master-port", master_port(),
        "repro.py", timeout=240,
    )  # fmt: skip
    assert run.code == 0, run
    assert run.seconds < BOUND, run
    assert "still held its output" not in run.stdout + run.stderr, run
    assert run.record()["exit_code"] == 0
    assert_nothing_left(cluster, run.record()["run_id"])


@pytest.mark.parametrize(
    ("launcher", "mpirun"),
    [("impi", None), ("mpich", "mpirun.mpich"), ("openmpi", "mpirun.openmpi")],
)
def test_a_helper_left_holding_the_output_is_ended_and_named(
    cluster: Cluster, inventory: str, tmp_path: Path, launcher: str, mpirun: str | None
) -> None:
    if mpirun is not None and not Path("/usr/bin", mpirun).exists():
        message = f"/usr/bin/{mpirun} is not installed (.ci/run installs mpich and openmpi-bin)"
        if os.environ.get("CPUACCEL_REQUIRE_CLUSTER") == "1":
            pytest.fail(message)
        pytest.skip(message)
    proj = make_project(tmp_path, {"helper.py": HELPER})
    run = cpuaccel_run(
        proj, "-i", inventory, *TWO_BY_TWO, *TREE, "--master-port", master_port(),
        "--launcher", launcher, "helper.py", timeout=240,
    )  # fmt: skip
    assert run.code == 0, run
    assert run.seconds < BOUND, run
    assert_helpers_named(run.run_dir)
    assert_nothing_left(cluster, run.record()["run_id"])


def test_under_slurm_too(slurm: SlurmBed, cluster: Cluster, tmp_path: Path) -> None:
    project = make_project(tmp_path, {"helper.py": HELPER})
    proc = in_allocation(slurm, project, 2, "--ppn", "2", "helper.py")
    assert proc.returncode == 0, proc.stderr
    run_id = run_id_of(proc)
    assert_helpers_named(project / "runs" / run_id)
    for node in cluster.names:
        assert job_processes(cluster, node, run_id) == [], node


def assert_helpers_named(run_dir: Path) -> None:
    """Each of the four ranks' logs names the helper it printed the pid of as ended."""
    for rank in range(4):
        log = (run_dir / f"rank-{rank}.log").read_text().splitlines()
        pid = int(log[0].split()[-1])
        assert (
            f"[cpuaccel] a process of the script (pid {pid}, sleep 600) still held its "
            "output at exit: ended it"
        ) in log, (rank, log)
