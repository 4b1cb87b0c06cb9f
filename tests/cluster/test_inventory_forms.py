"""Inventories as Ansible users write them, against real nodes: the cluster's inventory
written as INI with its key in group_vars/, and as a comma list ``-i a,b,``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from cpuaccel.testbed.cluster import Cluster
from testsupport.command import clean_env, cpuaccel

pytestmark = pytest.mark.cluster


def check_json(cwd: Path, *args: str) -> dict[str, Any]:
    proc = cpuaccel("check", "--json", *args, cwd=cwd, env=clean_env(), timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report: dict[str, Any] = json.loads(proc.stdout)
    return report


def cluster_vars(cluster: Cluster) -> tuple[dict[str, Any], dict[str, Any]]:
    """The group vars and the hosts of the cluster's own YAML inventory."""
    document = yaml.safe_load(cluster.inventory_path.read_text())
    return dict(document["all"]["vars"]), dict(document["all"]["hosts"])


def test_check_reads_an_ini_twin_of_the_cluster_inventory(cluster: Cluster, tmp_path: Path) -> None:
    group_vars, hosts = cluster_vars(cluster)
    key = group_vars.pop("ansible_ssh_private_key_file")
    lines = ["# the cluster's inventory.yaml, as an Ansible user writes it in INI", "[nodes]"]
    lines += [
        f"{name} " + " ".join(f"{k}={v}" for k, v in host_vars.items())
        for name, host_vars in hosts.items()
    ]
    lines += ["", "[nodes:vars]"] + [f"{k}={v}" for k, v in group_vars.items()]
    (tmp_path / "cluster.ini").write_text("\n".join(lines) + "\n")
    # The key only in group_vars/ beside it: check connects only if that file is read.
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "nodes.yml").write_text(f"ansible_ssh_private_key_file: {key}\n")
    report = check_json(tmp_path, "-i", "cluster.ini")
    assert sorted(report["hosts"]) == sorted(hosts)
    for name, entry in report["hosts"].items():
        assert entry["reachable"] is True, entry["error"]
        assert entry["facts"]["hostname"] == name
    assert report["problems"] == []


def test_check_reads_a_comma_list_of_hosts(cluster: Cluster, tmp_path: Path) -> None:
    group_vars, hosts = cluster_vars(cluster)
    addresses = [host_vars["ansible_host"] for host_vars in hosts.values()][:2]
    extra = [f"-e {k}={v}" for k, v in group_vars.items() if " " not in str(v)]
    args = [word for item in extra for word in item.split(" ", 1)]
    args += ["-e", f"ansible_ssh_common_args='{group_vars['ansible_ssh_common_args']}'"]
    report = check_json(tmp_path, "-i", ",".join(addresses) + ",", *args)
    assert list(report["hosts"]) == addresses
    names = {entry["facts"]["hostname"] for entry in report["hosts"].values()}
    assert names == set(list(hosts)[:2])
