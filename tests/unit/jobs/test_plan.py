"""The environment every rank gets (RunPlan.env): the settings' variables, written from
the settings table (config.settings.rank_env), with the values the plan settles from
the nodes' facts, beside cpuaccel's own variables and under the user's."""

from __future__ import annotations

from typing import Any

import pytest

from cpuaccel.config.effective import resolve
from cpuaccel.errors import UsageError
from cpuaccel.inventory.host import Host
from cpuaccel.inventory.inventory import Inventory
from cpuaccel.jobs.plan import Script, build_plan

# What every rank of these plans gets whatever the settings (two nodes, ppn 2).
OWN = {
    "CPUACCEL_RUN_ID": "RID",
    "CPUACCEL_RUN_DIR": "~/cpuaccel/runs/RID",
    "CPUACCEL_LABEL_OUTPUT": "1",
    "MASTER_ADDR": "n1",
    "MASTER_PORT": "29500",
    "TORCHELASTIC_MAX_RESTARTS": "0",
    "OMP_NUM_THREADS": "2",
    "ACCELERATE_USE_CPU": "true",
    "CPUACCEL_RENDEZVOUS": "120",
    "ACCELERATE_MIXED_PRECISION": "no",
    "CPUACCEL_MIXED_PRECISION": "no",
}
CCL = {"OMP_NUM_THREADS": "1", "CPUACCEL_BACKEND": "ccl", "CCL_ATL_TRANSPORT": "ofi"}


def rank_env(host_vars: dict[str, Any], *, ccl: bool = False, **flags: Any) -> dict[str, str]:
    chosen = [
        Host(name, {"ansible_host": f"10.0.0.{i}", **host_vars})
        for i, name in ((1, "n1"), (2, "n2"))
    ]
    inventory = Inventory(None, {h.name: h for h in chosen}, {})
    settings = resolve({"ppn": 2, **flags}, None, inventory, chosen)
    cpu = {"sockets": 1, "physical_cores": 4, "flags": []}
    impi = {"launchers": [{"flavour": "impi", "path": "/opt/impi/bin/mpirun"}]}
    packages = {"oneccl_bindings_for_pytorch": "1"} if ccl else {}
    facts = {
        h.name: {"cpu": cpu, "mpi": impi, "packages": packages, "setvars": {"path": None}}
        for h in chosen
    }
    return build_plan(settings, Script("train.py"), facts, "RID").env


@pytest.mark.parametrize(
    ("host_vars", "ccl", "flags", "expected"),
    [
        ({}, False, {}, {}),
        ({"cpuaccel_master_port": 29999}, False, {"max_restarts": 3},
         {"MASTER_PORT": "29999", "TORCHELASTIC_MAX_RESTARTS": "3"}),
        # the ccl backend's workers, and only with it
        ({}, True, {}, {**CCL, "CCL_WORKER_COUNT": "1"}),
        ({"cpuaccel_ccl_workers": 0}, True, {},
         {**CCL, "OMP_NUM_THREADS": "2", "CCL_WORKER_COUNT": "0"}),
        ({"cpuaccel_ccl_workers": 3, "cpuaccel_backend": "gloo"}, False, {},
         {"CPUACCEL_BACKEND": "gloo"}),
        ({"cpuaccel_fi_provider": "tcp"}, True, {},
         {**CCL, "CCL_WORKER_COUNT": "1", "FI_PROVIDER": "tcp"}),
        # given, even as the default: the runtime then knows it was asked for
        ({"cpuaccel_grad_reduce": "ordered", "cpuaccel_weights": "bf16"}, False, {},
         {"CPUACCEL_GRAD_REDUCE": "ordered", "CPUACCEL_WEIGHTS": "bf16"}),
        ({"cpuaccel_deterministic": False}, False, {}, {"CPUACCEL_DETERMINISTIC": "0"}),
        ({"cpuaccel_deterministic": True}, False, {}, {"CPUACCEL_DETERMINISTIC": "1"}),
        # the user's variables win; the precision's are only where the user set none
        ({"cpuaccel_mixed_precision": "bf16",
          "cpuaccel_env": {"ACCELERATE_MIXED_PRECISION": "no", "FOO": "1"}}, False, {},
         {"FOO": "1", "CPUACCEL_MIXED_PRECISION": "bf16"}),
        ({"cpuaccel_env": {"MASTER_PORT": "1", "CCL_WORKER_COUNT": "7"}}, True, {},
         {**CCL, "MASTER_PORT": "1", "CCL_WORKER_COUNT": "7"}),
        ({}, False, {"env": {"CPUACCEL_BACKEND": "mpi"}}, {"CPUACCEL_BACKEND": "mpi"}),
    ],
)  # fmt: skip
def test_the_ranks_get_the_settings_variables(
    host_vars: dict[str, Any], ccl: bool, flags: dict[str, Any], expected: dict[str, str]
) -> None:
    assert rank_env(host_vars, ccl=ccl, **flags) == {**OWN, **expected}


def test_the_settings_variables_come_before_the_users_and_the_precisions_last() -> None:
    env = list(rank_env({"cpuaccel_weights": "bf16", "cpuaccel_env": {"FOO": "1"}}))
    assert env.index("MASTER_ADDR") < env.index("CPUACCEL_WEIGHTS") < env.index("OMP_NUM_THREADS")
    assert env[-3:] == ["FOO", "ACCELERATE_MIXED_PRECISION", "CPUACCEL_MIXED_PRECISION"]


def test_a_secret_never_reaches_the_plain_environment() -> None:
    env = rank_env({"cpuaccel_secret_env": {"HF_TOKEN": "x"}, "cpuaccel_fi_provider": "tcp"})
    assert "HF_TOKEN" not in env and env["FI_PROVIDER"] == "tcp"


@pytest.mark.parametrize(
    ("host_vars", "named"),
    [
        ({"cpuaccel_deterministic": True}, "cpuaccel_deterministic (cpuaccel_deterministic)"),
        ({"cpuaccel_env": {"CPUACCEL_DETERMINISTIC": "1"}}, "--env CPUACCEL_DETERMINISTIC"),
    ],
)
def test_reproducible_sums_and_the_librarys_allreduce_are_refused(
    host_vars: dict[str, Any], named: str
) -> None:
    with pytest.raises(UsageError, match="asks for reproducible sums") as caught:
        rank_env({**host_vars, "cpuaccel_grad_reduce": "library"})
    assert str(caught.value).startswith(f"{named} asks for reproducible sums, ")
