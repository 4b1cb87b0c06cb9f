"""group_vars/ and host_vars/ beside the inventory and the playbook.

Ansible's order (its VARIABLE_PRECEDENCE default and VariableManager.get_vars), lowest
first, each layer checked to win over every layer below it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from cpuaccel.config.settings import INVENTORY_VARIABLES
from cpuaccel.errors import EXIT_USAGE, InventoryError
from cpuaccel.inventory.inventory import Inventory
from testsupport.command import cpuaccel

# Lowest first: where each layer is written (relative to the test folder).
LAYERS = [
    "inventory [all:vars]",
    "inventory [gpu:vars]",
    "inv/group_vars/all.yml",
    "play/group_vars/all.yml",
    "inv/group_vars/gpu.yml",
    "play/group_vars/gpu.yml",
    "inventory host line",
    "inv/host_vars/node1.yml",
    "play/host_vars/node1.yml",
]


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def ladder(tmp_path: Path) -> Inventory:
    """Variable vN is written in layers 0..N: the value must come from layer N."""

    def lines(layer: int, sep: str) -> str:
        return "".join(f"v{n}{sep}{layer}\n" for n in range(layer, len(LAYERS)))

    words = " ".join(f"v{n}=6" for n in range(6, len(LAYERS)))
    write(
        tmp_path / "inv" / "hosts.ini",
        f"[gpu]\nnode1 {words}\nnode2\n[all:vars]\n{lines(0, '=')}[gpu:vars]\n{lines(1, '=')}",
    )
    for layer, where in enumerate(LAYERS):
        if where.endswith(".yml"):
            write(tmp_path / where, lines(layer, ": "))
    inventory = Inventory.load(tmp_path / "inv" / "hosts.ini")
    return inventory.with_playbook_vars(tmp_path / "play")


def test_each_layer_wins_over_those_below_it(tmp_path: Path) -> None:
    inventory = ladder(tmp_path)
    got = inventory.hosts["node1"].vars
    assert {n: got[f"v{n}"] for n in range(len(LAYERS))} == {n: n for n in range(len(LAYERS))}
    # node2 has no host vars: the group layers alone.
    assert inventory.hosts["node2"].vars["v8"] == 5
    origin = inventory.origin("node1", "v4")
    assert origin is not None
    assert (origin.source, origin.line) == (str(tmp_path / "inv/group_vars/gpu.yml"), 1)


def test_without_the_playbook_only_the_inventorys_folder_counts(tmp_path: Path) -> None:
    ladder(tmp_path)
    got = Inventory.load(tmp_path / "inv" / "hosts.ini").hosts["node1"].vars
    assert (got["v3"], got["v5"], got["v8"]) == (2, 4, 7)


def test_a_folder_of_files_is_read_in_sorted_order(tmp_path: Path) -> None:
    write(tmp_path / "hosts.ini", "[gpu]\nnode1\n")
    write(tmp_path / "group_vars/gpu/20-late.yaml", "port: 2\nlate: yes\n")
    write(tmp_path / "group_vars/gpu/10-early.yml", "port: 1\nearly: 1\n")
    write(tmp_path / "group_vars/gpu/sub/30-nested", "nested: true\n")
    write(tmp_path / "group_vars/gpu/.hidden.yml", "port: 99\n")
    write(tmp_path / "group_vars/all", "everyone: 1\n")  # no suffix, as in Ansible
    inventory = Inventory.load(tmp_path / "hosts.ini")
    assert inventory.hosts["node1"].vars == {
        "everyone": 1, "port": 2, "late": True, "early": 1, "nested": True
    }  # fmt: skip
    assert inventory.warnings == []


def test_files_not_read_are_each_named_in_a_warning(tmp_path: Path) -> None:
    write(tmp_path / "inventory.yaml", "all:\n  hosts:\n    node1:\n")
    write(tmp_path / "group_vars/cpu.yml", "a: 1\n")
    write(tmp_path / "group_vars/all.yml", "a: 1\n")
    write(tmp_path / "group_vars/all.yaml", "a: 2\n")
    write(tmp_path / "host_vars/node9.yaml", "a: 1\n")
    write(tmp_path / "host_vars/node1/notes.txt", "a: 1\n")
    inventory = Inventory.load(tmp_path / "inventory.yaml")
    assert inventory.hosts["node1"].vars == {"a": 1}
    text = "\n".join(inventory.warnings)
    assert len(inventory.warnings) == 4, text
    assert "group_vars/cpu.yml: not read: the inventory has no group 'cpu'" in text
    assert "group_vars/all.yaml: not read: Ansible reads only all.yml" in text
    assert "host_vars/node9.yaml: not read: the inventory has no host 'node9'" in text
    assert "host_vars/node1/notes.txt: not read: a vars file ends in" in text


@pytest.mark.parametrize(
    ("name", "text", "line", "fragment"),
    [
        ("group_vars/all.yml", "a: 1\nb: [unclosed\n", 3, "YAML syntax error"),
        ("group_vars/all.yml", "- a\n- b\n", 1, "must be a mapping"),
        ("group_vars/gpu/x.yaml", "ok: 1\ncpuaccel_ppn: four\n", 2, "cpuaccel_ppn"),
        ("host_vars/node1", "ansible_port: http\n", 1, "not a port number"),
    ],
)
def test_a_bad_vars_file_names_its_file_and_line(
    tmp_path: Path, name: str, text: str, line: int, fragment: str
) -> None:
    write(tmp_path / "hosts", "[gpu]\nnode1\n")
    write(tmp_path / name, text)
    with pytest.raises(InventoryError) as caught:
        Inventory.load(tmp_path / "hosts").check_declared(INVENTORY_VARIABLES)
    assert (caught.value.source, caught.value.line) == (str(tmp_path / name), line)
    assert fragment in str(caught.value)


def test_config_show_names_the_vars_file(tmp_path: Path) -> None:
    write(tmp_path / "hosts.ini", "[gpu]\nnode1\n[all:vars]\ncpuaccel_ppn=2\n")
    write(tmp_path / "group_vars/all.yaml", "# ppn for every node\n\ncpuaccel_ppn: 4\n")
    proc = cpuaccel("config", "show", "--json", "-i", "hosts.ini", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    ppn = json.loads(proc.stdout)["ppn"]
    assert (ppn["value"], ppn["source"]) == (4, "inventory")
    assert ppn["where"].startswith("group_vars/all.yaml:3")
    bad = write(tmp_path / "group_vars/gpu.yml", "cpuaccel_ppn: four\n")
    proc = cpuaccel("config", "show", "-i", "hosts.ini", cwd=tmp_path)
    assert proc.returncode == EXIT_USAGE
    assert f"error: {bad.relative_to(tmp_path)}:1: " in proc.stderr, proc.stderr


def test_provision_reads_the_vars_beside_its_playbook(tmp_path: Path) -> None:
    write(
        tmp_path / "inv/inventory.yaml",
        f"all:\n  hosts:\n    local0:\n      ansible_connection: local\n"
        f"      ansible_python_interpreter: {sys.executable}\n"
        f"      cpuaccel_python: {sys.executable}\n",
    )
    write(tmp_path / "inv/group_vars/all.yml", "greeting: from the inventory\nwho: inventory\n")
    write(tmp_path / "site/group_vars/all.yml", "greeting: from the playbook\n")
    write(tmp_path / "site/host_vars/local0.yml", "mark: local0's own\n")
    book = write(
        tmp_path / "site/play.yaml",
        "- hosts: all\n  tasks:\n"
        "    - name: say\n      debug: {msg: '{{ greeting }} / {{ who }} / {{ mark }}'}\n",
    )
    proc = cpuaccel(
        "provision", "-i", "inv/inventory.yaml", "--playbook", str(book), "-v", cwd=tmp_path,
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "from the playbook / inventory / local0's own" in proc.stdout, proc.stdout
