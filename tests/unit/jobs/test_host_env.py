"""Each host's own cpuaccel_env in the plan: what every chosen host has alike goes into
env.sh, what differs into CPUACCEL_HOST_ENV by the node's address, and what cannot
differ between hosts is refused with the host, the file:line and the reason."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cpuaccel.config.effective import resolve
from cpuaccel.errors import InventoryError
from cpuaccel.inventory.inventory import Inventory
from cpuaccel.jobs.plan import RunPlan, Script, build_plan
from tests.unit.network.test_choice import stock

RUN_ID = "20260101-000000-abcdef"


def plan_of(tmp_path: Path, text: str, **flags: Any) -> RunPlan:
    path = tmp_path / "inventory.yaml"
    path.write_text(text)
    inventory = Inventory.load(str(path))
    chosen = inventory.select(None)
    settings = resolve({"ppn": 2, "launcher": "impi", **flags}, None, inventory, chosen)
    found = {
        h.name: {
            **stock(k + 1, resolve={o.name: [f"192.0.2.{j + 1}"] for j, o in enumerate(chosen)}),
            "cpu": {"sockets": 1, "physical_cores": 4},
            "mpi": {"launchers": [{"flavour": "impi", "path": "/opt/impi/bin/mpirun"}]},
            "packages": {},
            "setvars": {"path": None},
        }
        for k, h in enumerate(chosen)
    }
    return build_plan(settings, Script("train.py"), found, RUN_ID)


INVENTORY = """\
all:
  vars:
    cpuaccel_env: {SHARED: "x", NODE_RANK: "0"}
  hosts:
    node1: {ansible_host: 192.0.2.1}
    node2:
      ansible_host: 192.0.2.2
      cpuaccel_env: {SHARED: "x", NODE_RANK: "1", ONLY_HERE: "y"}
    node3: {ansible_host: 192.0.2.3}
"""


def test_a_host_s_own_values_reach_that_host_s_ranks_only(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, INVENTORY)
    assert plan.env["SHARED"] == "x"
    assert "NODE_RANK" not in plan.env and "ONLY_HERE" not in plan.env  # never the head's
    assert json.loads(plan.env["CPUACCEL_HOST_ENV"]) == {
        "192.0.2.1": {"NODE_RANK": "0"},
        "192.0.2.2": {"NODE_RANK": "1", "ONLY_HERE": "y"},
        "192.0.2.3": {"NODE_RANK": "0"},
    }


def test_what_every_host_has_alike_needs_no_host_env(tmp_path: Path) -> None:
    text = INVENTORY.replace('NODE_RANK: "1", ONLY_HERE: "y"', 'NODE_RANK: "0"')
    plan = plan_of(tmp_path, text)
    assert plan.env["NODE_RANK"] == "0" and "CPUACCEL_HOST_ENV" not in plan.env


def test_env_from_the_command_line_is_every_host_s(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, INVENTORY, env={"NODE_RANK": "5"})
    assert plan.env["NODE_RANK"] == "5"
    assert json.loads(plan.env["CPUACCEL_HOST_ENV"]) == {"192.0.2.2": {"ONLY_HERE": "y"}}


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("I_MPI_DEBUG", "the launcher reads it once for the whole job"),
        ("MASTER_PORT", "every rank must agree on it"),
        ("WORLD_SIZE", "every rank must agree on it"),
        ("CPUACCEL_BACKEND", "a setting of the whole job"),
        ("LD_PRELOAD", "read before the rank's Python starts"),
    ],
)
def test_a_launcher_wide_variable_that_differs_is_refused_where_written(
    tmp_path: Path, name: str, why: str
) -> None:
    value = "gloo" if name == "CPUACCEL_BACKEND" else "5"
    text = INVENTORY.replace('ONLY_HERE: "y"', f'{name}: "{value}"')
    with pytest.raises(InventoryError) as caught:
        plan_of(tmp_path, text)
    error = caught.value
    assert error.exit_code == 64
    assert (Path(str(error.source)).name, error.line) == ("inventory.yaml", 8)
    assert f"node2: cpuaccel_env {name} differs between hosts" in str(error.message)
    assert f"node2 {name}={value}, node1 none" in str(error.message) and why in str(error.message)


def test_a_host_s_bad_env_is_named_at_its_line(tmp_path: Path) -> None:
    text = INVENTORY.replace('ONLY_HERE: "y"', 'CPUACCEL_BACKEND: "nccl"')
    with pytest.raises(InventoryError) as caught:
        plan_of(tmp_path, text)
    assert caught.value.line is not None
    assert "nccl" in str(caught.value.message)
