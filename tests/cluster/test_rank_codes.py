"""Every rank's exit code, run after run, on real nodes under each launcher: one rank
fails early (``sys.exit(3)``, an exception, ``os._exit(5)``, SIGKILL of itself) while
the others sleep; the run's exit code and the failing rank's code are its own, and each
rank cpuaccel ended is recorded as 143, SIGTERM by name, in ``run --json`` and in
status.json alike, every time.

A few runs a launcher in ``make test``; ``make test-stress`` sets
CPUACCEL_STRESS_RUNS=50 (runs per launcher, the ways of failing in turn)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cpuaccel.testbed.cluster import Cluster
from tests.cluster.fixtures import TREE, TWO_BY_TWO, assert_nothing_left, master_port
from testsupport.command import cpuaccel
from testsupport.runs import ENV, make_project

pytestmark = pytest.mark.cluster

FAIL = """\
import os, signal, sys, time
rank, failing, how = int(os.environ["RANK"]), int(sys.argv[1]), sys.argv[2]
if rank == failing:
    if how == "exit":
        sys.exit(3)
    if how == "raise":
        raise ValueError("the failing rank's own error")
    if how == "_exit":
        os._exit(5)
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(120)
"""
# How the failing rank ends: its code, and the signal that ended it.
WAYS = {"exit": (3, None), "raise": (1, None), "_exit": (5, None), "kill": (137, "SIGKILL")}
RUNS = int(os.environ.get("CPUACCEL_STRESS_RUNS", str(len(WAYS))))
LAUNCHERS = {"auto": None, "mpich": "mpirun.mpich", "openmpi": "mpirun.openmpi"}


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_each_rank_s_own_code_every_time(
    cluster: Cluster, inventory: str, tmp_path: Path, launcher: str
) -> None:
    mpirun = LAUNCHERS[launcher]
    if mpirun is not None and not Path("/usr/bin", mpirun).exists():
        message = f"/usr/bin/{mpirun} is not installed (make system-deps installs it)"
        if os.environ.get("CPUACCEL_REQUIRE_CLUSTER") == "1":
            pytest.fail(message)
        pytest.skip(message)
    proj = make_project(tmp_path, {"fail.py": FAIL})
    chosen = ("--launcher", launcher) if launcher != "auto" else ()
    wrong = []
    for i in range(RUNS):
        how = sorted(WAYS)[i % len(WAYS)]
        failing = (i // len(WAYS) + 1) % 4  # rank 1, 2 (the other node), 3, 0 in turn
        code, signal = WAYS[how]
        run = cpuaccel(
            "run", "-i", inventory, *TWO_BY_TWO, *TREE, *chosen, "--master-port", master_port(),
            "--json", "fail.py", str(failing), how, cwd=proj, env=ENV, timeout=120,
        )  # fmt: skip
        said = json.loads(run.stdout)
        status = json.loads((proj / "runs" / said["run_id"] / "status.json").read_text())
        want = {str(r): code if r == failing else 143 for r in range(4)}
        signals = {str(r): "SIGTERM" for r in range(4) if r != failing}
        if signal is not None:
            signals[str(failing)] = signal
        got = (run.returncode, said["ranks"], said["signals"])
        got += (status["ranks"], status.get("signals"))
        if got != (code, want, signals, want, signals):
            wrong.append(f"run {i} ({how}, rank {failing}): {got}")
        if i == 0:
            assert_nothing_left(cluster, said["run_id"])
    assert not wrong, f"{len(wrong)} of {RUNS} runs:\n" + "\n".join(wrong)
