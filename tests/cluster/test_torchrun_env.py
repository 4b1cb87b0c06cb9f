"""torchrun's whole environment on real nodes, and each host's own cpuaccel_env.

A script written the strict torchrun way reads each variable with ``os.environ[...]``
(a KeyError if one is missing) at 2 nodes x 2 ranks, under --max-restarts, in the
foreground and detached: attempt 0 fails once every rank has said what it sees, attempt
1 succeeds. A rank's error that torch's @record wrote is the run's root cause. A host's own
cpuaccel_env value is seen by that host's ranks, and only by them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cpuaccel.testbed.cluster import Cluster
from tests.cluster.fixtures import TREE, TWO_BY_TWO, master_port
from tests.cluster.test_detach_restart import ended
from testsupport.command import cpuaccel
from testsupport.runs import ENV, Run, cpuaccel_run, make_project

pytestmark = pytest.mark.cluster

NAMES = (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
    "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR",
    "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_ERROR_FILE",
)  # fmt: skip

# Each rank writes what it sees to a folder the nodes share; in attempt 0, rank 0 waits
# (bounded) for all four, then fails, so that the run restarts once.
STRICT = f"""\
import json, os, pathlib, socket, sys, time
seen = {{name: os.environ[name] for name in {NAMES!r}}}
seen["host"] = socket.gethostname()
seen["TAG"] = os.environ.get("TAG")
attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
out = pathlib.Path(sys.argv[1])
path = out / f"{{attempt}}-{{os.environ['RANK']}}.json"
path.with_suffix(".tmp").write_text(json.dumps(seen))
path.with_suffix(".tmp").rename(path)
if attempt == "0" and os.environ["RANK"] == "0":
    deadline = time.monotonic() + 60
    while len(list(out.glob("0-*.json"))) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    sys.exit(3)
"""


def seen(folder: Path, attempt: int) -> dict[int, dict[str, str]]:
    return {
        int(p.stem.split("-")[1]): json.loads(p.read_text())
        for p in folder.glob(f"{attempt}-*.json")
    }


@pytest.mark.parametrize("detach", [False, True], ids=["foreground", "detached"])
def test_a_strict_torchrun_script_sees_every_variable_on_every_rank(
    cluster: Cluster, inventory: str, tmp_path: Path, detach: bool
) -> None:
    out = tmp_path / "seen"
    out.mkdir()
    out.chmod(0o777)
    proj = make_project(tmp_path, {"strict.py": STRICT})
    port = master_port()
    run = cpuaccel_run(
        proj, "-i", inventory, *TWO_BY_TWO, "--master-port", port, "--max-restarts", "1",
        "--restart-delay", "0.2", *(("--detach",) if detach else ()), *TREE,
        "strict.py", str(out),
    )  # fmt: skip
    if detach:  # the head's supervisor runs the attempts: CPUACCEL_RESTART in env.sh
        assert run.code == 0, run
        run_id = run.stdout.strip()
        status = ended(cluster, run_id, timeout=120)
        assert (status["state"], len(status["attempts"])) == ("succeeded", 2), status
    else:
        assert run.code == 0, run
        run_id = run.run_dir.name
    for attempt in (0, 1):
        ranks = seen(out, attempt)
        assert sorted(ranks) == [0, 1, 2, 3], (attempt, ranks, run)
        for rank, got in ranks.items():
            node = rank // 2
            assert got["host"] == f"node{node + 1}", got
            assert {name: got[name] for name in NAMES if name != "MASTER_ADDR"} == {
                "RANK": str(rank),
                "LOCAL_RANK": str(rank % 2),
                "WORLD_SIZE": "4",
                "LOCAL_WORLD_SIZE": "2",
                "GROUP_RANK": str(node),
                "NODE_RANK": str(node),
                "GROUP_WORLD_SIZE": "2",
                "ROLE_RANK": str(rank),
                "ROLE_NAME": "default",
                "ROLE_WORLD_SIZE": "4",
                "MASTER_PORT": port,
                "TORCHELASTIC_RUN_ID": run_id,
                "TORCHELASTIC_RESTART_COUNT": str(attempt),
                "TORCHELASTIC_MAX_RESTARTS": "1",
                "TORCHELASTIC_ERROR_FILE": got["TORCHELASTIC_ERROR_FILE"],
            }, (attempt, rank)
            error_file = Path(got["TORCHELASTIC_ERROR_FILE"])
            assert error_file.parent.name == run_id and error_file.name == f"error-{rank}.json"
        assert len({got["MASTER_ADDR"] for got in ranks.values()}) == 1


def test_a_host_s_own_env_reaches_that_host_s_ranks_only(cluster: Cluster, tmp_path: Path) -> None:
    out = tmp_path / "seen"
    out.mkdir()
    out.chmod(0o777)
    inventory = cluster.write_inventory(
        tmp_path / "per-host.yaml",
        host_overrides={"node2": {"cpuaccel_env": {"TAG": "two", "NODE_RANK": "7"}}},
    )
    proj = make_project(tmp_path, {"strict.py": STRICT})
    run = cpuaccel_run(
        proj, "-i", str(inventory), *TWO_BY_TWO, "--master-port", master_port(),
        "--max-restarts", "1", "--restart-delay", "0.2", *TREE, "strict.py", str(out),
    )  # fmt: skip
    assert run.code == 0, run
    ranks = seen(out, 1)
    assert sorted(ranks) == [0, 1, 2, 3], run
    got = {k: (r["host"], r["TAG"], r["NODE_RANK"], r["GROUP_RANK"]) for k, r in ranks.items()}
    assert got == {
        0: ("node1", None, "0", "0"),
        1: ("node1", None, "0", "0"),
        2: ("node2", "two", "7", "1"),  # its own NODE_RANK wins over the derived one
        3: ("node2", "two", "7", "1"),
    }
    env_sh = (run.run_dir / "env.sh").read_text()
    assert "export TAG=" not in env_sh and "export NODE_RANK=" not in env_sh


def test_a_launcher_wide_variable_differing_on_one_host_is_refused(
    cluster: Cluster, tmp_path: Path
) -> None:
    inventory = cluster.write_inventory(
        tmp_path / "per-host.yaml",
        host_overrides={"node2": {"cpuaccel_env": {"I_MPI_DEBUG": "5"}}},
    )
    proj = make_project(tmp_path, {"strict.py": STRICT})
    run = cpuaccel_run(proj, "-i", str(inventory), *TWO_BY_TWO, *TREE, "strict.py", "x")
    assert run.code == 64, run
    assert "node2: cpuaccel_env I_MPI_DEBUG differs between hosts" in run.stderr, run
    assert "the launcher reads it once for the whole job" in run.stderr, run
    assert "per-host.yaml:" in run.stderr, run


RECORDED = """\
import os
from torch.distributed.elastic.multiprocessing.errors import record

@record
def main():
    if os.environ["RANK"] == "1":
        raise ValueError("rank one has no data")

main()
"""


def test_a_recorded_failure_is_the_run_s_root_cause(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    proj = make_project(tmp_path, {"recorded.py": RECORDED})
    args = ("-i", inventory, "--nodes", "2", "--ppn", "1", "--master-port", master_port(),
            *TREE, "recorded.py")  # fmt: skip
    # Not cpuaccel_run: the failing rank's traceback is the script's own, and expected.
    run = Run(cpuaccel("run", *args, cwd=proj, env=ENV, timeout=240), 0.0)
    assert run.code == 1, run
    assert (
        "first failing rank 1 on node2 (exit code 1); root cause: ValueError: rank one has no data"
        in run.stderr
    ), run
    failure = run.record()["first_failure"]
    assert failure["cause"] == "ValueError: rank one has no data", failure
