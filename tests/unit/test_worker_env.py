"""The rank's environment the worker sets: torchrun's whole list from each launcher
family's variables, and its node's own variables (CPUACCEL_HOST_ENV); and the root cause
a failed rank reports from its TORCHELASTIC_ERROR_FILE."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cpuaccel import worker
from cpuaccel.errors import SettingError
from cpuaccel.node.progress import CAUSE_MARKER, EXIT_MARKER
from cpuaccel.rank_settings import HOST_ENV, TORCHRUN_ENV

# Rank 3 of a 2 x 2 job (node 1, local rank 1), as each launcher family says it.
TWO_BY_TWO = {
    "hydra": {"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"},
    "openmpi": {
        "OMPI_COMM_WORLD_RANK": "3",
        "OMPI_COMM_WORLD_SIZE": "4",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    },
    "pmix": {"PMIX_RANK": "3", "PMIX_SIZE": "4", "PMIX_LOCAL_RANK": "1", "PMIX_LOCAL_SIZE": "2"},
    "slurm": {
        "SLURM_PROCID": "3",
        "SLURM_NTASKS": "4",
        "SLURM_LOCALID": "1",
        "SLURM_TASKS_PER_NODE": "2(x2)",
        "SLURM_NODEID": "1",
        "SLURM_NNODES": "2",
    },
    "torchrun": {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"},
}
UNDER_RUN = {
    "CPUACCEL_RUN_ID": "20260101-000000-abcdef",
    "CPUACCEL_RUN_DIR": "/w/runs/20260101-000000-abcdef",
    "CPUACCEL_RESTART": "2",
    "TORCHELASTIC_MAX_RESTARTS": "3",
    "MASTER_ADDR": "192.0.2.1",
    "MASTER_PORT": "29511",
}


@pytest.mark.parametrize("family", sorted(TWO_BY_TWO))
def test_every_launcher_gives_torchrun_s_whole_list_for_a_2x2_job(family: str) -> None:
    got = worker.derive_env({**TWO_BY_TWO[family], **UNDER_RUN})
    assert got == {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1",
        "NODE_RANK": "1",
        "GROUP_WORLD_SIZE": "2",
        "ROLE_RANK": "3",
        "ROLE_NAME": "default",
        "ROLE_WORLD_SIZE": "4",
        "MASTER_ADDR": "192.0.2.1",
        "MASTER_PORT": "29511",
        "TORCHELASTIC_RUN_ID": "20260101-000000-abcdef",
        "TORCHELASTIC_RESTART_COUNT": "2",
        "TORCHELASTIC_MAX_RESTARTS": "3",
        "TORCHELASTIC_ERROR_FILE": "/w/runs/20260101-000000-abcdef/error-3.json",
    }
    assert set(got) == set(TORCHRUN_ENV)  # the table the docs are written from


@pytest.mark.parametrize(("rank", "node"), [("0", "0"), ("1", "0"), ("2", "1"), ("3", "1")])
def test_each_rank_of_a_2x2_job_is_on_its_node(rank: str, node: str) -> None:
    env = {"PMI_RANK": rank, "PMI_SIZE": "4", "MPI_LOCALRANKID": str(int(rank) % 2),
           "MPI_LOCALNRANKS": "2"}  # fmt: skip
    got = worker.derive_env(env)
    assert (got["GROUP_RANK"], got["NODE_RANK"], got["GROUP_WORLD_SIZE"]) == (node, node, "2")


def test_outside_a_run_torchrun_s_defaults_and_no_error_file() -> None:
    got = worker.derive_env({})
    assert got["TORCHELASTIC_RUN_ID"] == "none"  # torchrun's own default --rdzv-id
    assert got["TORCHELASTIC_RESTART_COUNT"] == "0" and got["TORCHELASTIC_MAX_RESTARTS"] == "0"
    assert (got["GROUP_RANK"], got["GROUP_WORLD_SIZE"]) == ("0", "1")
    assert "TORCHELASTIC_ERROR_FILE" not in got


def test_values_already_set_win_torchrun_s_own_and_the_user_s() -> None:
    got = worker.derive_env({**TWO_BY_TWO["hydra"], "NODE_RANK": "7", "GROUP_RANK": "5"})
    assert (got["GROUP_RANK"], got["NODE_RANK"]) == ("5", "7")
    # Under torchrun itself its NODE_RANK follows its GROUP_RANK when not given.
    assert worker.derive_env({**TWO_BY_TWO["torchrun"], "GROUP_RANK": "4"})["NODE_RANK"] == "4"


def test_slurm_s_uneven_nodes_are_counted_by_slurm() -> None:
    env = {"SLURM_PROCID": "4", "SLURM_NTASKS": "5", "SLURM_LOCALID": "0",
           "SLURM_TASKS_PER_NODE": "3,2", "SLURM_NODEID": "1", "SLURM_NNODES": "2"}  # fmt: skip
    got = worker.derive_env(env)
    assert (got["LOCAL_WORLD_SIZE"], got["GROUP_RANK"], got["GROUP_WORLD_SIZE"]) == ("2", "1", "2")


def test_the_rank_takes_its_own_node_s_variables_before_the_derived_ones() -> None:
    mine = json.dumps({"192.0.2.250": {"NODE_RANK": "9"}, "127.0.0.1": {"NODE_RANK": "1"}})
    env = dict(os.environ, **TWO_BY_TWO["hydra"], **{HOST_ENV: mine})
    env.pop("NODE_RANK", None)
    derived = worker.apply_env(env)
    assert env["NODE_RANK"] == "1" and derived["NODE_RANK"] == "1"
    assert derived["GROUP_RANK"] == "1"
    others = json.dumps({"192.0.2.250": {"NODE_RANK": "9"}})
    assert worker.host_env({HOST_ENV: others}) == {}
    assert worker.host_env({}) == {}


@pytest.mark.parametrize(
    "text", ["[1]", "{", '{"127.0.0.1": {"A": 1}}', '{"x": "A=1"}', '{"x": {"A=B": "1"}}']
)
def test_a_garbled_host_env_is_one_line(text: str) -> None:
    with pytest.raises(SettingError, match=r"CPUACCEL_HOST_ENV is not a JSON object"):
        worker.host_env({HOST_ENV: text})


RECORDED = """\
from torch.distributed.elastic.multiprocessing.errors import record

@record
def main():
    raise ValueError("the batch is empty\\non two lines")

main()
"""


def run_worker(tmp_path: Path, source: str, **env: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "script.py"
    script.write_text(source)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "SLURM_"))}
    base = {k: v for k, v in base.items() if not k.startswith("TORCHELASTIC_")}
    return subprocess.run(
        [sys.executable, "-m", "cpuaccel.worker", str(script)],
        capture_output=True,
        text=True,
        env={**base, "PMI_RANK": "1", "PMI_SIZE": "2", **env},
        cwd=tmp_path,
        timeout=120,
    )


def test_a_recorded_failure_is_the_rank_s_root_cause(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    stale = run_dir / "error-1.json"
    stale.write_text('{"message": {"message": "OldError: from the last attempt"}}')
    proc = run_worker(tmp_path, RECORDED, CPUACCEL_RUN_DIR=str(run_dir))
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.splitlines()
    # One line, before the exit marker; the stale file was removed before the script ran.
    assert lines[-2:] == [
        f"{CAUSE_MARKER} ValueError: the batch is empty on two lines",
        f"{EXIT_MARKER} 1",
    ]
    assert "OldError" not in proc.stderr
    assert json.loads(stale.read_text())["message"]["message"].startswith("ValueError")


def test_a_failure_without_an_error_file_has_no_root_cause_line(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    proc = run_worker(tmp_path, "raise SystemExit(3)\n", CPUACCEL_RUN_DIR=str(run_dir))
    assert proc.returncode == 3 and CAUSE_MARKER not in proc.stderr
