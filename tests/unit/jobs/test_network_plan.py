"""The job's network in its plan and files: MASTER_ADDR, each node's interface for the
ranks, the hostfile's names, ssh_config's, and each launcher's own options."""

from __future__ import annotations

from typing import Any

import pytest

from cpuaccel.config.effective import resolve
from cpuaccel.connectors.connect_options import ConnectOptions
from cpuaccel.inventory.host import Host
from cpuaccel.inventory.inventory import Inventory
from cpuaccel.jobs.plan import RunPlan, Script, build_plan
from cpuaccel.jobs.rundir import render_job_files
from tests.unit.network.test_choice import facts as net_facts
from tests.unit.network.test_choice import stock, two_networks

RUN_ID = "20260101-000000-abcdef"
MPIRUN = {"impi": "/opt/impi/bin/mpirun", "mpich": "/usr/bin/mpirun.mpich",
          "openmpi": "/usr/bin/mpirun.openmpi"}  # fmt: skip


def plan_of(node_facts: dict[str, dict[str, Any]], launcher: str = "impi", **flags: Any) -> RunPlan:
    chosen = [Host(n, {"ansible_host": f"192.0.2.{i + 1}"}) for i, n in enumerate(node_facts)]
    settings = resolve(
        {"ppn": 1, "launcher": launcher, **flags},
        None,
        Inventory(None, {h.name: h for h in chosen}, {}),
        chosen,
    )
    found = {
        name: {
            **f,
            "cpu": {"sockets": 1, "physical_cores": 4},
            "mpi": {"launchers": [{"flavour": launcher, "path": MPIRUN[launcher]}]},
            "packages": {},
            "setvars": {"path": None},
        }
        for name, f in node_facts.items()
    }
    return build_plan(settings, Script("train.py"), found, RUN_ID)


def test_stock_nodes_meet_at_the_head_s_address_each_on_its_interface() -> None:
    plan = plan_of({"node1": stock(1, resolve={"node2": ["192.0.2.2"]}),
                    "node2": stock(2, resolve={"node1": ["192.0.2.1"]})})  # fmt: skip
    # Each node's own name is 127.0.1.1 there: addresses, not names, everywhere.
    assert plan.env["MASTER_ADDR"] == "192.0.2.1"
    assert plan.env["CPUACCEL_NODE_IFACES"] == "192.0.2.1=eth0 192.0.2.2=eth0"
    files = render_job_files(plan, ConnectOptions())
    assert files["hostfile"][1] == "192.0.2.1\n192.0.2.2\n"
    assert "export I_MPI_HYDRA_IFACE=eth0" in files["launch.sh"][1]
    assert "export MASTER_ADDR=192.0.2.1" in files["env.sh"][1]


def test_names_every_node_resolves_to_the_addresses_chosen_are_kept() -> None:
    plan = plan_of({"node1": stock(1, (), resolve={"node2": ["192.0.2.2"]}),
                    "node2": stock(2, (), resolve={"node1": ["192.0.2.1"]})})  # fmt: skip
    assert plan.env["MASTER_ADDR"] == "node1"
    assert plan.env["CPUACCEL_NODE_IFACES"] == "192.0.2.1=eth0 192.0.2.2=eth0"
    assert render_job_files(plan, ConnectOptions())["hostfile"][1] == "node1\nnode2\n"


def test_aliases_no_node_resolves_are_addresses_in_the_hostfile_and_ssh_config() -> None:
    plan = plan_of({"trainer-a": stock(1), "trainer-b": stock(2)})
    files = render_job_files(plan, ConnectOptions())
    assert files["hostfile"][1] == "192.0.2.1\n192.0.2.2\n"
    config = files["ssh_config"][1]
    assert "Host trainer-a 192.0.2.1\n" in config and "Host trainer-b 192.0.2.2\n" in config


def test_a_second_network_carries_the_job_while_ssh_keeps_the_first() -> None:
    plan = plan_of({"a": two_networks(1), "b": two_networks(2)}, network="198.51.100.0/24")
    assert plan.env["MASTER_ADDR"] == "198.51.100.1"
    assert plan.env["CPUACCEL_NODE_IFACES"] == "198.51.100.1=ib0 198.51.100.2=ens2"
    files = render_job_files(plan, ConnectOptions())
    assert files["hostfile"][1] == "198.51.100.1\n198.51.100.2\n"
    assert 'Host a 198.51.100.1\n    HostName "192.0.2.1"' in files["ssh_config"][1]
    # The interfaces are named apart: hydra's one name is not set.
    assert "I_MPI_HYDRA_IFACE" not in files["launch.sh"][1]


@pytest.mark.parametrize(
    ("launcher", "expected"),
    [
        ("mpich", ["-iface", "eth0"]),
        (
            "openmpi",
            ["btl_tcp_if_include", "192.0.2.0/24", "--mca", "oob_tcp_if_include", "192.0.2.0/24"],
        ),
    ],
)
def test_each_launcher_is_told_the_network_its_own_way(launcher: str, expected: list[str]) -> None:
    argv = plan_of({"node1": stock(1), "node2": stock(2)}, launcher).command()
    start = argv.index(expected[0])
    assert argv[start : start + len(expected)] == expected
    assert argv.index(expected[0]) < argv.index("/bin/sh")  # mpirun's, not the script's


def test_without_network_facts_the_plan_keeps_the_names() -> None:
    plan = plan_of({"node1": {}, "node2": {}})
    assert plan.network is None
    assert plan.env["MASTER_ADDR"] == "node1" and "CPUACCEL_NODE_IFACES" not in plan.env
    assert render_job_files(plan, ConnectOptions())["hostfile"][1] == "node1\nnode2\n"


def test_a_user_s_master_addr_still_wins() -> None:
    plan = plan_of({"node1": stock(1), "node2": stock(2)}, env={"MASTER_ADDR": "192.0.2.77"})
    assert plan.env["MASTER_ADDR"] == "192.0.2.77"


def test_the_node_facts_helper_writes_the_probe_s_shape() -> None:
    assert set(net_facts()["network"]) == {"interfaces", "routes", "ssh_address", "own_name"}
