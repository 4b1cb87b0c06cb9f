"""`run --rendezvous-timeout` without nodes: the setting (default, flag, project file,
bad values) and what the plan makes of it (every rank's bound, the supervisors'), and
a real local run whose ranks cannot meet. The markers and the supervisor:
tests/unit/node/test_rendezvous.py; on real nodes: tests/cluster/test_rendezvous.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cpuaccel.config.project import parse_project
from cpuaccel.errors import ProjectFileError
from cpuaccel.jobs.plan import Script, build_plan
from cpuaccel.node.rendezvous import ENV
from tests.cluster.fixtures import master_port
from tests.unit.jobs.test_hang import RUN_ID, settings, this_runs_processes
from testsupport.runs import cpuaccel_run, make_project


def test_the_bound_is_120_s_unless_the_flag_or_the_project_file_says() -> None:
    default = settings({}).rendezvous_timeout
    assert (default.value, default.source) == (120.0, "default")
    from_file = settings({}, "ppn: 1\nrendezvous_timeout: 30\n").rendezvous_timeout
    assert (from_file.value, from_file.where) == (30.0, "cpuaccel.yaml:2")
    flag = settings({"rendezvous_timeout": 7.5}, "rendezvous_timeout: 30\n").rendezvous_timeout
    assert (flag.value, flag.source, flag.where) == (7.5, "flag", "--rendezvous-timeout")
    plan = build_plan(
        settings({"rendezvous_timeout": 45.0, "ppn": 2}), Script("t.py"), None, RUN_ID
    )
    assert plan.rendezvous_timeout == 45.0 and plan.env[ENV] == "45"


@pytest.mark.parametrize("value", ["0", "-5", "'soon'", "true", ".nan", "100000"])
def test_a_bad_rendezvous_timeout_in_the_project_file_names_its_line(value: str) -> None:
    with pytest.raises(ProjectFileError) as caught:
        parse_project(f"ppn: 2\nrendezvous_timeout: {value}\n", "cpuaccel.yaml")
    assert str(caught.value).startswith("cpuaccel.yaml:2: rendezvous_timeout must be")


# Rank 1 looks for the store one port off: neither rank can join. Each says its error
# in a line and fails.
ASTRAY = """\
import os, sys
import torch.distributed as dist
if os.environ["RANK"] == "1":
    os.environ["MASTER_PORT"] = str(int(os.environ["MASTER_PORT"]) + 1)
try:
    dist.init_process_group("gloo")
except Exception as exc:
    sys.exit(f"no process group: {exc}")
print("joined")
"""


def test_a_local_run_whose_ranks_cannot_meet_ends_with_its_report(tmp_path: Path) -> None:
    proj = make_project(tmp_path, {"astray.py": ASTRAY})
    run = cpuaccel_run(
        proj, "--nodes", "1", "--ppn", "2", "--master-port", master_port(),
        "--rendezvous-timeout", "3", "astray.py",
    )  # fmt: skip
    assert run.code == 124, run
    said = " ".join(run.stderr.split())  # as one line: the terminal wraps long ones
    assert "rendezvous: rank(s) 0, 1 of 2 did not join the process group" in said, run
    assert "(--rendezvous-timeout 3)" in said
    assert "rank 0 on localhost: waiting to join; last network error: DistStoreError" in said
    assert "rank 1 on localhost: waiting to join; last network error: " in said
    assert "[cpuaccel] rendezvous" not in run.stdout + run.stderr  # the markers stay hidden
    status = json.loads((run.run_dir / "status.json").read_text())
    assert (status["state"], status["ended_by"], status["exit_code"]) == (
        "failed", "rendezvous", 124,
    )  # fmt: skip
    found = status["rendezvous"]
    assert (found["timeout"], found["joined"], found["missing"]) == (3.0, [], [0, 1])
    assert all(r["host"] == "localhost" and r["error"] for r in found["ranks"]), found
    assert found["seconds"] < 3 + 3 + 2  # the bound, its slack, a check or two
    assert "rendezvous" not in (run.run_dir / "rank-0.log").read_text()
    assert this_runs_processes(status["run_id"]) == []
