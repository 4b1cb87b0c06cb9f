"""A job on networks as clusters have them, through `cpuaccel run` on the namespace bed:
stock Debian nodes (their own name on 127.0.1.1, docker0 everywhere), an inventory of
aliases, a second network chosen for the job; and the faults the preflight must name,
in seconds, before any rank waits on them (a filtered rendezvous port, a blocked port
between nodes, an MTU black hole)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from cpuaccel.errors import EXIT_NODE_FAILED
from cpuaccel.testbed.cluster import Cluster
from tests.cluster.fixtures import NODES, SUM_SCRIPT, master_port
from testsupport.command import cpuaccel
from testsupport.netfaults import (
    alias_names,
    filter_port,
    interface_bytes,
    mtu_black_hole,
    second_network,
    stock_debian,
)
from testsupport.runs import ENV, Run, cpuaccel_run, make_project

pytestmark = pytest.mark.cluster

# A fault is named within this many seconds of `cpuaccel run`'s start.
NAMED_WITHIN = 10.0
# Moves 3 x 16 MB through an allreduce: more than anything else on an interface.
LARGE_SCRIPT = """\
import torch
import torch.distributed as dist
dist.init_process_group()
value = torch.ones(4_000_000)
for _ in range(3):
    dist.all_reduce(value)
print(f"sum {value[0].item()}", flush=True)
dist.destroy_process_group()
"""


def job(nodes: int = 2, ppn: int = 1) -> tuple[str, ...]:
    return ("--nodes", str(nodes), "--ppn", str(ppn), "--master-port", master_port())


@pytest.mark.parametrize("launcher", ["impi", "mpich", "openmpi"])
def test_stock_debian_nodes_run_an_unmodified_script_under_every_launcher(
    cluster: Cluster, inventory: str, tmp_path: Path, launcher: str
) -> None:
    proj = make_project(tmp_path, {"plain.py": SUM_SCRIPT})
    with stock_debian(cluster, ["node1", "node2"]):
        own = cluster.exec("node2", ["getent", "hosts", "node2"]).stdout.split()
        assert own[:1] == ["127.0.1.1"]  # gloo would advertise this without cpuaccel
        run = cpuaccel_run(proj, "-i", inventory, *job(2, 2), "--launcher", launcher, "plain.py")
    assert run.code == 0, run
    assert {text for _, text in run.ranks().values()} == {"sum 10.0"}, run
    env = (run.run_dir / "env.sh").read_text()
    node1, node2 = (cluster.node(n).address for n in ("node1", "node2"))
    assert f"export MASTER_ADDR={node1}" in env
    assert f"export CPUACCEL_NODE_IFACES='{node1}=eth0 {node2}=eth0'" in env
    # What cpuaccel did about it is said, once a node.
    said = [line for line in run.stderr.splitlines() if "resolves to 127.0.1.1" in line]
    assert len(said) == 2 and "GLOO_SOCKET_IFNAME" in said[0], run


def test_check_says_what_a_stock_node_gets_and_names_the_shared_address(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    with stock_debian(cluster, ["node1", "node2"]):
        proc = cpuaccel("check", "-i", inventory, "--json", cwd=tmp_path, env=ENV)
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    network = found["network"]
    assert {name: n["interface"] for name, n in network["nodes"].items()} == {
        name: "eth0" for name in NODES
    }
    assert network["head_address"] == cluster.node("node1").address
    assert network["doctor"]["problems"] == []
    assert {c["status"] for c in network["doctor"]["connections"]} == {"ok"}
    notes = [n["message"] for n in found["notes"]]
    assert any(m.startswith("172.17.0.1 (docker0) is held by node1, node2") for m in notes)
    assert sum("resolves to 127.0.1.1" in m for m in notes) == 2, notes


def test_an_inventory_of_aliases_no_node_resolves_runs_as_it_is(
    cluster: Cluster, tmp_path: Path
) -> None:
    aliases = alias_names(cluster)
    inventory = cluster.write_inventory(tmp_path / "aliases.yaml", aliases=aliases)
    assert cluster.exec("node2", ["getent", "hosts", aliases["node1"]]).returncode != 0
    proj = make_project(tmp_path, {"plain.py": SUM_SCRIPT})
    run = cpuaccel_run(proj, "-i", str(inventory), *job(3), "plain.py")
    assert run.code == 0, run
    assert {host for host, _ in run.ranks().values()} == {aliases[n] for n in NODES}
    assert {text for _, text in run.ranks().values()} == {"sum 6.0"}, run
    hostfile = (run.run_dir / "hostfile").read_text().split()
    assert hostfile == [cluster.node(n).address for n in NODES]


def test_the_network_a_user_names_carries_the_job(cluster: Cluster, tmp_path: Path) -> None:
    proj = make_project(tmp_path, {"large.py": LARGE_SCRIPT})
    with second_network(cluster) as fast:
        subnet = fast.controller_address.rsplit(".", 1)[0] + ".0/24"
        inventory = cluster.write_inventory(tmp_path / "fast.yaml", cpuaccel_network=subnet)
        before = {n: interface_bytes(cluster, n, "eth1").tx for n in ("node1", "node2")}
        run = cpuaccel_run(proj, "-i", str(inventory), *job(2), "large.py")
        after = {n: interface_bytes(cluster, n, "eth1").tx for n in ("node1", "node2")}
        dry = cpuaccel("config", "show", "-i", str(inventory), cwd=proj, env=ENV)
    assert run.code == 0, run
    assert {text for _, text in run.ranks().values()} == {"sum 8.0"}, run
    # 3 x 16 MB through a two-rank allreduce: each node sent more than 16 MB on eth1.
    assert all(after[n] - before[n] > 16_000_000 for n in after), (before, after)
    env = (run.run_dir / "env.sh").read_text()
    assert f"export MASTER_ADDR={fast.addresses['node1']}" in env
    assert (run.run_dir / "hostfile").read_text().split() == [
        fast.addresses["node1"],
        fast.addresses["node2"],
    ]
    assert any(
        line.split()[:2] == ["network", subnet] and "cpuaccel_network" in line
        for line in dry.stdout.splitlines()
    ), dry.stdout


def _named(run: Run, text: str) -> None:
    lines = [line for line in run.stderr.splitlines() if line.startswith("preflight")]
    assert any(text in line for line in lines), run


def assert_idle(cluster: Cluster) -> None:
    """No job started: soon no process on any node but its sshd (the doctor's probes and
    the preflight's programs gone)."""
    for node in NODES:
        assert cluster.wait_idle(node, timeout=5) == [], node


def test_a_filtered_rendezvous_port_is_named_in_seconds(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    proj = make_project(tmp_path, {"plain.py": SUM_SCRIPT})
    port = master_port()
    with filter_port(cluster, "node1", int(port)):
        run = cpuaccel_run(
            proj, "-i", inventory, "--nodes", "3", "--ppn", "1", "--master-port", port, "plain.py"
        )
    assert run.code == EXIT_NODE_FAILED, run
    assert run.seconds < NAMED_WITHIN, run
    _named(run, f"node2, node3 -> node1: node1's master port {port}")
    _named(run, "filtered")
    assert "no job was started" in run.stderr
    assert_idle(cluster)


def test_a_port_blocked_between_two_nodes_is_named_in_seconds(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    proj = make_project(tmp_path, {"plain.py": SUM_SCRIPT})
    with filter_port(cluster, "node3", "1024-65534", peer="node2"):
        run = cpuaccel_run(proj, "-i", inventory, *job(3), "plain.py")
    assert run.code == EXIT_NODE_FAILED, run
    assert run.seconds < NAMED_WITHIN, run
    _named(run, "node2 -> node3")
    _named(run, "filtered")
    assert_idle(cluster)


def test_an_mtu_black_hole_is_named_as_such_not_as_a_firewall(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    proj = make_project(tmp_path, {"plain.py": SUM_SCRIPT})
    with mtu_black_hole(cluster, ["node1", "node2"]):
        run = cpuaccel_run(proj, "-i", inventory, *job(2), "plain.py")
    assert run.code == EXIT_NODE_FAILED, run
    assert run.seconds < NAMED_WITHIN, run
    _named(run, "node1 <-> node2")
    _named(run, "MTU")
    assert "firewall" not in run.stderr.split("fix:")[0], run
    assert_idle(cluster)


def test_no_route_to_the_head_is_named_in_seconds(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    proj = make_project(tmp_path, {"plain.py": SUM_SCRIPT})
    route = ["route", "unreachable", f"{cluster.node('node1').address}/32"]
    namespace = cluster.node("node3").namespace
    subprocess.run(["ip", "-n", namespace, route[0], "add", *route[1:]], check=True)
    try:
        run = cpuaccel_run(proj, "-i", inventory, *job(3), "plain.py")
    finally:
        subprocess.run(["ip", "-n", namespace, route[0], "del", *route[1:]], check=True)
    assert run.code == EXIT_NODE_FAILED, run
    assert run.seconds < NAMED_WITHIN, run
    _named(run, f"node3: no route to the head node's {cluster.node('node1').address}")
    assert "cannot ssh" not in run.stderr, run
    assert_idle(cluster)
