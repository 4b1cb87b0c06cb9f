"""Ansible INI inventories and comma lists of hosts (``-i a,b,``).

The corpus under data/ini/ exercises each form of Ansible's documentation
("How to build your inventory") and of its ini plugin; each file has a YAML twin written
by hand, and ``ansible-inventory --list`` gave the two the same output when they were
written. Here both must load to the same hosts, groups and variables."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cpuaccel.config.inventory_choice import choose_inventory
from cpuaccel.config.settings import INVENTORY_VARIABLES
from cpuaccel.errors import InventoryError
from cpuaccel.inventory.inventory import Inventory
from testsupport.command import cpuaccel

CORPUS = Path(__file__).parent / "data" / "ini"
INI_FILES = sorted(CORPUS.glob("*.ini"))


def shape(inventory: Inventory) -> dict[str, Any]:
    """What a user sees of an inventory: hosts in order, their variables and groups,
    and each group's members."""
    return {
        "hosts": list(inventory.hosts),
        "vars": {name: host.vars for name, host in inventory.hosts.items()},
        "groups": {
            name: (sorted(group.hosts), sorted(group.children))
            for name, group in inventory.groups.items()
        },
        "member": {name: sorted(host.groups) for name, host in inventory.hosts.items()},
    }


def test_the_corpus_covers_the_documented_forms() -> None:
    assert len(INI_FILES) >= 7
    text = "\n".join(path.read_text() for path in INI_FILES)
    for form in (":vars]", ":children]", "[01:05]", "[a:f]", "[0:10:2]", ":5309", "; a"):
        assert form in text, form


@pytest.mark.parametrize("ini", INI_FILES, ids=[p.stem for p in INI_FILES])
def test_ini_and_its_yaml_twin_give_the_same_inventory(ini: Path) -> None:
    from_ini = Inventory.load(ini)
    from_yaml = Inventory.load(ini.with_suffix(".yaml"))
    assert shape(from_ini) == shape(from_yaml)
    assert from_ini.hosts  # a twin of nothing would prove nothing


def test_ini_values_are_typed_as_ansible_types_them() -> None:
    inventory = Inventory.load(CORPUS / "host_vars.ini")
    host2, host3 = inventory.hosts["host2"].vars, inventory.hosts["host3"].vars
    assert host2["http_port"] == 303 and host2["enabled"] is True
    assert host2["mode"] == "0755" and host2["word"] == "FALSE"  # not literals: text
    assert host3["secret"] == "03#pa33w0rd" and host3["cores"] == [0, 1]
    group = Inventory.load(CORPUS / "group_vars.ini").hosts["host1"].vars
    assert group["http_port"] == 8080 and group["use_proxy"] is False
    assert group["greeting"] == "hello world"


def test_children_and_priority_follow_ansible_precedence() -> None:
    children = Inventory.load(CORPUS / "children.ini")
    assert children.hosts["host1"].vars["escape_pods"] == 2
    assert children.hosts["host3"].vars["escape_pods"] == 4  # the child group wins
    # As Ansible lists a group's hosts: its children's own hosts (northeast, northwest,
    # southwest) before those of its grandchildren (atlanta, raleigh).
    assert children.group_hosts("usa") == ["host4", "host5", "host6", "host1", "host2", "host3"]
    priority = Inventory.load(CORPUS / "priority.ini")
    assert priority.hosts["h1"].vars["winner"] == "a"
    assert priority.hosts["h0"].vars["where"] == "ungrouped"
    assert "where" not in priority.hosts["h1"].vars  # in group a: not ungrouped


def test_the_origin_of_an_ini_variable_is_its_line() -> None:
    path = CORPUS / "group_vars.ini"
    inventory = Inventory.load(path)
    origin = inventory.origin("host1", "ansible_user")
    assert origin is not None and (origin.source, origin.line) == (str(path), 13)
    origin = inventory.origin("host1", "timezone")
    assert origin is not None and origin.line == 17


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("hosts", "[gpu]\nnode1 ansible_user=train\n"),  # no suffix: found by its section
        ("inventory.yaml", "# INI content in a .yaml file, as Ansible reads it\n[gpu]\nnode1\n"),
        ("hosts", "node1 ansible_user=train\nnode2\n"),  # no section, not a hostfile
        ("hosts", 'node1 motd="a b"\n'),
    ],
)
def test_an_ini_inventory_is_found_by_its_content(tmp_path: Path, name: str, text: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    inventory = Inventory.load(path)
    assert "node1" in inventory.hosts
    assert not inventory.warnings  # not taken for an MPI hostfile


def test_a_plain_hostfile_is_still_a_hostfile(tmp_path: Path) -> None:
    path = tmp_path / "hostfile"
    path.write_text("node1 slots=4\nnode2:2\n")
    inventory = Inventory.load(path)
    assert inventory.hosts["node1"].vars["cpuaccel_slots"] == 4
    assert "plain MPI hostfile" in inventory.warnings[0]


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        ("[a:vars]\nx=1\n[b]\nnode1\n", 1, "group 'a', which is not declared"),
        ("[p:children]\nq\n[p]\nnode1\n", 2, "names group 'q', which is not declared"),
        ("[g]\nnode1\nnode2 foo\n", 3, "expected key=value after host 'node2'"),
        ("[g:hostz]\nnode1\n", 1, "unknown type 'hostz'"),
        ("[g x]\nnode1\n", 1, "invalid section"),
        ("[g]\nnode1:\n", 2, "ends in ':' with no port"),
        ("[g]\n---\n", 2, "looks like a YAML file"),
        ("[g]\nnode1 a='open\n", 2, "No closing quotation"),
        ("[g]\nnode1\n[g:vars]\nnoequals\n", 4, "expected key=value in [g:vars]"),
        ("[g]\nnode[3:1]\n", 2, "empty host range"),
        ("[g]\nnode1 ansible_port=http\n", 2, "not a port number"),
        ("[g]\nnode1\n[g:vars]\ncpuaccel_ppn=four\n", 4, "cpuaccel_ppn"),
        ("[g]\nnode1 my-var=1\n", 2, "invalid variable name 'my-var'"),
        ("[g]\nnode1 raw=\"b'x'\"\n", 2, "Python bytes"),
        ("[g]\nnode1\n[g:children]\nall\n", 4, "'all' cannot be a child group"),
        ("[g]\nnode1 a=1\n[h]\nnode1 a=2\n", 4, "sets a to 2 here, but to 1 at line 2"),
        ("# nothing\n[g]\n", 1, "defines no hosts"),
    ],
)
def test_ini_mistakes_name_the_file_and_line(
    tmp_path: Path, text: str, line: int, fragment: str
) -> None:
    path = tmp_path / "hosts.ini"
    path.write_text(text)
    with pytest.raises(InventoryError) as caught:
        Inventory.load(path).check_declared(INVENTORY_VARIABLES)
    assert caught.value.source == str(path)
    assert caught.value.line == line, str(caught.value)
    assert fragment in str(caught.value)


# -- -i node1,node2, (Ansible's host list) ------------------------------------------


def test_a_comma_list_is_an_inventory_of_those_hosts() -> None:
    inventory = choose_inventory("node1, node2:2222,10.0.0.3,", None).load()
    assert list(inventory.hosts) == ["node1", "node2", "10.0.0.3"]
    assert inventory.hosts["node2"].port == 2222
    assert inventory.hosts["node1"].vars == {}
    assert inventory.group_hosts("ungrouped") == ["node1", "node2", "10.0.0.3"]


def test_a_single_host_needs_the_trailing_comma_as_in_ansible(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert list(choose_inventory("node1,", None).load().hosts) == ["node1"]
    with pytest.raises(InventoryError) as caught:
        choose_inventory("node1", None).load()
    assert "inventory file not found" in str(caught.value)
    assert "-i node1, (with the comma" in (caught.value.hint or "")


def test_a_file_whose_name_has_a_comma_is_still_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("a,b.ini").write_text("[g]\nnode7\n")
    assert list(choose_inventory("a,b.ini", None).load().hosts) == ["node7"]


@pytest.mark.parametrize(
    ("flag", "fragment"),
    [
        ("node1,-oProxyCommand=x,", "'-oProxyCommand=x' is not a host name"),
        ("node1,node[1:3],", "is a range"),
        (",,", "no host listed"),
        ("node1,node2:99999,", "node2:99999"),
    ],
)
def test_a_bad_comma_list_names_the_flag(flag: str, fragment: str) -> None:
    with pytest.raises(InventoryError) as caught:
        choose_inventory(flag, None).load()
    assert str(caught.value).startswith(f"-i {flag}: "), str(caught.value)
    assert fragment in str(caught.value)


def test_a_project_file_may_name_a_comma_list(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "cpuaccel.yaml").write_text("inventory: node1,node2:2222,\n")
    proc = cpuaccel("config", "show", "--json", "-c", "sub/cpuaccel.yaml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    shown = json.loads(proc.stdout)
    assert shown["inventory"]["value"] == "node1,node2:2222,"
    assert shown["hosts"]["value"] == ["node1", "node2"]


def test_check_help_shows_the_ansible_spellings() -> None:
    proc = cpuaccel("check", "--help")
    assert "cpuaccel check -i hosts.ini" in proc.stdout
    assert "cpuaccel check -i node1,node2," in proc.stdout
