"""Issue 12 (items 6, 10) against real nodes: rsync's secluded args and `--` carry a
destination with spaces and shell characters literally, "~/" lands in the node's home,
and `check` notes two inventory names that are one account."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import yaml

from cpuaccel.connectors.connect_options import ConnectOptions
from cpuaccel.connectors.ssh import SSHConnector
from cpuaccel.inventory.inventory import Inventory
from cpuaccel.testing.cluster import Cluster
from cpuaccel.testing.command import clean_env, cpuaccel

pytestmark = pytest.mark.cluster


def test_rsync_destination_with_spaces_and_home_arrives_literally(
    cluster: Cluster, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "f.txt").write_text("payload\n")
    tag = f"cpxl-h12i-{uuid.uuid4().hex[:8]}"
    marker = f"/tmp/{tag}-ran"
    dest = f"~/{tag}/a b;$(touch {marker})"
    host = Inventory.load(cluster.inventory_path).hosts["node2"]
    with SSHConnector(host, ConnectOptions(command_timeout=30)) as conn:
        try:
            result = conn.rsync(["-a", "--mkpath"], f"{src}/", dest + "/")
            assert result.ok, result.error
            home = conn.run(["sh", "-c", 'printf %s "$HOME"']).stdout
            listed = conn.run(["cat", f"{home}/{tag}/a b;$(touch {marker})/f.txt"])
            assert listed.ok and listed.stdout == "payload\n", listed.stderr
            assert not conn.run(["test", "-e", marker]).ok  # no shell ran the $(...)
        finally:
            conn.run(["rm", "-rf", f"{conn.run(['sh', '-c', 'echo $HOME']).stdout.strip()}/{tag}"])


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
