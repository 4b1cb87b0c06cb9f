"""`cpuaccel run`'s options as users of other launchers type them, on real nodes:
accelerate launch's spellings run where they say and ``--env NAME`` brings this shell's
value to every rank (a credential's only through secret.env); ``-m MODULE`` and
``--no-python`` run on every rank with the rank's environment, ``--launcher-args`` reach
Intel MPI's mpirun, ``--json`` prints one object with each rank's exit code, and the exit
codes tell a script's own code (argparse's 2) from cpuaccel's refusals (64, 69).

Ranks import cpuaccel from the tree under test (TREE), so that the worker these tests
exercise is the one beside them."""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from pathlib import Path

import pytest

from cpuaccel.errors import EXIT_NODE_FAILED, EXIT_USAGE
from cpuaccel.testbed.cluster import WORKDIR, Cluster
from tests.cluster.fixtures import NODES, TREE, assert_nothing_left
from testsupport.command import clean_env, cpuaccel
from testsupport.runs import Run, cpuaccel_run, make_project

pytestmark = pytest.mark.cluster


def test_accelerate_spellings_and_env_names_reach_every_rank(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    token = f"hf_{uuid.uuid4().hex}"
    script = (
        "import hashlib, json, os, socket\n"
        "keys = ('RANK', 'WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT', 'PLAIN_SETTING')\n"
        "seen = {k: os.environ[k] for k in keys}\n"
        "seen['token'] = hashlib.sha256(os.environ['HF_TOKEN'].encode()).hexdigest()\n"
        "print(json.dumps({**seen, 'host': socket.gethostname()}))\n"
    )
    proj = make_project(tmp_path, {"train.py": script})
    env = clean_env(HF_TOKEN=token, PLAIN_SETTING="plain value", HF_HOME=str(tmp_path / "hf"))
    started = time.monotonic()
    proc = cpuaccel(
        "run", "-i", inventory, "--num_processes", "4", "--num_machines", "2",
        "--main_process_ip", "node3", "--main_process_port", "29631",
        "--env", "HF_TOKEN", "--env", "PLAIN_SETTING", "train.py",
        cwd=proj, env=env, timeout=240,
    )  # fmt: skip
    run = Run(proc, time.monotonic() - started)
    assert run.code == 0, run
    ranks = {r: (host, json.loads(text)) for r, (host, text) in run.ranks().items()}
    assert sorted(ranks) == [0, 1, 2, 3], run
    digest = hashlib.sha256(token.encode()).hexdigest()
    for rank, (host, seen) in ranks.items():
        # --main_process_ip node3 is the head: ranks 0 and 1 there, 2 and 3 on node1.
        assert host == seen["host"] == ("node3" if rank < 2 else "node1"), ranks
        assert seen["WORLD_SIZE"] == "4" and seen["MASTER_ADDR"] == "node3"
        assert seen["MASTER_PORT"] == "29631"
        assert seen["PLAIN_SETTING"] == "plain value" and seen["token"] == digest
    assert token not in run.stdout + run.stderr
    record = run.record()
    assert record["secret_names"] == ["HF_TOKEN"] and "HF_TOKEN" not in record["env_names"]
    assert "PLAIN_SETTING" in record["env_names"]
    for path in run.run_dir.rglob("*"):
        if path.is_file():
            assert token.encode() not in path.read_bytes(), path


REPORT = (
    "import json, os, socket, sys\n"
    "keys = ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'MASTER_ADDR')\n"
    "print(json.dumps({'name': __name__, 'argv': sys.argv, 'host': socket.gethostname(),\n"
    "                  **{k: os.environ[k] for k in keys}}))\n"
)
PROGRAM = '#!/bin/sh\necho "$RANK $WORLD_SIZE $LOCAL_RANK $MASTER_ADDR $(uname -n) $*"\n'


def placed_as_3x2(ranks: dict[int, tuple[str, dict[str, str]]]) -> None:
    """Six ranks, two a node, each with its torch.distributed variables."""
    assert sorted(ranks) == list(range(6))
    for rank, (label_host, seen) in ranks.items():
        assert (seen["RANK"], seen["WORLD_SIZE"]) == (str(rank), "6")
        assert seen["LOCAL_RANK"] == str(rank % 2) and seen["MASTER_ADDR"] == "node1"
        assert label_host == seen["host"] == NODES[rank // 2]


def test_dash_m_runs_the_module_from_the_synced_project(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    proj = make_project(tmp_path, {})
    (proj / "pkg").mkdir()
    (proj / "pkg" / "__init__.py").write_text("")
    (proj / "pkg" / "train.py").write_text(REPORT)
    run = cpuaccel_run(
        proj, "-i", inventory, "--nodes", "3", "--ppn", "2", *TREE,
        "-m", "pkg.train", "--lr", "0.1", "-m", "x",
    )  # fmt: skip
    assert run.code == 0, run
    ranks = {r: (host, json.loads(text)) for r, (host, text) in run.ranks().items()}
    placed_as_3x2(ranks)
    remote = f"{WORKDIR}/{proj.name}/pkg/train.py"  # the synced copy, as python -m sets it
    for _, seen in ranks.values():
        assert seen["name"] == "__main__"
        assert seen["argv"] == [remote, "--lr", "0.1", "-m", "x"]
    assert_nothing_left(cluster, run.record()["run_id"])


def test_no_python_runs_a_program_as_each_rank(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    proj = make_project(tmp_path, {"train.sh": PROGRAM})
    (proj / "train.sh").chmod(0o755)
    run = cpuaccel_run(
        proj, "-i", inventory, "--nodes", "3", "--ppn", "2", *TREE,
        "--no-python", "train.sh", "a b",
    )  # fmt: skip
    assert run.code == 0, run
    seen = {r: text.split(" ") for r, (_, text) in run.ranks().items()}
    assert sorted(seen) == list(range(6))
    for rank, words in seen.items():
        node = NODES[rank // 2]
        assert words == [str(rank), "6", str(rank % 2), "node1", node, "a", "b"], run
    # A command of the nodes' PATH, and its failure code as the run's.
    failed = cpuaccel_run(
        proj, "-i", inventory, "--nodes", "2", "--ppn", "1", *TREE, "--no-python", "false"
    )
    assert failed.code == 1, failed
    assert "first failing rank" in failed.stderr and "(exit code 1)" in failed.stderr


def test_launcher_args_reach_intel_mpi(cluster: Cluster, inventory: str, tmp_path: Path) -> None:
    script = "import os\nprint(os.environ.get('CPX_MARK'))\n"
    proj = make_project(tmp_path, {"script.py": script})
    run = cpuaccel_run(
        proj, "-i", inventory, "--nodes", "2", "--ppn", "1",
        "--launcher-args", "-genv CPX_MARK 'two words'", "script.py",
    )  # fmt: skip
    assert run.code == 0, run
    assert {text for _, text in run.ranks().values()} == {"two words"}
    command = run.record()["command"]
    assert command[command.index("-genv") : command.index("-genv") + 3] == [
        "-genv", "CPX_MARK", "two words",
    ]  # fmt: skip


def test_json_is_one_object_on_stdout_with_each_ranks_code(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    """As argparse does on a bad argument: one rank exits 2, and so does the run (item 7)."""
    script = (
        "import os, sys, time\nprint('rank', os.environ['RANK'], flush=True)\n"
        "if os.environ['RANK'] == '3':\n    time.sleep(1)\n    sys.exit(2)\n"
        "time.sleep(60)\n"
    )
    proj = make_project(tmp_path, {"script.py": script})
    common = ("-i", inventory, "--nodes", "3", "--ppn", "2", *TREE, "--json")
    run = cpuaccel_run(proj, *common, "script.py")
    assert run.code == 2, run
    data = json.loads(run.stdout)  # stdout is exactly one JSON object
    assert data["exit_code"] == 2 and data["ended_by"] == "failed"
    assert data["hosts"] == list(NODES) and data["ppn"] == 2 and data["world"] == 6
    assert data["folder"] == str(proj / "runs" / data["run_id"])
    assert data["ranks"]["3"] == 2 and sorted(data["ranks"], key=int) == [str(r) for r in range(6)]
    # The others were ended: SIGTERM's code, as each rank's worker saw it, or null
    # where MPI killed a rank's worker too before it could say.
    others = {r: data["ranks"][str(r)] for r in (0, 1, 2, 4, 5)}
    assert set(others.values()) <= {143, None} and 143 in others.values(), data
    assert 0 < data["seconds"] < 30 and data["error"] is None
    # The labelled output went to stderr, with the summary.
    labelled = [line for line in run.stderr.splitlines() if line.startswith("[rank ")]
    assert sorted(labelled) == sorted(f"[rank {r} {NODES[r // 2]}] rank {r}" for r in range(6))
    assert_nothing_left(cluster, data["run_id"])

    quick = make_project(tmp_path, {"ok.py": "print('ok')\n"})
    ok = cpuaccel_run(quick, *common, "ok.py")
    assert ok.code == 0, ok
    data = json.loads(ok.stdout)
    assert data["ended_by"] == "completed" and data["ranks"] == {str(r): 0 for r in range(6)}


def test_cpuaccels_own_refusals_are_64_and_69(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    proj = make_project(tmp_path, {"script.py": "print('ran')\n"})
    bad_flag = cpuaccel_run(proj, "-i", inventory, "--ppn", "0", "--json", "script.py")
    assert bad_flag.code == EXIT_USAGE, bad_flag
    assert json.loads(bad_flag.stdout)["exit_code"] == EXIT_USAGE
    assert not (proj / "runs").exists()
    # A node that cannot be reached fails preflight: 69, and --json says so.
    with cluster.sshd_stopped("node2"):
        down = cpuaccel_run(
            proj, "-i", inventory, "--nodes", "3", "--ppn", "1", "--json", "script.py"
        )
    assert down.code == EXIT_NODE_FAILED, down
    data = json.loads(down.stdout)
    assert data["exit_code"] == EXIT_NODE_FAILED and data["ended_by"] == "preflight"
    assert "no job was started" in data["error"] and data["ranks"] == {}
    assert any(line.startswith("preflight node2") for line in down.stderr.splitlines()), down
    assert not (proj / "runs").exists()


def test_an_unreachable_node_is_said_once_with_the_limit_that_leaves_it_out(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    proj = make_project(tmp_path, {"script.py": "print('ran')\n"})
    with cluster.sshd_stopped("node2"):
        down = cpuaccel_run(proj, "-i", inventory, "--nodes", "3", "--ppn", "1", "script.py")
        assert down.code == EXIT_NODE_FAILED, down
        output = (down.stdout + down.stderr).splitlines()
        said = [line for line in output if "node2" in line and "connect" in line]
        assert len(said) == 1, down  # one line says it, no probe's or summary's echo
        fixes = [line for line in output if "--limit '!node2'" in line]
        assert len(fixes) == 1 and "fix:" in fixes[0], down
        assert "Traceback" not in down.stderr
        # The fix, as given, runs without it.
        left_out = cpuaccel_run(proj, "-i", inventory, "--limit", "!node2", "script.py")
    assert left_out.code == 0, left_out
    ranks = [line for line in left_out.stdout.splitlines() if line.endswith("] ran")]
    assert ranks and not any(" node2]" in line for line in ranks), left_out
