"""`cpuaccel check` against real nodes (namespaces with their own sshd): each node's own
facts and the table, a node that cannot be reached, the head's kept masters, version
drift, a missing interpreter, host keys unknown or changed, what run's preflight refuses,
two inventory names that are one account, and the sessions (shells) each node pays."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from cpuaccel.errors import EXIT_NODE_FAILED, EXIT_OK
from cpuaccel.testbed import netns
from cpuaccel.testbed.cluster import Cluster
from testsupport.command import clean_env, cpuaccel

pytestmark = pytest.mark.cluster


def clean_cpuaccel(*args: str) -> subprocess.CompletedProcess[str]:
    """`cpuaccel ARGS` from a user's plain shell (no venv on PATH)."""
    return cpuaccel(*args, env=clean_env(), timeout=120)


def check_json(*args: str) -> tuple[int, dict[str, Any]]:
    proc = clean_cpuaccel("check", "--json", *args)
    assert not proc.stderr.strip() or "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def test_check_reports_each_nodes_own_facts(cluster: Cluster) -> None:
    code, report = check_json("-i", str(cluster.inventory_path))
    assert code == 0, report["problems"]
    assert report["problems"] == []
    assert sorted(report["hosts"]) == ["node1", "node2", "node3"]
    for name, entry in report["hosts"].items():
        assert entry["reachable"] is True and entry["error"] is None
        facts = entry["facts"]
        assert facts["hostname"] == name
        assert facts["python"]["executable"] == sys.executable
        assert facts["packages"]["torch"].startswith("2.13.0")
        assert facts["mpi"]["launchers"][0]["flavour"] == "impi"
        node = next(n for n in cluster.nodes if n.name == name)
        assert node.address in facts["addresses"]
        # Every node resolved the two others by name, to their own addresses.
        others = {n.name: n.address for n in cluster.nodes if n.name != name}
        assert {k: v["addresses"] for k, v in facts["resolve"].items()} == {
            k: [v] for k, v in others.items()
        }


def test_check_table_names_every_node(cluster: Cluster) -> None:
    proc = clean_cpuaccel("check", "-i", str(cluster.inventory_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    for node in cluster.nodes:
        row = next(line for line in lines if line.startswith(node.name + " "))
        assert row.split()[1:3] == ["ok", "="]  # "=": the hostname is the inventory name
    assert "3 reachable, 0 unreachable; 0 error(s)" in proc.stdout


def test_stopped_sshd_is_unreachable_and_others_still_reported(cluster: Cluster) -> None:
    # Its sessions too: a connection kept from an earlier check (an ssh master, as
    # Ansible's) outlives a stop of the listener alone, and would still reach node2.
    with cluster.sshd_stopped("node2", kill_sessions=True):
        code, report = check_json("-i", str(cluster.inventory_path))
        table = clean_cpuaccel("check", "-i", str(cluster.inventory_path))
    assert code == EXIT_NODE_FAILED
    assert report["hosts"]["node2"]["reachable"] is False
    assert "refused" in report["hosts"]["node2"]["error"].lower()
    for name in ("node1", "node3"):
        assert report["hosts"][name]["facts"]["hostname"] == name
    assert [p["host"] for p in report["problems"]] == ["node2"]
    assert table.returncode == EXIT_NODE_FAILED
    lines = table.stdout.splitlines()
    row = next(line for line in lines if line.startswith("node2 "))
    assert "unreachable" in row and "refused" not in row.lower()  # the error is below
    error = next(i for i, line in enumerate(lines) if line.startswith("error   node2: "))
    assert "refused" in lines[error].lower() and error > lines.index(row)
    assert "Traceback" not in table.stderr


def test_the_next_check_reaches_the_nodes_through_the_heads_kept_masters(
    cluster: Cluster,
) -> None:
    """The head's launcher-reach connections stay as ssh masters (ControlPersist), as
    the controller's own do: a check within a minute logs in through them, no handshake.
    node2's listener stopped alone (its sessions kept, as a stopped ssh service) shows
    it: a new connection from the head would be refused, and a run's preflight, whose
    masters are its own, still makes one. With the sessions killed, see above."""
    inventory = str(cluster.inventory_path)
    code, report = check_json("-i", inventory)  # the masters, opened (or kept from before)
    assert (code, report["problems"]) == (EXIT_OK, []), report["problems"]
    with cluster.sshd_stopped("node2"):
        code, report = check_json("-i", inventory)
    assert (code, report["problems"]) == (EXIT_OK, []), report["problems"]
    assert report["hosts"]["node2"]["facts"]["hostname"] == "node2"


def test_version_drift_on_one_node_is_an_error_naming_it(cluster: Cluster, tmp_path: Path) -> None:
    other_python = "/usr/bin/python3"  # Debian's, beside the venv's: no torch, no cpuaccel
    inv = cluster.write_inventory(
        tmp_path / "drift.yaml", host_overrides={"node3": {"cpuaccel_python": other_python}}
    )
    code, report = check_json("-i", str(inv))
    assert code == 1
    drift = [p for p in report["problems"] if p["severity"] == "error"]
    assert drift and {p["host"] for p in drift} == {"node3"}
    messages = " ".join(p["message"] for p in drift)
    assert "torch absent here, but 2.13.0" in messages
    assert "cpuaccel absent here" in messages
    assert report["hosts"]["node3"]["facts"]["python"]["executable"] == other_python


def test_missing_interpreter_is_reported_for_that_node(cluster: Cluster, tmp_path: Path) -> None:
    inv = cluster.write_inventory(
        tmp_path / "nopy.yaml", host_overrides={"node1": {"cpuaccel_python": "/nonexistent/py"}}
    )
    code, report = check_json("-i", str(inv))
    assert code == 1
    entry = report["hosts"]["node1"]
    assert entry["reachable"] is True and entry["status"] == "failed"
    assert "/nonexistent/py" in entry["error"]
    assert report["hosts"]["node2"]["facts"]["hostname"] == "node2"


def inventory_knowing(cluster: Cluster, path: Path, known_hosts: Path) -> Path:
    """An inventory of the cluster whose host keys are checked against `known_hosts` alone."""
    return cluster.write_inventory(
        path,
        cpuaccel_known_hosts=str(known_hosts),
        ansible_ssh_common_args="-o UserKnownHostsFile=" + str(known_hosts),
    )


def test_unknown_host_key_is_refused_by_default(cluster: Cluster, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    inv = inventory_knowing(cluster, tmp_path / "unknown.yaml", empty)
    proc = clean_cpuaccel("check", "-i", str(inv), "--limit", "node1")
    assert proc.returncode == EXIT_NODE_FAILED
    assert "host key of" in proc.stdout and "is not known" in proc.stdout
    assert "ssh-keyscan" in proc.stdout
    assert "Traceback" not in proc.stderr
    insecure = clean_cpuaccel("check", "-i", str(inv), "--limit", "node1", "--no-host-key-checking")
    assert insecure.returncode == 0, insecure.stdout


def test_changed_host_key_is_refused(cluster: Cluster, tmp_path: Path) -> None:
    key = tmp_path / "impostor"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    node1 = cluster.nodes[0]
    known = tmp_path / "known_hosts"
    known.write_text(
        f"{node1.address} {Path(str(key) + '.pub').read_text().split()[0]} "
        f"{Path(str(key) + '.pub').read_text().split()[1]}\n"
    )
    inv = inventory_knowing(cluster, tmp_path / "changed.yaml", known)
    proc = clean_cpuaccel("check", "-i", str(inv), "--limit", "node1")
    assert proc.returncode == EXIT_NODE_FAILED
    assert "CHANGED" in proc.stdout


def test_check_refuses_what_runs_preflight_refuses_on_a_node(
    cluster: Cluster, tmp_path: Path
) -> None:
    """No cpuaccel for the nodes' Python (alike everywhere: no drift), a cpuaccel_setvars
    that is not there, a launcher the head lacks (Debian's Python sees no Intel MPI
    beside it): run's preflight refuses each, and so does check, naming the node."""
    inv = cluster.write_inventory(
        tmp_path / "unready.yaml",
        host_overrides={"node2": {"cpuaccel_setvars": "/nonexistent/setvars.sh"}},
        only=["node1", "node2"],
        cpuaccel_python="/usr/bin/python3",  # Debian's: no cpuaccel
    )
    code, report = check_json("-i", str(inv), "-e", "cpuaccel_launcher=impi")
    assert code == 1, report
    errors = [(p["host"], p["message"]) for p in report["problems"] if p["severity"] == "error"]
    assert errors[:3] == [
        ("node1", "cpuaccel is not installed for /usr/bin/python3"),
        ("node2", "cpuaccel is not installed for /usr/bin/python3"),
        ("node2", "cpuaccel_setvars /nonexistent/setvars.sh does not exist here"),
    ], report["problems"]
    assert len(errors) == 4 and errors[3][0] == "node1", errors  # the head
    assert errors[3][1].startswith("no impi launcher here (found: "), errors
    # The launcher a run would take by itself (auto): nothing to say about it.
    code, report = check_json("-i", str(inv))
    assert not [p for p in report["problems"] if "launcher" in p["message"]], report


def test_check_notes_two_names_for_one_account(cluster: Cluster, tmp_path: Path) -> None:
    inv = cluster.write_inventory(tmp_path / "twice.yaml", only=["node1"])
    document = yaml.safe_load(inv.read_text())
    hosts = document["all"]["hosts"]
    address = cluster.nodes[0].address
    hosts[address] = dict(hosts["node1"])  # the same node by its address: it resolves
    inv.write_text(yaml.safe_dump(document, sort_keys=False))
    proc = cpuaccel("check", "--json", "-i", str(inv), env=clean_env(), timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["problems"] == []
    (note,) = report["notes"]
    assert note["severity"] == "note"
    assert note["message"].startswith(f"node1, {address} are one machine and one user")
    table = cpuaccel("check", "-i", str(inv), env=clean_env(), timeout=120)
    assert table.returncode == 0 and "note" in table.stdout and "0 warning(s)" in table.stdout


def test_the_heads_reach_opens_no_shell_on_the_other_nodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bash reads ~/.bashrc for every command sshd runs (a `conda init` there costs each
    session): the controller's probe and the network doctor's are the sessions a node
    pays; the head's ssh to the others authenticates (ssh -N) and starts no shell there,
    nor does the next check, which finds the head's masters alive (ssh -O check)."""
    marks = tmp_path / "marks"
    rc = tmp_path / "bashrc"
    rc.write_text(f'echo "$SSH_CONNECTION" >> {marks}\n' + netns.SKEL_BASHRC.read_text())
    monkeypatch.setattr(netns, "SKEL_BASHRC", rc)  # what the bed mounts on ~/.bashrc
    # Apart from the session cluster (CPUACCEL_TEST_CLUSTER_ID), so both can be up at once.
    cluster_id = (int(os.environ.get("CPUACCEL_TEST_CLUSTER_ID", "0")) + 43) % 64
    with Cluster(3, cluster_id=cluster_id) as cluster:
        by_node = {n.address: n.name for n in cluster.nodes}
        head, *others = cluster.names
        for _ in range(2):  # the masters opened, then found
            marks.write_text("")
            code, report = check_json("-i", str(cluster.inventory_path))
            assert (code, report["problems"]) == (EXIT_OK, []), report["problems"]
            # [client address, client port, server address, server port] of every shell
            sessions = [line.split() for line in marks.read_text().splitlines()]
            shells = {
                name: [by_node.get(s[0], "controller") for s in sessions if s[2] == address]
                for address, name in by_node.items()
            }
            # The controller's sessions only: its probe and the network doctor's.
            assert all(shells[name] == ["controller"] * 2 for name in others), shells
            assert set(shells[head]) == {"controller"}, shells  # and the reach's program
