"""`cpuaccel run --detach` and `cpuaccel stop` against real nodes: the job is supervised on
the head node, outlives the command that started it (even killed with SIGKILL), keeps
status.json there, and `stop` ends it everywhere.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from cpuaccel.errors import EXIT_NODE_FAILED, EXIT_OK
from cpuaccel.testbed.cluster import NODE_DIR, Cluster
from testsupport.command import cpuaccel
from testsupport.runs import ENV, BackgroundRun, cpuaccel_run, job_processes, make_project

pytestmark = pytest.mark.cluster

NODES = ("node1", "node2")
WORKDIR = NODE_DIR / "work"

# Prints "started"; rank FAIL_RANK leaves with code 3 once all four ranks have started
# (each leaves a flag file in a folder every node shares); the others sleep.
SLEEPER = """\
import os, pathlib, sys, time
rank = int(os.environ["RANK"])
flags = pathlib.Path(sys.argv[1])
(flags / f"started-{rank}").touch()
print("started", rank, bool(os.environ.get("API_TOKEN")), flush=True)
if str(rank) == os.environ.get("FAIL_RANK"):
    deadline = time.monotonic() + 30
    while len(list(flags.glob("started-*"))) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    sys.exit(3)
time.sleep(60)
"""


def head_file(cluster: Cluster, run_id: str, name: str) -> str | None:
    done = cluster.exec("node1", ["cat", f"{WORKDIR}/runs/{run_id}/{name}"])
    return done.stdout if done.returncode == 0 else None


def head_status(cluster: Cluster, run_id: str) -> dict[str, Any] | None:
    text = head_file(cluster, run_id, "status.json")
    return json.loads(text) if text else None


def wait_until(what: Any, timeout: float = 60, step: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = what()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(step)


def started_ranks(cluster: Cluster, run_id: str) -> set[int]:
    """The ranks whose log on the head says they started."""
    return {r for r in range(4) if "started" in (head_file(cluster, run_id, f"rank-{r}.log") or "")}


def assert_nothing_left(cluster: Cluster, run_id: str) -> None:
    for node in (*NODES, "node3"):
        assert job_processes(cluster, node, run_id) == [], node
    for node in NODES:
        left = cluster.wait_idle(node, timeout=10)
        assert left == [], (node, [Path(f"/proc/{p}/cmdline").read_bytes() for p in left])


def test_detached_run_outlives_a_killed_controller_and_stop_ends_it(
    cluster: Cluster, tmp_path: Path
) -> None:
    secret = f"tok-{uuid.uuid4().hex[:8]}"
    inventory = str(
        cluster.write_inventory(tmp_path / "inv.yaml", cpuaccel_secret_env={"API_TOKEN": secret})
    )
    flags = tmp_path / "flags"
    flags.mkdir()
    proj = make_project(tmp_path, {"job.py": SLEEPER})
    # `run --detach` killed with SIGKILL as soon as the supervisor is recorded (the end
    # of its start phase): the job must go on.
    job = BackgroundRun(proj, "-i", inventory, "--nodes", "2", "--ppn", "2", "--detach",
                        "job.py", str(flags))  # fmt: skip
    try:

        def recorded() -> dict[str, Any] | None:
            for path in (proj / "runs").glob("*/run.json"):
                record: dict[str, Any] = json.loads(path.read_text())
                if record.get("supervisor"):
                    return record
            return None

        record = wait_until(recorded, timeout=120, step=0.02)
        assert record, job.report()
        job.proc.send_signal(signal.SIGKILL)
        job.proc.wait(10)
    finally:
        job.stop()
    run_id = record["run_id"]
    assert record["detached"] is True and record["head"] == "node1"
    assert record["head_run_dir"] == f"{WORKDIR}/runs/{run_id}"
    assert record["inventory"] == str(Path(inventory).resolve())
    # The job runs on: all four ranks start and keep running, supervised on the head.
    assert wait_until(lambda: started_ranks(cluster, run_id) == {0, 1, 2, 3}), run_id
    time.sleep(2)
    status = head_status(cluster, run_id)
    assert status is not None and status["state"] == "running", status
    assert status["detached"] is True and status["exit_code"] is None
    assert status["supervisor"]["pid"] == record["supervisor"]["pid"]
    assert status["ranks"] == {"0": None, "1": None, "2": None, "3": None}
    for node in NODES:
        assert len(job_processes(cluster, node, run_id)) >= 2, node
    assert "started 2 True" in (head_file(cluster, run_id, "rank-2.log") or "")

    with cluster.sshd_stopped("node1"):  # the head unreachable: said so, nothing ended
        lost = cpuaccel("stop", run_id, "-T", "3", cwd=proj, env=ENV, timeout=120)
    assert lost.returncode == EXIT_NODE_FAILED, (lost.stdout, lost.stderr)
    assert "node1" in lost.stderr and "Traceback" not in lost.stderr
    assert head_status(cluster, run_id)["state"] == "running"  # type: ignore[index]

    stop = cpuaccel("stop", run_id[:-2], cwd=proj, env=ENV, timeout=120)
    assert stop.returncode == EXIT_OK, (stop.stdout, stop.stderr)
    assert f"{run_id}: stopped; nothing of it is left on node1, node2" in stop.stdout
    status = head_status(cluster, run_id)
    assert status is not None and status["state"] == "stopped", status
    assert status["exit_code"] == 143 and status["ended_by"] == "stop" and status["ended"]
    assert status["left"] == {}, status
    home = json.loads((proj / "runs" / run_id / "status.json").read_text())
    assert home["state"] == "stopped"
    assert_nothing_left(cluster, run_id)
    for node in NODES:  # the sweep took the secrets off every node
        gone = cluster.exec(node, ["test", "-e", f"{WORKDIR}/runs/{run_id}/secret.env"])
        assert gone.returncode == 1, node
    again = cpuaccel("stop", "last", cwd=proj, env=ENV, timeout=60)
    assert again.returncode == EXIT_OK and "had already ended (stopped)" in again.stdout


def test_detached_failing_rank_is_recorded_with_its_code(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    flags = tmp_path / "flags"
    flags.mkdir()
    proj = make_project(tmp_path, {"job.py": SLEEPER})
    run = cpuaccel_run(proj, "-i", inventory, "--nodes", "2", "--ppn", "2", "--detach",
                       "--env", "FAIL_RANK=3", "--json", "job.py", str(flags))  # fmt: skip
    assert run.code == EXIT_OK, run
    report = json.loads(run.stdout)
    run_id = report["run_id"]
    assert report["detached"] is True and report["state"] == "running"
    assert report["head"] == "node1" and report["ended_by"] == "detached"
    status = wait_until(
        lambda: (s := head_status(cluster, run_id)) and s["state"] != "running" and s, 60
    )
    assert status and status["state"] == "failed", status
    assert status["exit_code"] == 3 and status["ended_by"] == "rank 3"
    assert status["ranks"]["3"] == 3
    assert status["left"] == {}  # node2 answered the sweep through ssh.sh: nothing left
    assert (head_file(cluster, run_id, "rank-3.log") or "").splitlines()[-1] == (
        "[cpuaccel] exit code 3"
    )
    assert status["ended"] - status["started"] < 30  # the others (sleeping 60 s) were ended
    assert_nothing_left(cluster, run_id)
    done = cpuaccel("stop", run_id, cwd=proj, env=ENV, timeout=60)
    assert done.returncode == EXIT_OK and "had already ended (failed)" in done.stdout


def test_foreground_run_keeps_status_and_stop_ends_it(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    flags = tmp_path / "flags"
    flags.mkdir()
    proj = make_project(tmp_path, {"job.py": SLEEPER})
    job = BackgroundRun(proj, "-i", inventory, "--nodes", "2", "--ppn", "2", "job.py", str(flags))
    try:
        job.wait_for("started", 4)
        (folder,) = (proj / "runs").iterdir()
        status = json.loads((folder / "status.json").read_text())
        assert status["state"] == "running" and status["detached"] is False
        assert status["supervisor"]["pid"] == job.proc.pid
        stop = cpuaccel("stop", "last", cwd=proj, env=ENV, timeout=120)
        run = job.finish(timeout=60)
    finally:
        job.stop()
    assert stop.returncode == EXIT_OK, (stop.stdout, stop.stderr)
    assert run.code == 143, run
    status = json.loads((folder / "status.json").read_text())
    assert status["state"] == "stopped" and status["exit_code"] == 143, status
    assert_nothing_left(cluster, status["run_id"])
    # A run that completes says so, each rank with its code.
    quick = make_project(tmp_path, {"ok.py": "print('hi')\n"})
    done = cpuaccel_run(quick, "-i", inventory, "--nodes", "2", "--ppn", "2", "ok.py")
    assert done.code == EXIT_OK, done
    status = json.loads((done.run_dir / "status.json").read_text())
    assert status["state"] == "succeeded" and status["exit_code"] == 0
    assert status["ranks"] == {"0": 0, "1": 0, "2": 0, "3": 0} and status["ended_by"] == "completed"


def test_stop_after_the_supervisor_was_killed_sweeps_and_records_stopped(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    flags = tmp_path / "flags"
    flags.mkdir()
    proj = make_project(tmp_path, {"job.py": SLEEPER})
    run = cpuaccel_run(proj, "-i", inventory, "--nodes", "2", "--ppn", "2", "--detach",
                       "job.py", str(flags))  # fmt: skip
    assert run.code == EXIT_OK, run
    run_id = run.stdout.strip()
    assert wait_until(lambda: started_ranks(cluster, run_id) == {0, 1, 2, 3}), run_id
    pid = json.loads((proj / "runs" / run_id / "run.json").read_text())["supervisor"]["pid"]
    os.kill(pid, signal.SIGKILL)  # the supervisor gone: its status still says running
    assert head_status(cluster, run_id)["state"] == "running"  # type: ignore[index]
    stop = cpuaccel("stop", "last", cwd=proj, env=ENV, timeout=120)
    assert stop.returncode == EXIT_OK, (stop.stdout, stop.stderr)
    status = head_status(cluster, run_id)
    assert status is not None and status["state"] == "stopped" and status["ended"], status
    assert json.loads((proj / "runs" / run_id / "status.json").read_text())["state"] == "stopped"
    assert_nothing_left(cluster, run_id)


def test_a_lost_head_ends_the_job_on_the_other_nodes_in_the_foregrounds_words(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    """The head's link drops: its supervisor is lost with it, so node2's guard names the
    head as a foreground run does, ends the job there and keeps a record of why."""
    from tests.cluster.fixtures import DEAD_NODE_BOUND, link_down

    flags = tmp_path / "flags"
    flags.mkdir()
    sleeps_long = SLEEPER.replace("time.sleep(60)", "time.sleep(600)")
    proj = make_project(tmp_path, {"job.py": sleeps_long})
    run = cpuaccel_run(proj, "-i", inventory, "--nodes", "2", "--ppn", "2", "--detach",
                       "job.py", str(flags))  # fmt: skip
    assert run.code == EXIT_OK, run
    run_id = run.stdout.strip()
    assert wait_until(lambda: started_ranks(cluster, run_id) == {0, 1, 2, 3}), run_id
    guarded = f"{WORKDIR}/runs/{run_id}/guard.log"
    assert wait_until(lambda: "watching node1" in cluster.exec("node2", ["cat", guarded]).stdout)
    lost_record = f"{WORKDIR}/runs/{run_id}/lost.json"
    with link_down(cluster, "node1"):
        gone = wait_until(lambda: job_processes(cluster, "node2", run_id) == [],
                          timeout=DEAD_NODE_BOUND + 15)  # fmt: skip
        record = cluster.exec("node2", ["cat", lost_record])
    assert gone, job_processes(cluster, "node2", run_id)
    assert record.returncode == 0, record
    lost = json.loads(record.stdout)
    assert lost["lost"] == "node1"
    assert lost["said"] == (
        "lost the connection to node1 (no answer to keepalives): ending the job on the other nodes"
    )
    said = cluster.exec("node2", ["cat", f"{WORKDIR}/runs/{run_id}/guard.log"]).stdout
    assert lost["said"] in said
    # The head back: its supervisor ends the job there; stop finds nothing left.
    cpuaccel("stop", run_id, cwd=proj, env=ENV, timeout=120)
    assert_nothing_left(cluster, run_id)
