"""Slurm as an inventory source (``-i slurm:PARTITION``, ``check --slurm``) on scontrol's
output: a capture from the test bed's Slurm (data/ beside this file) and hostile variants
of it, read by a stand-in ``scontrol`` on PATH so that the whole command line is exercised.
The same against the real slurmctld: tests/cluster/test_slurm_inventory.py."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from cpuaccel.api.checking import NOT_ALLOWED, held_back, with_refusal
from cpuaccel.errors import EXIT_NODE_FAILED, EXIT_PROBLEMS, EXIT_USAGE, InventoryError, UsageError
from cpuaccel.executor import HostResult, Status
from cpuaccel.facts.problems import find_problems
from cpuaccel.inventory.host import Host
from cpuaccel.slurm import partition
from cpuaccel.slurm.partition import describe, fields, read_partition, unavailable
from testsupport.command import cpuaccel, inherited_env

DATA = Path(__file__).parent / "data"
CAPTURED_NODES = (DATA / "scontrol-show-nodes.txt").read_text()
CAPTURED_PARTITIONS = (DATA / "scontrol-show-partitions.txt").read_text()
# The capture with a second partition "big" (node2, node3), node2 busy, and a partition
# without nodes: what a site with several partitions prints.


def _multi(line: str) -> str:
    if line.startswith("NodeName=node1 "):
        return line
    line = line.replace("Partitions=debug ", "Partitions=debug,big ")
    return line.replace("State=IDLE ", "State=ALLOCATED ") if "node2 " in line else line


NODES = "\n".join(map(_multi, CAPTURED_NODES.splitlines()))
_DEBUG = CAPTURED_PARTITIONS.splitlines()[0]
PARTITIONS = "\n".join(
    [
        _DEBUG,
        _DEBUG.replace("=debug", "=big")
        .replace("Default=YES", "Default=NO")
        .replace("Nodes=node[1-3]", "Nodes=node[2-3]"),
        _DEBUG.replace("=debug", "=empty")
        .replace("Default=YES", "Default=NO")
        .replace("Nodes=node[1-3]", "Nodes=(null)"),
    ]
)


def fake_run(nodes: str = NODES, partitions: str = PARTITIONS) -> object:
    def run(argv: tuple[str, ...], **_: object) -> str:
        return nodes if argv[2] == "nodes" else partitions

    return run


@pytest.fixture
def scontrol(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.setattr(partition.commands, "run", fake_run())
    return monkeypatch


def with_node(**changes: str) -> str:
    """The capture with node1's fields changed (a hostile scontrol)."""
    line = NODES.splitlines()[0]
    for key, value in changes.items():
        old = fields(line)[key]
        line = line.replace(f"{key}={old}", f"{key}={value}", 1)
    return "\n".join([line, *NODES.splitlines()[1:]]) + "\n"


def test_the_capture_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(partition.commands, "run", fake_run(CAPTURED_NODES, CAPTURED_PARTITIONS))
    found = read_partition("slurm:")
    assert found.partition == "debug"
    assert [(n.name, n.address, n.state, n.cpus) for n in found.nodes] == [
        ("node1", "10.77.67.1", "IDLE", 2),
        ("node2", "10.77.67.2", "IDLE", 2),
        ("node3", "10.77.67.3", "IDLE+DRAIN", 2),
    ]
    assert found.nodes[2].reason == "maint by admin [root@2026-11-30T21:25:10]"


def test_capture_reads_every_node_with_its_state(scontrol: pytest.MonkeyPatch) -> None:
    found = read_partition("slurm:")  # the default partition
    assert found.partition == "debug"
    assert [n.name for n in found.nodes] == ["node1", "node2", "node3"]
    node1 = found.nodes[0]
    assert node1.state == "IDLE" and node1.cpus == 2 and node1.reason is None
    assert node1.address != node1.name  # NodeAddr, where ssh connects
    drained = found.nodes[2]
    assert unavailable(drained.state) and describe(drained.state) == "drained"
    assert drained.reason is not None and drained.reason.startswith("maint")


def test_a_named_partition_filters_the_nodes(scontrol: pytest.MonkeyPatch) -> None:
    assert [n.name for n in read_partition("slurm:big").nodes] == ["node2", "node3"]


def test_the_first_field_wins_over_a_reason_that_mimics_one() -> None:
    line = "NodeName=n1 CPUTot=4 State=DOWN Reason=see ticket State=IDLE [root@x]"
    assert fields(line)["State"] == "DOWN"
    assert (
        fields("NodeName=n1 CfgTRES=cpu=2,mem=1M OS=Linux 6.1 #1 SMP")["OS"] == "Linux 6.1 #1 SMP"
    )


@pytest.mark.parametrize(
    ("state", "word", "down"),
    [
        ("IDLE", "idle", False),
        ("MIXED", "mixed", False),
        ("IDLE+DRAIN", "drained", True),
        ("MIXED+DRAIN", "draining", True),
        ("DOWN+NOT_RESPONDING", "down, not responding", True),
        ("IDLE+NOT_RESPONDING", "idle, not responding", True),
        ("IDLE+POWERED_DOWN", "idle", True),
        ("ALLOCATED+COMPLETING", "allocated", False),
    ],
)
def test_states(state: str, word: str, down: bool) -> None:
    assert describe(state) == word
    assert unavailable(state) is down


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"NodeName": "node1;reboot"}, "NodeName 'node1;reboot' is not a host name"),
        ({"NodeName": "-oProxyCommand=x"}, "must not start with '-'"),
        ({"NodeAddr": "$(reboot)"}, "NodeAddr '$(reboot)' is not a host name"),
        ({"NodeAddr": "-p2"}, "must not start with '-'"),
        ({"NodeAddr": "fe80::1%eth0;reboot"}, "has the IPv6 scope id 'eth0;reboot'"),
        ({"CPUTot": "lots"}, "CPUTot 'lots' is not a number"),
        ({"State": "IDLE;rm"}, "is not a Slurm node state"),
    ],
)
def test_hostile_values_are_refused_naming_the_node(
    monkeypatch: pytest.MonkeyPatch, changes: dict[str, str], said: str
) -> None:
    monkeypatch.setattr(partition.commands, "run", fake_run(with_node(**changes)))
    with pytest.raises(InventoryError) as caught:
        read_partition("slurm:debug")
    assert said in caught.value.message
    assert caught.value.message.startswith("slurm:debug (scontrol show nodes): node ")
    assert caught.value.exit_code == EXIT_USAGE


def test_a_hostile_node_of_another_partition_does_not_matter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(partition.commands, "run", fake_run(with_node(NodeAddr="$(reboot)")))
    assert [n.name for n in read_partition("slurm:big").nodes] == ["node2", "node3"]


def test_a_reason_is_one_line() -> None:
    node = partition.node_of(
        {"NodeName": "n1", "CPUTot": "2", "State": "DOWN", "Reason": "a\x1b[31mb\rc"}, "x"
    )
    assert node.reason == "a [31mb c"


@pytest.mark.parametrize(
    ("spec", "said", "error"),
    [
        ("slurm:nope", "Slurm has no partition 'nope'", UsageError),
        ("slurm:empty", "partition 'empty' has no nodes", UsageError),
        ("slurm:-x", "must not start with '-'", UsageError),
        ("slurm:a b", "is not a partition name", UsageError),
    ],
)
def test_bad_partitions(scontrol: pytest.MonkeyPatch, spec: str, said: str, error: type) -> None:
    with pytest.raises(error) as caught:
        read_partition(spec)
    assert said in caught.value.message
    if "no partition" in said:
        assert "-i slurm:debug (default), -i slurm:big" in (caught.value.hint or "")


def test_no_default_partition(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        partition.commands,
        "run",
        fake_run(partitions=PARTITIONS.replace("Default=YES", "Default=NO")),
    )
    with pytest.raises(UsageError, match="no default partition"):
        read_partition("slurm:")


def test_a_hostile_default_partition_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    hostile = PARTITIONS.replace("PartitionName=debug ", "PartitionName=-oX;x ")
    nodes = NODES.replace("Partitions=debug", "Partitions=-oX;x")
    monkeypatch.setattr(partition.commands, "run", fake_run(nodes, hostile))
    with pytest.raises(UsageError) as caught:
        read_partition("slurm:")
    assert "default partition: '-oX;x' is not a partition name" in caught.value.message
    assert "-oX" not in (caught.value.hint or "")  # the list leaves it out


def slurm_host(name: str, state: str, reason: str | None = None) -> Host:
    values: dict[str, object] = {"slurm_state": state, "slurm_cpus": 2}
    if reason:
        values["slurm_reason"] = reason
    return Host(name, values)


def test_drained_nodes_are_held_back_with_their_reason() -> None:
    hosts = [slurm_host("node1", "IDLE"), slurm_host("node3", "IDLE+DRAIN", "maint")]
    contact, held = held_back(hosts)
    assert [h.name for h in contact] == ["node1"]
    result = held["node3"]
    assert result.status is Status.FAILED
    assert "drained (IDLE+DRAIN), reason: maint; not contacted" in (result.error or "")


def test_every_node_refusing_ssh_is_one_clear_line() -> None:
    hosts = [slurm_host("node1", "IDLE"), slurm_host("node2", "MIXED")]
    refused = "authentication failed as u@node1: Authentication failed."
    results = [HostResult(h, Status.UNREACHABLE, error=refused) for h in hosts]
    problems = with_refusal(results, find_problems(results))
    assert [p.message for p in problems] == [NOT_ALLOWED]
    assert problems[0].host == "node1, node2"
    # One node reachable: the other's refusal is that node's own problem, as usual.
    results[0] = HostResult(hosts[0], Status.OK, {})
    assert [p.message for p in with_refusal(results, find_problems(results))] == [refused]


# The whole command line, with a stand-in scontrol on PATH printing the capture.


def fake_scontrol(folder: Path, nodes: str = NODES) -> dict[str, str]:
    (folder / "nodes.txt").write_text(nodes)
    (folder / "partitions.txt").write_text(PARTITIONS)
    script = folder / "scontrol"
    script.write_text(f'#!/bin/sh\nexec cat "{folder}/$2.txt"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return inherited_env(PATH=f"{folder}{os.pathsep}{os.environ['PATH']}")


def test_cli_lists_a_partition(tmp_path: Path) -> None:
    env = fake_scontrol(tmp_path)
    done = cpuaccel("check", "--slurm", "big", "--list-hosts", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["hosts", "(2):", "node2", "node3"]
    done = cpuaccel("check", "-i", "slurm:", "--list-hosts", cwd=tmp_path, env=env)
    assert done.stdout.split()[1:] == ["(3):", "node1", "node2", "node3"]


def test_project_file_and_environment_name_a_partition(tmp_path: Path) -> None:
    env = fake_scontrol(tmp_path)
    (tmp_path / "cpuaccel.yaml").write_text("inventory: slurm:big\n")
    done = cpuaccel("config", "show", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert "slurm:big" in done.stdout and "node2,node3" in done.stdout
    (tmp_path / "cpuaccel.yaml").unlink()
    env["CPUACCEL_INVENTORY"] = "slurm:"
    done = cpuaccel("check", "--list-hosts", cwd=tmp_path, env=env)
    assert done.stdout.split()[1:] == ["(3):", "node1", "node2", "node3"], done.stderr


def test_cli_names_a_drained_node_without_contacting_it(tmp_path: Path) -> None:
    env = fake_scontrol(tmp_path)
    done = cpuaccel("check", "--slurm", "--limit", "node3", "--json", cwd=tmp_path, env=env)
    assert done.returncode == EXIT_PROBLEMS, done.stderr
    report = json.loads(done.stdout)
    node3 = report["hosts"]["node3"]
    assert node3["slurm"]["state"] == "IDLE+DRAIN" and node3["slurm"]["available"] is False
    assert "reason: maint" in report["problems"][0]["message"]
    done = cpuaccel("check", "--slurm", "--limit", "node3", cwd=tmp_path, env=env)
    assert "SLURM" in done.stdout and "idle+drain" in done.stdout
    assert "node3: Slurm has it drained (IDLE+DRAIN), reason: maint" in done.stdout
    assert "not contacted (down or drained in Slurm)" in done.stdout
    assert "0 reachable, 0 unreachable, 1 not contacted" in done.stdout


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--slurm", "nope"], "slurm:nope: Slurm has no partition 'nope'"),
        (["-i", "slurm:-x"], "must not start with '-'"),
        (["-i", "inventory.yaml", "--slurm"], "two inventories given"),
    ],
)
def test_cli_bad_partitions_exit_64(tmp_path: Path, args: list[str], said: str) -> None:
    done = cpuaccel("check", *args, "--list-hosts", cwd=tmp_path, env=fake_scontrol(tmp_path))
    assert done.returncode == EXIT_USAGE
    assert said in done.stderr and "Traceback" not in done.stderr
    assert done.stderr.startswith("error: ")


def test_cli_hostile_node_exits_64_naming_it(tmp_path: Path) -> None:
    env = fake_scontrol(tmp_path, with_node(NodeName="node1;reboot"))
    done = cpuaccel("check", "--slurm", "--list-hosts", cwd=tmp_path, env=env)
    assert done.returncode == EXIT_USAGE
    assert "node 'node1;reboot': NodeName" in done.stderr and "Traceback" not in done.stderr


def test_cli_without_slurm_says_so(tmp_path: Path) -> None:
    env = inherited_env(PATH=str(tmp_path))  # no scontrol anywhere
    done = cpuaccel("check", "--slurm", "--list-hosts", cwd=tmp_path, env=env)
    assert done.returncode == EXIT_NODE_FAILED
    assert "scontrol is not installed" in done.stderr
