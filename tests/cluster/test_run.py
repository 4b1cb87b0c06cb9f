"""`cpuaccel run` against real nodes (namespaces with their own sshd) with Intel MPI
(and, in one test each, Debian's MPICH and Open MPI).

Every test runs `cpuaccel run` as a user does: a subprocess whose working folder is a
project folder of its own (synced to /srv/cpuaccel-node/work/<folder> on the nodes),
holding a tiny script. Scripts import nothing heavy, to keep each job about a second.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import uuid
from pathlib import Path

import pytest

from cpuaccel.errors import EXIT_NODE_FAILED
from cpuaccel.testbed.cluster import WORKDIR, Cluster
from tests.cluster.fixtures import NODES, SUM_SCRIPT, assert_nothing_left, master_port
from testsupport.runs import BackgroundRun, cpuaccel_run, make_project

pytestmark = pytest.mark.cluster

# Prints "started", then: RANK 3 leaves with code 3 once all six ranks have started
# (each leaves a flag file in a folder every node shares); the others sleep.
SLEEPER = """\
import os, pathlib, sys, time
rank = int(os.environ["RANK"])
flags = pathlib.Path(sys.argv[1])
(flags / f"started-{rank}").touch()
print("started", flush=True)
if str(rank) == os.environ.get("FAIL_RANK"):
    deadline = time.monotonic() + 30
    while len(list(flags.glob("started-*"))) < 6 and time.monotonic() < deadline:
        time.sleep(0.05)
    if os.environ["FAIL_HOW"] == "exit":
        sys.exit(3)
    os.kill(os.getpid(), 9)
time.sleep(60)
"""


# ---------------------------------------------------------------- ranks start


def test_three_nodes_two_ranks_each(cluster: Cluster, inventory: str, tmp_path: Path) -> None:
    script = (
        "import json, os, socket\n"
        "keys = ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'LOCAL_WORLD_SIZE', 'MASTER_ADDR')\n"
        "print(json.dumps({**{k: os.environ[k] for k in keys}, 'host': socket.gethostname()}))\n"
    )
    proj = make_project(tmp_path, {"script.py": script})
    run = cpuaccel_run(proj, "-i", inventory, "--nodes", "3", "--ppn", "2", "script.py")
    assert run.code == 0, run
    ranks = {r: (host, json.loads(text)) for r, (host, text) in run.ranks().items()}
    assert sorted(ranks) == [0, 1, 2, 3, 4, 5], run
    for rank, (label_host, seen) in ranks.items():
        expected_node = NODES[rank // 2]  # -ppn 2: ranks 0,1 on node1, 2,3 on node2, ...
        assert int(seen["RANK"]) == rank
        assert seen["WORLD_SIZE"] == "6"
        assert seen["LOCAL_RANK"] == str(rank % 2)
        assert seen["LOCAL_WORLD_SIZE"] == "2"
        assert seen["MASTER_ADDR"] == "node1"
        assert label_host == seen["host"] == expected_node
    for node in NODES:
        local = {seen["LOCAL_RANK"] for host, seen in ranks.values() if host == node}
        assert local == {"0", "1"}, node
    assert "completed: 6 rank(s) on 3 node(s)" in run.stderr
    # The run directory: one log per rank, the record with the exit code, the command.
    run_dir = run.run_dir
    assert run_dir.parent == proj / "runs"
    for rank, (_, seen) in ranks.items():
        assert json.loads((run_dir / f"rank-{rank}.log").read_text()) == seen
    record = run.record()
    assert record["exit_code"] == 0 and record["reason"] == "completed"
    assert record["world"] == 6 and record["ppn"] == 2 and record["hosts"] == list(NODES)
    assert record["launcher"] == "impi"
    hostfile = f"{WORKDIR}/runs/{record['run_id']}/hostfile"
    assert record["command"][1:7] == ["-f", hostfile, "-n", "6", "-ppn", "2"]
    assert (run_dir / "command.txt").is_file() and (run_dir / "hostfile").read_text().split() == [
        *NODES
    ]
    assert_nothing_left(cluster, record["run_id"])


def test_arguments_and_env_values_reach_the_script_literally(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    marker = f"/tmp/cpxl-run-marker-{uuid.uuid4().hex}"
    script = "import json, os, sys\nprint(json.dumps([sys.argv[1:], os.environ['WEIRD']]))\n"
    proj = make_project(tmp_path, {"script.py": script})
    args = [
        "--name", "a b", f"$(touch {marker})", f"`touch {marker}`", f"; touch {marker}",
        "it's \"q\"", "*", "$HOME", "", "é ü", "x\ty", "l1\nl2", "\\", "--", "-n", "~",
    ]  # fmt: skip
    weird = f"$(touch {marker}) 'q' \"d\" $HOME"
    run = cpuaccel_run(
        proj, "-i", inventory, "--nodes", "3", "--ppn", "1", "--env", f"WEIRD={weird}",
        "script.py", *args,
    )  # fmt: skip
    assert run.code == 0, run
    ranks = run.ranks()
    assert sorted(ranks) == [0, 1, 2]
    for _, text in ranks.values():
        assert json.loads(text) == [args, weird]
    assert not Path(marker).exists()
    for node in NODES:
        assert cluster.exec(node, ["test", "-e", marker]).returncode != 0, node


# ---------------------------------------------------------------- failures end the job


@pytest.mark.parametrize(
    ("how", "code", "failing"),
    [("exit", 3, (3, "node2")), ("kill", 128 + signal.SIGKILL, (3, "node2"))],
    ids=["exit-3", "killed-by-sigkill"],
)
def test_a_failing_rank_ends_the_job_everywhere(
    cluster: Cluster,
    inventory: str,
    tmp_path: Path,
    how: str,
    code: int,
    failing: tuple[int, str],
) -> None:
    flags = tmp_path / "flags"
    flags.mkdir()
    proj = make_project(tmp_path, {"job.py": SLEEPER})
    run = cpuaccel_run(
        proj, "-i", inventory, "--nodes", "3", "--ppn", "2",
        "--env", "FAIL_RANK=3", "--env", f"FAIL_HOW={how}", "job.py", str(flags),
    )  # fmt: skip
    assert run.code == code, run
    # The others would sleep 60 s: they were ended, not waited for.
    assert run.seconds < 20, run
    assert len(list(flags.glob("started-*"))) == 6
    assert run.stdout.count("started") == 6, run
    rank, host = failing
    assert f"first failing rank {rank} on {host} (exit code {code})" in run.stderr
    record = run.record()
    assert record["exit_code"] == code and record["reason"] == "failed"
    assert record["first_failure"] == {"rank": rank, "host": host, "code": code, "cause": None}
    logs = sorted(p.name for p in run.run_dir.glob("rank-*.log"))
    assert logs == [f"rank-{r}.log" for r in range(6)]
    failing_log = (run.run_dir / f"rank-{rank}.log").read_text().splitlines()
    assert failing_log[-1] == f"[cpuaccel] exit code {code}"
    if how == "kill":
        assert "[cpuaccel] killed by SIGKILL" in failing_log
    assert_nothing_left(cluster, record["run_id"])


@pytest.mark.parametrize(
    ("signum", "to_group", "code", "reason"),
    [
        (signal.SIGINT, False, 130, "interrupted"),
        (signal.SIGINT, True, 130, "interrupted"),  # Ctrl-C at a terminal: the whole group
        (signal.SIGTERM, False, 143, "terminated"),
    ],
    ids=["sigint", "ctrl-c-to-the-group", "sigterm"],
)
def test_a_signal_to_cpuaccel_ends_the_job_everywhere(
    cluster: Cluster,
    inventory: str,
    tmp_path: Path,
    signum: int,
    to_group: bool,
    code: int,
    reason: str,
) -> None:
    flags = tmp_path / "flags"
    flags.mkdir()
    proj = make_project(tmp_path, {"job.py": SLEEPER})
    job = BackgroundRun(
        proj, "-i", inventory, "--nodes", "3", "--ppn", "2", "job.py", str(flags),
        new_session=to_group,
    )  # fmt: skip
    try:
        job.wait_for("started", 6)
        if to_group:
            os.killpg(job.proc.pid, signum)
        else:
            job.proc.send_signal(signum)
        run = job.finish(timeout=30)
    finally:
        if job.proc.poll() is None:
            job.proc.kill()
            job.proc.wait()
    assert run.code == code, run
    assert run.seconds < 15, run
    record = run.record()
    assert record["reason"] == reason and record["exit_code"] == code
    # Ranks that cpuaccel itself ended are not "failing ranks".
    assert record["first_failure"] is None
    assert "first failing rank" not in run.stderr
    assert_nothing_left(cluster, record["run_id"])


def test_timeout_ends_the_job_everywhere(cluster: Cluster, inventory: str, tmp_path: Path) -> None:
    flags = tmp_path / "flags"
    flags.mkdir()
    proj = make_project(tmp_path, {"job.py": SLEEPER})
    run = cpuaccel_run(
        proj, "-i", inventory, "--nodes", "3", "--ppn", "2", "--timeout", "3",
        "job.py", str(flags),
    )  # fmt: skip
    assert run.code == 124, run
    assert run.seconds < 20, run
    assert run.stdout.count("started") == 6, run
    record = run.record()
    assert record["reason"] == "timeout" and record["exit_code"] == 124
    assert 3 <= record["seconds"] < 15
    assert "timeout: 6 rank(s) on 3 node(s)" in run.stderr
    assert_nothing_left(cluster, record["run_id"])


def test_real_mpi_program_runs_to_a_clean_end(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    """mpi4py finalizes MPI at interpreter exit: a rank must end like `python SCRIPT`."""
    script = (
        "from mpi4py import MPI\n"
        "comm = MPI.COMM_WORLD\n"
        "print(comm.Get_rank(), comm.Get_size(), comm.allreduce(comm.Get_rank()))\n"
    )
    proj = make_project(tmp_path, {"mpi.py": script})
    run = cpuaccel_run(proj, "-i", inventory, "--nodes", "3", "--ppn", "2", "mpi.py")
    assert run.code == 0, run
    assert {r: text for r, (_, text) in run.ranks().items()} == {r: f"{r} 6 15" for r in range(6)}
    assert "BAD TERMINATION" not in run.stderr
    assert_nothing_left(cluster, run.record()["run_id"])


# ---------------------------------------------------------------- preflight


def test_stale_script_on_one_node_is_synced_or_reported(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    version = uuid.uuid4().hex
    proj = make_project(tmp_path, {"script.py": f"print('version {version}')\n"})
    common = ("-i", inventory, "--nodes", "3", "--ppn", "1", "script.py")
    first = cpuaccel_run(proj, *common)
    assert first.code == 0, first
    remote = f"{WORKDIR}/{proj.name}/script.py"
    changed = cluster.exec("node2", ["sh", "-c", f"echo \"print('STALE')\" > {remote}"])
    assert changed.returncode == 0, changed.stderr
    assert cluster.exec("node1", ["cat", remote]).stdout == f"print('version {version}')\n"
    runs_before = sorted((proj / "runs").iterdir())
    node_runs = {n: cluster.exec(n, ["ls", "-A", f"{WORKDIR}/runs"]).stdout for n in NODES}

    refused = cpuaccel_run(proj, "--no-sync", *common)
    assert refused.code == EXIT_NODE_FAILED, refused
    problems = [line for line in refused.stderr.splitlines() if line.startswith("preflight")]
    assert len(problems) == 1, refused
    assert problems[0].startswith("preflight node2: holds a different copy of the project")
    assert "no job was started" in refused.stderr
    assert refused.stdout == ""
    assert sorted((proj / "runs").iterdir()) == runs_before  # no run dir, no rank logs
    assert cluster.exec("node2", ["cat", remote]).stdout == "print('STALE')\n"
    # node1 and node3 passed, their preflight programs kept open for the run's files:
    # a failure on node2 ends them all by EOF, no run folder written on any node.
    for node in NODES:
        assert cluster.exec(node, ["ls", "-A", f"{WORKDIR}/runs"]).stdout == node_runs[node]
        assert cluster.wait_idle(node, timeout=10) == [], node

    synced = cpuaccel_run(proj, *common)
    assert synced.code == 0, synced
    assert "project differs on node2: syncing it first" in synced.stderr.splitlines()
    texts = sorted(text for _, text in synced.ranks().values())
    assert texts == [f"version {version}"] * 3, synced
    assert cluster.exec("node2", ["cat", remote]).stdout == f"print('version {version}')\n"
    # In sync now: the next run syncs nothing.
    again = cpuaccel_run(proj, *common)
    assert again.code == 0 and "project differs" not in again.stderr, again


def test_node_that_cannot_resolve_the_head_runs_by_addresses(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    # /etc/hosts inside a node is a bind mount of one file shared by all nodes: hide
    # node1 from node3 alone by mounting another file over it, in node3's namespace.
    shared = cluster.hosts_path.read_text().splitlines()
    alt = tmp_path / "hosts-without-node1"
    alt.write_text("".join(f"{line}\n" for line in shared if not line.endswith(" node1")))
    proj = make_project(tmp_path, {"script.py": SUM_SCRIPT})
    mounted = cluster.exec("node3", ["mount", "--bind", str(alt), "/etc/hosts"])
    assert mounted.returncode == 0, mounted.stderr
    try:
        assert cluster.exec("node3", ["getent", "hosts", "node1"]).returncode != 0
        assert cluster.exec("node2", ["getent", "hosts", "node1"]).returncode == 0
        job = ("--nodes", "3", "--ppn", "1", "--master-port", master_port())
        run = cpuaccel_run(proj, "-i", inventory, *job, "script.py")
    finally:
        unmounted = cluster.exec("node3", ["umount", "/etc/hosts"])
    assert unmounted.returncode == 0, unmounted.stderr
    assert cluster.exec("node3", ["getent", "hosts", "node1"]).returncode == 0
    # The names do not resolve alike on every node: the job names nodes by address.
    assert run.code == 0, run
    assert {text for _, text in run.ranks().values()} == {"sum 6.0"}, run
    addresses = [cluster.node(name).address for name in ("node1", "node2", "node3")]
    assert (run.run_dir / "hostfile").read_text().split() == addresses
    assert f"export MASTER_ADDR={addresses[0]}" in (run.run_dir / "env.sh").read_text()


# ---------------------------------------------------------------- secrets


def test_secret_env_reaches_ranks_and_no_record(cluster: Cluster, tmp_path: Path) -> None:
    secret = f"s3cr3t-value-{uuid.uuid4().hex[:8]}"
    inventory = cluster.write_inventory(
        tmp_path / "secret.yaml", cpuaccel_secret_env={"API_TOKEN": secret}
    )
    script = (
        "import hashlib, os\nprint(hashlib.sha256(os.environ['API_TOKEN'].encode()).hexdigest())\n"
    )
    proj = make_project(tmp_path, {"script.py": script})
    run = cpuaccel_run(proj, "-i", str(inventory), "--nodes", "3", "--ppn", "2", "script.py")
    assert run.code == 0, run
    digest = hashlib.sha256(secret.encode()).hexdigest()
    assert sorted(run.ranks()) == list(range(6))
    assert {text for _, text in run.ranks().values()} == {digest}
    assert secret not in run.stdout + run.stderr
    record = run.record()
    assert record["secret_names"] == ["API_TOKEN"] and "API_TOKEN" not in record["env_names"]
    files = [p for p in run.run_dir.rglob("*") if p.is_file()]
    assert {"run.json", "env.sh", "launch.sh", "rank-0.log"} <= {p.name for p in files}
    for path in files:
        assert secret.encode() not in path.read_bytes(), path
    assert not (run.run_dir / "secret.env").exists()

    dry = cpuaccel_run(proj, "-i", str(inventory), "--ppn", "2", "--dry-run", "script.py")
    assert dry.code == 0, dry
    assert secret not in dry.stdout + dry.stderr
    assert "API_TOKEN" in dry.stdout

    # The run folders are the user's alone, and no node keeps the secrets after the job
    # (the sweep removes secret.env; the ranks read it while the job ran: see above).
    assert run.run_dir.stat().st_mode & 0o777 == 0o700
    node_run = f"{WORKDIR}/runs/{record['run_id']}"
    for node in NODES:
        stat = cluster.exec(node, ["stat", "-c", "%a %U", node_run])
        assert stat.stdout.strip() == "700 root", (node, stat.stderr)
        left = cluster.exec(node, ["test", "-e", f"{node_run}/secret.env"])
        assert left.returncode == 1, node
        env_sh = cluster.exec(node, ["cat", f"{node_run}/env.sh"])
        assert env_sh.returncode == 0 and "API_TOKEN" not in env_sh.stdout
        assert secret not in env_sh.stdout


@pytest.mark.parametrize(
    ("launcher", "mpirun"), [("mpich", "mpirun.mpich"), ("openmpi", "mpirun.openmpi")]
)
def test_mpich_and_open_mpi_place_ranks_across_nodes(
    cluster: Cluster, inventory: str, tmp_path: Path, launcher: str, mpirun: str
) -> None:
    if not Path("/usr/bin", mpirun).exists():
        message = f"/usr/bin/{mpirun} is not installed (.ci/run installs mpich and openmpi-bin)"
        if os.environ.get("CPUACCEL_REQUIRE_CLUSTER") == "1":
            pytest.fail(message)
        pytest.skip(message)
    script = (
        "import json, os, socket\n"
        "keys = ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'MASTER_ADDR')\n"
        "print(json.dumps({**{k: os.environ[k] for k in keys}, 'host': socket.gethostname()}))\n"
    )
    proj = make_project(tmp_path, {"script.py": script})
    args = ("-i", inventory, "--nodes", "2", "--ppn", "2", "--launcher", launcher, "script.py")
    run = cpuaccel_run(proj, *args)
    assert run.code == 0, run
    ranks = {r: (host, json.loads(text)) for r, (host, text) in run.ranks().items()}
    assert sorted(ranks) == [0, 1, 2, 3], run
    for rank, (label_host, seen) in ranks.items():
        assert (int(seen["RANK"]), seen["WORLD_SIZE"]) == (rank, "4")
        assert seen["LOCAL_RANK"] == str(rank % 2) and seen["MASTER_ADDR"] == "node1"
        assert label_host == seen["host"] == NODES[rank // 2]
    record = run.record()
    assert record["launcher"] == launcher and record["command"][0] == f"/usr/bin/{mpirun}"
    assert_nothing_left(cluster, record["run_id"])
