"""The rank's environment the worker sets: torchrun's whole list from each launcher
family's variables, and its node's own variables (CPUACCEL_HOST_ENV)."""

from __future__ import annotations

import json
import os

import pytest

from cpuaccel import worker
from cpuaccel.errors import SettingError
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
