"""ps, logs, fetch and results brought home on real nodes.

2 nodes x 2 ranks, Intel MPI, node1 the head. A detached run is also stood in for by a
run folder made by hand on the head, with its status.json, and the controller's record
of it, as the contract between the two describes them.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import time
from pathlib import Path

import pytest

from cpuaccel.errors import EXIT_OK
from cpuaccel.testbed.cluster import WORKDIR, Cluster
from tests.cluster.fixtures import REPO, TWO_BY_TWO, master_port
from testsupport.command import clean_env, cpuaccel, start_cpuaccel
from testsupport.runs import BackgroundRun, cpuaccel_run, make_project

pytestmark = pytest.mark.cluster


def verb(project: Path, *args: str) -> tuple[int, str, str]:
    done = cpuaccel(*args, cwd=project, env=clean_env(), timeout=120)
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, done.stdout, done.stderr


def test_two_node_run_comes_home_and_report_draws_it(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    project = make_project(tmp_path, {"train.py": (REPO / "examples" / "train.py").read_text()})
    common = ("-i", inventory, *TWO_BY_TWO, "--master-port")
    small = ("--steps", "6", "--log-every", "2", "--width", "32", "--layers", "1", "--heads", "2")
    first = cpuaccel_run(project, *common, master_port(), "train.py", *small)
    assert first.code == 0, first
    run_id = first.record()["run_id"]
    home = project / "runs" / run_id
    # The head's metrics.jsonl, brought home at the end; the ranks' logs are the controller's.
    metrics = [json.loads(line) for line in (home / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 4, 6], metrics
    for rank in range(4):
        assert (home / f"rank-{rank}.log").stat().st_size > 0, rank
    head_ckpt = f"{WORKDIR}/runs/{run_id}/checkpoint.pt"
    size = int(cluster.exec("node1", ["stat", "-c", "%s", head_ckpt]).stdout)
    listing = json.loads((home / "checkpoints.json").read_text())["checkpoints"]
    assert [(c["name"], c["size"]) for c in listing] == [("checkpoint.pt", size)]
    assert not (home / "checkpoint.pt").exists()  # the large files only when asked
    code, _, err = verb(project, "report", f"runs/{run_id}")
    assert code == EXIT_OK and (home / "report.png").stat().st_size > 0, err
    code, out, _ = verb(project, "ps", "--json")
    row = json.loads(out)[0]
    assert (row["id"], row["state"], row["step"], row["nodes"], row["ppn"]) == (
        run_id, "succeeded", 6, 2, 2,
    )  # fmt: skip
    # fetch --checkpoints: the checkpoint itself, whole; then nothing new.
    code, _, err = verb(project, "fetch", run_id[:17], "-i", inventory, "--checkpoints")
    assert code == EXIT_OK and "checkpoint.pt" in err, err
    assert (home / "checkpoint.pt").stat().st_size == size
    code, _, err = verb(project, "fetch", "last", "-i", inventory)
    assert code == EXIT_OK and "nothing new" in err, err
    # --resume RUN_ID: rank 0 finds that run's checkpoint.pt beside its own run folder.
    more = cpuaccel_run(project, *common, master_port(), "train.py", *small[:1], "8", *small[2:],
                        "--resume", run_id)  # fmt: skip
    assert more.code == 0, more
    assert re.search(rf"resumed from \S*{run_id}/checkpoint.pt at step 6", more.stdout), more


SLOW = """\
import json, os, sys, time
rank = int(os.environ["RANK"])
for i in range(int(sys.argv[1])):
    print(f"line {i} of rank {rank}", flush=True)
    if rank == 0:
        with open(os.path.join(os.environ["CPUACCEL_RUN_DIR"], "metrics.jsonl"), "a") as f:
            f.write(json.dumps({"step": i + 1, "loss": 1.0 / (i + 1)}) + "\\n")
    time.sleep(0.5)
"""


def test_a_running_job_in_ps_logs_follow_and_metrics_come_while_it_runs(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    project = make_project(tmp_path, {"slow.py": SLOW})
    job = BackgroundRun(
        project, "-i", inventory, *TWO_BY_TWO, "--master-port", master_port(), "slow.py", "30"
    )
    try:
        job.wait_for("line 2 of rank 3", 1, timeout=90)
        code, out, _ = verb(project, "ps", "--json")
        assert [r["state"] for r in json.loads(out)] == ["running"], out
        # metrics.jsonl comes home while the job runs (every few seconds).
        copy = next((project / "runs").glob("*/")) / "metrics.jsonl"
        deadline = time.monotonic() + 20
        while not copy.exists() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert copy.exists() and job.proc.poll() is None, job.remaster_port()
        code, out, err = verb(project, "logs", "last", "-f", "--rank", "3")
        ended = job.finish()
    finally:
        job.stop()
    assert ended.code == 0, ended
    assert code == EXIT_OK and "ended: succeeded" in err, err
    assert out.splitlines() == [f"[rank 3 node2] line {i} of rank 3" for i in range(30)], out
    code, out, _ = verb(project, "logs", "last", "--host", "node1")
    ranks = {line.split("]")[0] for line in out.splitlines()}
    assert ranks == {"[rank 0 node1", "[rank 1 node1"}, out
    steps = [json.loads(line)["step"] for line in copy.read_text().splitlines()]
    assert steps == list(range(1, 31)), steps


def detached_record(cluster: Cluster, inventory: str, project: Path, run_id: str) -> str:
    """A detached run as part 1 leaves it: its folder on the head, the controller's record."""
    head_dir = f"{WORKDIR}/runs/{run_id}"
    status = {"run_id": run_id, "state": "running", "exit_code": None, "detached": True,
              "started": time.time(), "ended": None, "supervisor": None}  # fmt: skip
    script = (
        f"mkdir -p {head_dir} && cd {head_dir} && "
        'for r in 0 1 2 3; do echo "hello from $r" > rank-$r.log; done && '
        'echo \'{"step": 3, "loss": 0.5}\' > metrics.jsonl && '
        f"echo '{json.dumps(status)}' > status.json && echo x > checkpoint.pt"
    )
    assert cluster.exec("node1", ["sh", "-c", script]).returncode == 0
    home = project / "runs" / run_id
    home.mkdir(parents=True)
    record = {"run_id": run_id, "hosts": ["node1", "node2"], "ppn": 2, "world": 4,
              "started": time.time(), "detached": True, "head": "node1",
              "head_run_dir": head_dir, "inventory": str(Path(inventory).resolve())}  # fmt: skip
    (home / "run.json").write_text(json.dumps(record))
    return head_dir


def test_a_detached_run_is_read_from_its_head(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    project = make_project(tmp_path, {})
    run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{random.randrange(16**6):06x}"
    head_dir = detached_record(cluster, inventory, project, run_id)
    home = project / "runs" / run_id
    code, out, err = verb(project, "ps", "--json")  # the head from the inventory recorded
    assert code == EXIT_OK and json.loads(out)[0]["state"] == "running", err
    code, out, err = verb(project, "logs", run_id, "--rank", "2")
    assert out.splitlines() == ["[rank 2 node2] hello from 2"], err
    follow = start_cpuaccel(
        "logs", run_id[:17], "-f", "--rank", "1", cwd=project, env=clean_env(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        time.sleep(3)
        assert follow.poll() is None, follow.communicate()
        ended = {"state": "failed", "exit_code": 3, "ended": time.time(), "detached": True}
        script = (
            f"cd {head_dir} && echo 'last words' >> rank-1.log && "
            f"echo '{json.dumps(ended)}' > status.tmp && mv status.tmp status.json"
        )
        assert cluster.exec("node1", ["sh", "-c", script]).returncode == 0
        out, err = follow.communicate(timeout=30)
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.wait()
    assert follow.returncode == EXIT_OK, err
    assert out.splitlines() == ["[rank 1 node1] hello from 1", "[rank 1 node1] last words"]
    code, out, err = verb(project, "ps", "--json")
    row = json.loads(out)[0]
    assert (row["state"], row["exit_code"]) == ("failed", 3), err
    assert not (home / "status.json").exists()  # ps only looked
    code, _, err = verb(project, "fetch", "last")
    assert code == EXIT_OK, err
    assert json.loads((home / "status.json").read_text())["exit_code"] == 3
    assert (home / "rank-1.log").read_text() == "hello from 1\nlast words\n"
    assert (home / "metrics.jsonl").read_text() == '{"step": 3, "loss": 0.5}\n'
    assert not (home / "checkpoint.pt").exists()
    cluster.exec("node1", ["rm", "-rf", head_dir])


def test_a_detached_runs_hostile_logs_on_its_head_are_named_or_shown_safely(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    """A detached run's folder on its head (made by hand there, as the supervisor's
    contract describes it): rank 0's log a FIFO, rank 1's a link to a private file, rank
    2's full of escapes, rank 3's plain. ``logs`` reads them over ssh from the head."""
    run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{random.randrange(16**6):06x}"
    head_dir = f"{WORKDIR}/runs/{run_id}"
    status = {"run_id": run_id, "state": "running", "exit_code": None, "detached": True,
              "started": time.time(), "ended": None, "supervisor": None}  # fmt: skip
    script = (
        f"mkdir -p {head_dir} && cd {head_dir} && mkfifo rank-0.log && "
        "echo 'PRIVATE KEY MATERIAL' > ../private.txt && ln -s ../private.txt rank-1.log && "
        r"printf 'clip \033]52;c;SGVsbG8=\007 end\nFAILED\r\033[1A\033[2Kall PASSED\n' "
        "> rank-2.log && echo 'rank three' > rank-3.log && "
        f"echo '{json.dumps(status)}' > status.json"
    )
    assert cluster.exec("node1", ["sh", "-c", script]).returncode == 0
    try:
        project = tmp_path / "project"
        home = project / "runs" / run_id
        home.mkdir(parents=True)
        record = {
            "run_id": run_id, "hosts": ["node1", "node2"], "ppn": 2, "world": 4,
            "started": time.time(), "detached": True, "head": "node1",
            "head_run_dir": head_dir, "inventory": str(Path(inventory).resolve()),
        }  # fmt: skip
        (home / "run.json").write_text(json.dumps(record))
        done = cpuaccel("logs", run_id, cwd=project, env=clean_env(), timeout=120)
    finally:
        cluster.exec("node1", ["rm", "-rf", head_dir, f"{WORKDIR}/runs/private.txt"])
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "PRIVATE" not in done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        "[rank 2 node2] clip \\x1b]52;c;SGVsbG8=\\x07 end",
        "[rank 2 node2] FAILED\\x0d\\x1b[1A\\x1b[2Kall PASSED",
        "[rank 3 node2] rank three",
    ], done.stdout
    assert done.stderr.splitlines() == [
        f"warning: rank {r}: {head_dir}/rank-{r}.log on node1: not a regular file, not a "
        "log: not read"
        for r in (0, 1)
    ], done.stderr


TICKER = """\
import os, time
rank = int(os.environ["RANK"])
for i in range(200):
    print(f"tick {i} of rank {rank}", flush=True)
    time.sleep(0.3)
"""


def test_a_real_detached_run_in_ps_logs_follow_stop_and_fetch(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    project = make_project(tmp_path, {"tick.py": TICKER})
    started = cpuaccel_run(
        project, "-i", inventory, *TWO_BY_TWO, "--master-port", master_port(), "--detach", "tick.py"
    )
    assert started.code == EXIT_OK, started
    run_id = started.stdout.strip().splitlines()[-1]
    home = project / "runs" / run_id
    follow = start_cpuaccel(
        "logs", "last", "-f", "--rank", "1", cwd=project, env=clean_env(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        code, out, err = verb(project, "ps", "--json")  # asked of the head
        assert code == EXIT_OK and json.loads(out)[0]["state"] == "running", err
        time.sleep(4)
        assert follow.poll() is None
        code, _, err = verb(project, "stop", run_id)
        assert code == EXIT_OK, err
        out, err = follow.communicate(timeout=60)
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.wait()
    assert follow.returncode == EXIT_OK and "ended: stopped" in err, err
    # Rank 1 alone, from the head, while it ran; then how the stop ended it.
    lines = [line for line in out.splitlines() if "[cpuaccel]" not in line]
    assert len(lines) >= 5 and all(line.startswith("[rank 1 node1] ") for line in out.splitlines())
    assert lines == [f"[rank 1 node1] tick {i} of rank 1" for i in range(len(lines))], out
    code, out, _ = verb(project, "ps", "--json")
    assert json.loads(out)[0]["state"] == "stopped", out
    code, _, err = verb(project, "fetch", "last")
    assert code == EXIT_OK, err
    for rank in range(4):
        assert f"tick 0 of rank {rank}" in (home / f"rank-{rank}.log").read_text(), rank
    assert json.loads((home / "status.json").read_text())["state"] == "stopped"
    code, out, _ = verb(project, "logs", "last", "--rank", "3")
    assert out.splitlines()[0] == "[rank 3 node2] tick 0 of rank 3", out
