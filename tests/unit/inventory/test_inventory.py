"""The Ansible-format inventory: host ranges, groups and variable precedence, the implicit
inventory and how one is found, --limit, -e extra vars, and every error."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from cpuaccel.config.inventory_choice import choose_inventory
from cpuaccel.errors import EXIT_USAGE, InventoryError
from cpuaccel.inventory.inventory import (
    ENV_VAR,
    Inventory,
    Origin,
    expand_host_pattern,
    parse_extra_vars,
)


def write(tmp_path: Path, text: str, name: str = "inventory.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


def load(tmp_path: Path, text: str, extra_vars: dict[str, Any] | None = None) -> Inventory:
    return Inventory.load(write(tmp_path, text), extra_vars)


def load_error(tmp_path: Path, text: str) -> tuple[Path, InventoryError]:
    path = write(tmp_path, text)
    with pytest.raises(InventoryError) as info:
        Inventory.load(path)
    return path, info.value


def assert_points_at(error: InventoryError, path: Path, line: int | None) -> str:
    """The error names the file and line and carries a fix; returns its text."""
    text = str(error)
    assert error.source == str(path)
    assert error.line == line
    where = f"{path}:{line}: " if line is not None else f"{path}: "
    assert text.startswith(where), text
    assert error.hint
    assert "\n  fix: " in text
    assert error.exit_code == EXIT_USAGE
    return text


# --- host ranges -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("plain", ["plain"]),
        ("node[1:4]", ["node1", "node2", "node3", "node4"]),
        ("node[01:03]", ["node01", "node02", "node03"]),
        ("node[08:11]", ["node08", "node09", "node10", "node11"]),
        ("node[1:10:2]", ["node1", "node3", "node5", "node7", "node9"]),
        ("node[001:010:4]", ["node001", "node005", "node009"]),
        ("rack[a:c]", ["racka", "rackb", "rackc"]),
        ("rack[a:e:2]", ["racka", "rackc", "racke"]),
        ("n[:2]", ["n0", "n1", "n2"]),
        ("n[3:3].example.com", ["n3.example.com"]),
        ("r[a:b]n[1:2]", ["ran1", "ran2", "rbn1", "rbn2"]),
    ],
)
def test_expand_host_pattern(pattern: str, expected: list[str]) -> None:
    assert expand_host_pattern(pattern) == expected


def test_expand_keeps_zero_padding_over_a_whole_range() -> None:
    names = expand_host_pattern("node[01:16]")
    assert len(names) == 16
    assert names[0] == "node01"
    assert names[-1] == "node16"


@pytest.mark.parametrize(
    ("pattern", "fragment"),
    [
        ("node[3:1]", "empty host range"),
        ("rack[c:a]", "empty host range"),
        ("node[1:2", "unbalanced"),
        ("node1:2]", "unbalanced"),
        ("node[1]", "malformed"),
        ("node[1:2:3:4]", "malformed"),
        ("node[1:]", "malformed"),
        ("node[1:4:0]", "step"),
        ("node[1:4:x]", "step"),
        ("node[a:3]", "two numbers or two letters"),
        ("node[01:100]", "same width"),
    ],
)
def test_expand_host_pattern_rejects(pattern: str, fragment: str) -> None:
    with pytest.raises(InventoryError) as info:
        expand_host_pattern(pattern)
    assert fragment in str(info.value)
    assert pattern in str(info.value)
    assert info.value.hint


def test_ranges_expand_in_the_inventory_in_file_order(tmp_path: Path) -> None:
    inv = load(
        tmp_path,
        """
        all:
          hosts:
            head:
            node[01:03]:
              ansible_user: train
            rack[a:b]-[1:2]:
        """,
    )
    assert list(inv.hosts) == [
        "head",
        "node01",
        "node02",
        "node03",
        "racka-1",
        "racka-2",
        "rackb-1",
        "rackb-2",
    ]
    assert inv.hosts["node02"].user == "train"
    assert inv.hosts["head"].user is None


@pytest.mark.parametrize(
    ("key", "names", "port"),
    [
        ("node1:2222", ["node1"], 2222),
        ("node[1:2]:2200", ["node1", "node2"], 2200),
        ("rack[a:b]", ["racka", "rackb"], None),
        ("'[fe80::1]:2022'", ["fe80::1"], 2022),
        ("'[::1]'", ["::1"], None),
    ],
)
def test_host_keys_may_carry_a_port_like_ansible(
    tmp_path: Path, key: str, names: list[str], port: int | None
) -> None:
    inv = load(tmp_path, f"all:\n  hosts:\n    {key}:\n")
    assert list(inv.hosts) == names
    assert {host.port for host in inv.hosts.values()} == {port}


# --- groups and variable precedence ----------------------------------------------------

NESTED = """
all:
  vars:
    v: all
    only_all: yes
    ansible_user: train
  children:
    parent:
      vars:
        v: parent
        only_parent: 1
        ansible_port: 2200
      children:
        child:
          vars:
            v: child
          hosts:
            h1:
            h2:
              v: host
              ansible_host: 10.0.0.2
    other:
      hosts:
        h3:
"""


def test_precedence_all_parent_child_host(tmp_path: Path) -> None:
    inv = load(tmp_path, NESTED)
    h1, h2, h3 = inv.hosts["h1"], inv.hosts["h2"], inv.hosts["h3"]
    assert h1.vars["v"] == "child"
    assert h2.vars["v"] == "host"
    assert h3.vars["v"] == "all"
    assert h1.vars["only_all"] is True
    assert h1.vars["only_parent"] == 1
    assert "only_parent" not in h3.vars


def test_host_groups_list_direct_and_inherited_groups(tmp_path: Path) -> None:
    inv = load(tmp_path, NESTED)
    assert inv.hosts["h1"].groups == ("all", "parent", "child")
    assert inv.hosts["h3"].groups == ("all", "other")


def test_groups_record_direct_members_children_vars_and_line(tmp_path: Path) -> None:
    inv = load(tmp_path, NESTED)
    assert list(inv.groups) == ["all", "parent", "child", "other"]
    parent, child = inv.groups["parent"], inv.groups["child"]
    assert parent.hosts == ()
    assert parent.children == ("child",)
    assert child.hosts == ("h1", "h2")
    assert dict(child.vars) == {"v": "child"}
    assert (parent.line, child.line) == (7, 13)
    assert (inv.groups["all"].depth, parent.depth, child.depth) == (0, 1, 2)
    assert inv.group_hosts("parent") == ["h1", "h2"]
    # As Ansible lists them: other's own h3 (a child of all) before h1 and h2, which
    # are the hosts of a grandchild.
    assert inv.group_hosts("all") == ["h3", "h1", "h2"]


def test_extra_vars_override_everything(tmp_path: Path) -> None:
    inv = load(tmp_path, NESTED, {"v": "extra", "ansible_port": 2300})
    assert {host.vars["v"] for host in inv.hosts.values()} == {"extra"}
    assert {host.port for host in inv.hosts.values()} == {2300}
    assert inv.origin("h2", "v") == Origin("-e", None)


def test_host_properties_read_merged_vars(tmp_path: Path) -> None:
    inv = load(tmp_path, NESTED)
    h1, h2, h3 = inv.hosts["h1"], inv.hosts["h2"], inv.hosts["h3"]
    assert (h1.address, h1.port, h1.user) == ("h1", 2200, "train")
    assert (h2.address, h2.port, h2.user) == ("10.0.0.2", 2200, "train")
    assert (h3.address, h3.port, h3.user) == ("h3", None, "train")  # ssh_config decides
    assert not h1.is_local


def test_origin_records_where_each_merged_value_was_written(tmp_path: Path) -> None:
    inv = load(tmp_path, NESTED)
    source = str(tmp_path / "inventory.yaml")
    assert inv.origin("h1", "v") == Origin(source, 15)
    assert inv.origin("h2", "v") == Origin(source, 19)
    assert inv.origin("h3", "v") == Origin(source, 3)
    assert inv.origin("h1", "ansible_port") == Origin(source, 11)
    assert str(inv.origin("h1", "ansible_port")) == f"{source}:11"
    assert inv.origin("h1", "missing") is None


def test_deeper_group_wins_over_shallower_whatever_the_name(tmp_path: Path) -> None:
    inv = load(
        tmp_path,
        """
        zz:
          vars: {v: zz}
          hosts: {h: }
        p:
          children:
            a_child:
              vars: {v: a_child}
              hosts: {h: }
        """,
    )
    assert inv.hosts["h"].vars["v"] == "a_child"
    assert inv.hosts["h"].groups == ("all", "p", "zz", "a_child")


@pytest.mark.parametrize(
    ("alpha_priority", "beta_priority", "winner"),
    [
        (None, None, "beta"),  # same depth, same priority: later name wins
        (10, None, "alpha"),
        (None, 10, "beta"),
        (5, 3, "alpha"),
        (-1, None, "beta"),
    ],
)
def test_same_depth_groups_merge_by_priority_then_name(
    tmp_path: Path, alpha_priority: int | None, beta_priority: int | None, winner: str
) -> None:
    def group(name: str, priority: int | None) -> str:
        extra = f", ansible_group_priority: {priority}" if priority is not None else ""
        return f"{name}:\n  vars: {{v: {name}{extra}}}\n  hosts: {{h: }}\n"

    # beta first in the file: the file order must not matter.
    inv = load(tmp_path, group("beta", beta_priority) + group("alpha", alpha_priority))
    assert inv.hosts["h"].vars["v"] == winner
    assert "ansible_group_priority" not in inv.hosts["h"].vars
    if alpha_priority is not None:
        assert inv.groups["alpha"].priority == alpha_priority


def test_group_named_in_several_places_is_one_group(tmp_path: Path) -> None:
    inv = load(
        tmp_path,
        """
        all:
          children:
            gpu:
              hosts:
                n1:
        gpu:
          vars:
            accel: amx
          hosts:
            n2:
        fast:
          children:
            gpu:
              hosts:
                n3:
        """,
    )
    assert inv.groups["gpu"].hosts == ("n1", "n2", "n3")
    assert {host.vars["accel"] for host in inv.hosts.values()} == {"amx"}
    assert inv.hosts["n1"].groups == ("all", "fast", "gpu")
    assert inv.groups["gpu"].depth == 2


def test_host_listed_twice_joins_both_groups_and_may_repeat_a_value(tmp_path: Path) -> None:
    inv = load(
        tmp_path,
        """
        web:
          hosts:
            n1: {ansible_host: 10.0.0.1}
            n2:
        db:
          hosts:
            n1: {ansible_host: 10.0.0.1, role: db}
        """,
    )
    n1 = inv.hosts["n1"]
    assert list(inv.hosts) == ["n1", "n2"]
    assert n1.groups == ("all", "db", "web")
    assert (n1.address, n1.vars["role"]) == ("10.0.0.1", "db")


def test_yaml_anchors_and_merge_keys(tmp_path: Path) -> None:
    inv = load(
        tmp_path,
        """
        all:
          hosts:
            a: &base
              ansible_user: train
              ansible_port: 2200
            b:
              <<: *base
              ansible_port: 2201
        """,
    )
    assert (inv.hosts["b"].user, inv.hosts["b"].port) == ("train", 2201)


@pytest.mark.parametrize(
    ("host_vars", "port"),
    [
        ("{ansible_ssh_port: 2022}", 2022),
        ("{ansible_port: '2023'}", 2023),
        ("{ansible_ssh_common_args: '-o Port=2024'}", 2024),
    ],
)
def test_port_aliases(tmp_path: Path, host_vars: str, port: int) -> None:
    inv = load(tmp_path, f"all:\n  hosts:\n    h: {host_vars}\n")
    assert inv.hosts["h"].port == port


def test_bad_group_port_overridden_by_every_host_is_not_used(tmp_path: Path) -> None:
    inv = load(
        tmp_path,
        """
        all:
          vars: {ansible_port: nope}
          hosts:
            h: {ansible_port: 22}
        """,
    )
    assert inv.hosts["h"].port == 22


@pytest.mark.parametrize(
    ("host_vars", "is_local"),
    [("", True), ("{ansible_connection: ssh}", False), ("{ansible_connection: local}", True)],
)
def test_localhost_defaults_to_local_connection(
    tmp_path: Path, host_vars: str, is_local: bool
) -> None:
    inv = load(tmp_path, f"all:\n  hosts:\n    localhost: {host_vars}\n    other:\n")
    assert inv.hosts["localhost"].is_local is is_local
    assert not inv.hosts["other"].is_local
    assert "ansible_connection" not in inv.hosts["other"].vars


# --- implicit inventory and discovery --------------------------------------------------


def test_implicit_inventory_is_this_machine() -> None:
    inv = Inventory.implicit({"nproc": 2})
    assert inv.source is None
    assert list(inv.hosts) == ["localhost"]
    host = inv.hosts["localhost"]
    assert host.is_local
    assert host.python == sys.executable
    assert host.vars["nproc"] == 2
    assert host.groups == ("all",)
    assert inv.select(None) == [host]
    assert inv.select("localhost") == [host]


def test_implicit_inventory_validates_extra_vars() -> None:
    with pytest.raises(InventoryError) as info:
        Inventory.implicit({"ansible_port": "x"})
    assert "ansible_port" in str(info.value)
    assert str(info.value).startswith("-e: ")


@pytest.fixture
def no_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.delenv(ENV_VAR, raising=False)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return cwd


ONE_HOST = "all:\n  hosts:\n    {name}:\n"


def discover(path: str | None, extra_vars: dict[str, Any] | None = None) -> Inventory:
    """What every verb does with -i (and no project file): choose, then load."""
    return choose_inventory(path, None).load(extra_vars)


def test_discover_prefers_the_given_path(
    tmp_path: Path, no_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    given = write(tmp_path, ONE_HOST.format(name="given"), "given.yaml")
    monkeypatch.setenv(ENV_VAR, str(write(tmp_path, ONE_HOST.format(name="env"), "env.yaml")))
    write(no_env, ONE_HOST.format(name="cwd"))
    inv = discover(str(given))
    assert list(inv.hosts) == ["given"]
    assert inv.source == str(given)


def test_discover_then_the_environment(
    tmp_path: Path, no_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_VAR, str(write(tmp_path, ONE_HOST.format(name="env"), "env.yaml")))
    write(no_env, ONE_HOST.format(name="cwd"))
    assert list(discover(None).hosts) == ["env"]


def test_discover_then_inventory_yaml_in_the_current_directory(no_env: Path) -> None:
    write(no_env, ONE_HOST.format(name="cwd"))
    inv = discover(None, {"x": 1})
    assert list(inv.hosts) == ["cwd"]
    assert inv.hosts["cwd"].vars["x"] == 1


def test_discover_falls_back_to_the_implicit_inventory(no_env: Path) -> None:
    inv = discover(None)
    assert inv.source is None
    assert list(inv.hosts) == ["localhost"]


def test_discover_reports_a_missing_file_from_the_environment(
    no_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_VAR, "/nonexistent/inv.yaml")
    with pytest.raises(InventoryError) as info:
        discover(None)
    assert str(info.value).startswith("/nonexistent/inv.yaml: inventory file not found")


# --- --limit -----------------------------------------------------------------------------

LIMIT_INVENTORY = """
all:
  hosts:
    localhost:
  children:
    web:
      hosts:
        web[1:3]:
    db:
      hosts:
        db1:
        db2:
    rack1:
      hosts:
        web1:
        db1:
    prod:
      children:
        web:
        db:
"""
EVERY = ["localhost", "web1", "web2", "web3", "db1", "db2"]


@pytest.mark.parametrize(
    ("limit", "expected"),
    [
        (None, EVERY),
        ("all", EVERY),
        ("*", EVERY),
        ("web1", ["web1"]),
        ("web", ["web1", "web2", "web3"]),
        ("prod", ["web1", "web2", "web3", "db1", "db2"]),
        ("db2,web1", ["web1", "db2"]),
        (" web1 , db1 ", ["web1", "db1"]),
        ("db:web", ["web1", "web2", "web3", "db1", "db2"]),
        ("web,web1,rack1", ["web1", "web2", "web3", "db1"]),
        ("web*", ["web1", "web2", "web3"]),
        ("d?1", ["db1"]),
        ("web[12]*", ["web1", "web2"]),
        ("rack*", ["web1", "db1"]),
        ("~db", ["db1", "db2"]),
        ("~(web1|db2)$", ["web1", "db2"]),
        ("~web[23]", ["web2", "web3"]),
        ("web:!web2", ["web1", "web3"]),
        ("!web2", ["localhost", "web1", "web3", "db1", "db2"]),
        ("all:!prod", ["localhost"]),
        ("prod:&rack1", ["web1", "db1"]),
        ("&rack1", ["web1", "db1"]),
        ("web,&rack1", ["web1"]),
        ("!rack1,&prod", ["web2", "web3", "db2"]),
        ("web:db:!~db2", ["web1", "web2", "web3", "db1"]),
        ("prod:!web*", ["db1", "db2"]),
    ],
)
def test_select(tmp_path: Path, limit: str | None, expected: list[str]) -> None:
    inv = load(tmp_path, LIMIT_INVENTORY)
    assert [host.name for host in inv.select(limit)] == expected


@pytest.mark.parametrize(
    ("limit", "fragments"),
    [
        ("nosuch", ["'nosuch' matches no host or group", "groups in the inventory: all, web"]),
        ("web1,webb", ["'webb' matches no host", "did you mean web"]),
        ("web:!dbz", ["'dbz' matches no host", "did you mean db"]),
        ("~nothing.*", ["'~nothing.*' matches no host"]),
        ("~eb1", ["matches no host"]),  # regexes are anchored at the start, as in Ansible
        ("web:&db", ["selects no host", "groups in the inventory"]),
        # With a comma, only commas separate terms: "db:&rack1" is one name, as in Ansible.
        ("web,db:&rack1", ["'db:&rack1' matches no host", "split on its commas alone"]),
        ("~(", ["not a valid regular expression"]),
        ("", ["is empty"]),
        (" , ", ["is empty"]),
    ],
)
def test_select_errors(tmp_path: Path, limit: str, fragments: list[str]) -> None:
    inv = load(tmp_path, LIMIT_INVENTORY)
    with pytest.raises(InventoryError) as info:
        inv.select(limit)
    text = assert_points_at(info.value, tmp_path / "inventory.yaml", None)
    assert f"--limit {limit!r}" in text
    for fragment in fragments:
        assert fragment in text


# --- -e extra vars -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("items", "expected"),
    [
        (["nproc=4"], {"nproc": 4}),
        (["flag=true", "off=no"], {"flag": True, "off": False}),
        (["ratio=1.5"], {"ratio": 1.5}),
        (['msg="hello world"'], {"msg": "hello world"}),
        (["a=1 b=2"], {"a": 1, "b": 2}),  # one -e, two variables, as in Ansible
        (["a='x y' b=2"], {"a": "x y", "b": 2}),
        (["a=1  b=two", "b=3"], {"a": 1, "b": 3}),
        (["empty="], {"empty": ""}),
        (["nothing=null"], {"nothing": None}),
        (["expr=a=b"], {"expr": "a=b"}),
        (["not_scalar='a: b'", "day=2024-01-02"], {"not_scalar": "a: b", "day": "2024-01-02"}),
        (["x=1", "x=2"], {"x": 2}),
        (['{"a": 1, "b": [2]}'], {"a": 1, "b": [2]}),
    ],
)
def test_parse_extra_vars(items: list[str], expected: dict[str, Any]) -> None:
    assert parse_extra_vars(items) == expected


@pytest.mark.parametrize(
    "item",
    ["x=" + "[" * 5000, "x=" + "[" * 101 + "]" * 101, "{x: " + "[" * 5000],
    ids=["open-5000", "closed-101", "inline-mapping"],
)
def test_a_value_nested_too_deep_is_one_error_not_a_recursion(item: str) -> None:
    """PyYAML's composer recurses: -e "x=[[[[..." (5000 deep) was a RecursionError."""
    with pytest.raises(InventoryError, match="nested more than 100 levels deep") as info:
        parse_extra_vars([item])
    message = str(info.value).splitlines()[0]
    assert message.startswith("-e x: " if item.startswith("x=") else "-e '{x: [[[")
    assert len(message) < 200 and info.value.hint  # the item is not printed whole
    assert parse_extra_vars(["x=" + "[" * 100]) == {"x": "[" * 100}  # not YAML: its text


def test_parse_extra_vars_reads_a_file(tmp_path: Path) -> None:
    path = write(tmp_path, "nproc: 8\nuser: train\n", "vars.yaml")
    assert parse_extra_vars(["nproc=2", f"@{path}", "user=me"]) == {"nproc": 8, "user": "me"}


@pytest.mark.parametrize(
    "item",
    ["novalue", "=3", "1x=3", "bad key=1", "{not: [closed", "msg=hello world", "a='open"],
)
def test_parse_extra_vars_rejects(item: str) -> None:
    with pytest.raises(InventoryError) as info:
        parse_extra_vars([item])
    text = str(info.value)
    assert item in text
    assert "KEY=VALUE" in text or "YAML" in text
    assert info.value.hint


@pytest.mark.parametrize(
    ("content", "line", "fragment"),
    [
        (None, None, "file not found"),
        ("- a\n- b\n", None, "mapping of variable names"),
        ("a: 1\nb: [\n", 3, "invalid YAML"),
    ],
)
def test_parse_extra_vars_rejects_bad_files(
    tmp_path: Path, content: str | None, line: int | None, fragment: str
) -> None:
    path = tmp_path / "vars.yaml"
    if content is not None:
        path.write_text(content)
    with pytest.raises(InventoryError) as info:
        parse_extra_vars([f"@{path}"])
    assert info.value.source == str(path)
    assert info.value.line == line
    assert fragment in str(info.value)
    assert f"@{path}" in str(info.value)
    assert info.value.hint


def test_bad_port_from_extra_vars_is_blamed_on_e(tmp_path: Path) -> None:
    path = write(tmp_path, ONE_HOST.format(name="h"))
    with pytest.raises(InventoryError) as info:
        Inventory.load(path, {"ansible_port": 0})
    assert str(info.value).startswith("-e: host 'h': ansible_port is 0")
    assert info.value.hint


# --- bad inventories ---------------------------------------------------------------------

BAD_INVENTORIES = [
    pytest.param("all:\n  hosts:\n    a: [1, 2\n", 4, ["YAML syntax error"], id="yaml-syntax"),
    pytest.param("all:\n  hosts:\n  a:b: 1\n    c:\n", 4, ["YAML syntax error"], id="yaml-indent"),
    pytest.param("- node1\n- node2\n", 1, ["must be a YAML mapping"], id="top-level-list"),
    pytest.param("node1\n", 1, ["must be a YAML mapping", "ansible-inventory"], id="top-scalar"),
    pytest.param(
        "hosts:\n  node1:\n", 1, ["'hosts:' at the top level", "under 'all:'"], id="hosts"
    ),
    pytest.param(
        "all:\n  hosts:\n    a:\nvars:\n  x: 1\n", 4, ["'vars:' at the top", "'all:'"], id="vars"
    ),
    pytest.param("children:\n  web:\n", 1, ["'children:' at the top", "'all:'"], id="children"),
    pytest.param(
        "all:\n  hosts:\n    a:\n  varz:\n    x: 1\n",
        4,
        ["unknown key 'varz' in group 'all'", "did you mean 'vars:'?"],
        id="unknown-key-typo",
    ),
    pytest.param(
        "web:\n  hosts:\n    a:\n  chldren:\n", 4, ["did you mean 'children:'?"], id="children-typo"
    ),
    pytest.param(
        "web:\n  node1:\n", 2, ["unknown key 'node1'", "list it under 'web: hosts:'"], id="host-key"
    ),
    pytest.param("web: [a, b]\n", 1, ["group 'web' must be a mapping", "a list"], id="group-list"),
    pytest.param("web: node1\n", 1, ["group 'web' must be a mapping"], id="group-scalar"),
    pytest.param(
        "all:\n  hosts:\n    - a\n", 3, ["must be a mapping of host names", "- node1"], id="list"
    ),
    pytest.param("all:\n  hosts: a\n", 2, ["must be a mapping of host names"], id="hosts-scalar"),
    pytest.param("all:\n  hosts:\n    a: 5\n", 3, ["host 'a' must map to"], id="host-vars-int"),
    pytest.param(
        "all:\n  vars: [1]\n  hosts:\n    a:\n",
        2,
        ["vars of group 'all' must be a"],
        id="vars-list",
    ),
    pytest.param(
        "all:\n  hosts:\n    a:\n  children:\n    - web\n",
        5,
        ["children of group 'all' must be a mapping"],
        id="children-list",
    ),
    pytest.param(
        "all:\n  hosts:\n    ok:\n    node[5:1]:\n", 4, ["empty host range [5:1]"], id="empty-range"
    ),
    pytest.param(
        "all:\n  hosts:\n    rack[d:a]:\n", 3, ["empty host range", "[a:d]"], id="empty-alpha"
    ),
    pytest.param("all:\n  hosts:\n    node[1:2:\n", 3, ["unbalanced"], id="bracket"),
    pytest.param("all:\n  hosts:\n    node[x:y:z:w]:\n", 3, ["malformed host range"], id="range"),
    pytest.param(
        "all:\n  hosts:\n    a:\n      ansible_port: abc\n",
        4,
        ["host 'a': ansible_port is 'abc', not a port", "1 to 65535"],
        id="port-text",
    ),
    pytest.param(
        "all:\n  hosts:\n    a:\n      ansible_port: 0\n", 4, ["ansible_port is 0"], id="port-0"
    ),
    pytest.param(
        "all:\n  hosts:\n    a:\n      ansible_port: 65536\n", 4, ["65536"], id="port-too-big"
    ),
    pytest.param(
        "all:\n  hosts:\n    a:\n      ansible_port: yes\n", 4, ["is True"], id="port-bool"
    ),
    pytest.param("all:\n  hosts:\n    a:70000:\n", 3, ["is 70000"], id="port-in-key"),
    pytest.param(
        "all:\n  vars:\n    ansible_ssh_port: 2.5\n  children:\n    w:\n      hosts:\n        a:\n",
        3,
        ["host 'a': ansible_ssh_port is 2.5"],
        id="port-inherited-from-all",
    ),
    pytest.param(
        "w:\n  vars:\n    ansible_ssh_common_args: -o Port=http\n  hosts:\n    a:\n",
        3,
        ["ansible_ssh_common_args sets Port to 'http'"],
        id="port-in-ssh-args",
    ),
    pytest.param(
        "all:\n  hosts:\n    a:\n      x: 1\n      y: 2\n      x: 3\n",
        6,
        ["duplicate key 'x' in host 'a' (first written at line 4)", "keep one"],
        id="duplicate-var",
    ),
    pytest.param(
        "all:\n  hosts:\n    a:\n    b:\n    a:\n", 5, ["duplicate key 'a'"], id="duplicate-host"
    ),
    pytest.param(
        "web:\n  hosts:\n    a:\nweb:\n  hosts:\n    b:\n",
        4,
        ["duplicate key 'web' in the top level"],
        id="duplicate-group",
    ),
    pytest.param(
        "all:\n  hosts:\n    a:\n      opts:\n        k: 1\n        k: 2\n",
        6,
        ["duplicate key 'k' (first written at line 5)"],
        id="duplicate-nested",
    ),
    pytest.param(
        "all:\n  hosts:\n    a: {ansible_host: 10.0.0.1}\nweb:\n  hosts:\n    b:\n"
        "    a:\n      ansible_host: 10.0.0.9\n",
        8,
        ["host 'a' sets ansible_host to '10.0.0.9' here, but to '10.0.0.1' at line 3"],
        id="host-conflict",
    ),
    pytest.param(
        "all:\n  hosts:\n    n[1:3]: {role: a}\n    n2: {role: b}\n",
        4,
        ["host 'n2' sets role to 'b' here, but to 'a' at line 3"],
        id="host-conflict-range",
    ),
    pytest.param(
        "all:\n  hosts:\n    a: {x: 1}\n    a:2222: {x: true}\n",
        4,
        ["sets x to True here, but to 1 at line 3"],
        id="host-conflict-type",
    ),
    pytest.param("all:\n  children:\n    web:\n", 1, ["defines no hosts"], id="no-hosts"),
    pytest.param("", 1, ["empty"], id="empty-file"),
    pytest.param("# just a comment\n", 1, ["empty"], id="comment-only"),
    pytest.param(
        "all:\n  hosts:\n    a:\n      ansible_connection: docker\n",
        4,
        ["ansible_connection 'docker' is not supported", "ssh, local, paramiko, smart"],
        id="connection",
    ),
    pytest.param(
        "w:\n  vars:\n    ansible_connection: ansible.builtin.local\n  hosts:\n    a:\n",
        3,
        ["'ansible.builtin.local' is not supported", "ansible_connection: local"],
        id="connection-fqcn",
    ),
    pytest.param(
        "a:\n  hosts:\n    h:\n  children:\n    b:\n      children:\n        a:\n",
        7,
        ["group cycle: a -> b -> a", "remove 'a' from the children of 'b'"],
        id="cycle",
    ),
    pytest.param(
        "a:\n  hosts:\n    h:\n  children:\n    a:\n", 5, ["group cycle: a -> a"], id="self-cycle"
    ),
    pytest.param(
        "web:\n  hosts:\n    h:\n  children:\n    all:\n", 5, ["'all' cannot be a child"], id="all"
    ),
    pytest.param(
        "web:\n  children:\n    hosts:\n      h:\n",
        3,
        ["'hosts' cannot be a child group", "next to 'children:'"],
        id="hosts-under-children",
    ),
    pytest.param(
        "web:\n  vars:\n    ansible_group_priority: high\n  hosts:\n    h:\n",
        3,
        ["ansible_group_priority must be an integer"],
        id="priority",
    ),
    pytest.param(
        "all:\n  hosts:\n    a:\n      bad-name: 1\n", 4, ["invalid variable name"], id="var-name"
    ),
    pytest.param(
        "all:\n  hosts:\n    a:\n      pw: !vault |\n        0123\n",
        4,
        ["could not determine a constructor", "!vault"],
        id="vault",
    ),
]


@pytest.mark.parametrize(("text", "line", "fragments"), BAD_INVENTORIES)
def test_bad_inventory(tmp_path: Path, text: str, line: int, fragments: list[str]) -> None:
    path, error = load_error(tmp_path, text)
    message = assert_points_at(error, path, line)
    for fragment in fragments:
        assert fragment in message


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(InventoryError) as info:
        Inventory.load(path)
    text = assert_points_at(info.value, path, None)
    assert "inventory file not found" in text
    assert "-i" in (info.value.hint or "")
    assert ENV_VAR in (info.value.hint or "")


def test_directory_instead_of_file(tmp_path: Path) -> None:
    with pytest.raises(InventoryError) as info:
        Inventory.load(tmp_path)
    assert "is a directory" in assert_points_at(info.value, tmp_path, None)


def test_a_host_range_up_to_the_bound_expands_and_beyond_is_refused() -> None:
    from cpuaccel.inventory.patterns import MAX_RANGE_HOSTS

    names = expand_host_pattern(f"n[1:{MAX_RANGE_HOSTS}]")
    assert len(names) == MAX_RANGE_HOSTS and names[-1] == f"n{MAX_RANGE_HOSTS}"
    with pytest.raises(InventoryError, match="expands to 10,001 names"):
        expand_host_pattern(f"n[0:{MAX_RANGE_HOSTS}]")
    # Each range within the bound, their product beyond it: refused before it is built.
    with pytest.raises(InventoryError, match="expands to 1,000,000 names"):
        expand_host_pattern("r[1:1000]n[1:1000]")
