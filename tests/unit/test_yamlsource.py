"""The one YAML reader behind the inventory, the project file and the playbook: '<<'
merge keys, duplicate keys and syntax errors behave the same in all three."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cpuaccel.config.project_choice import load_config
from cpuaccel.errors import (
    EXIT_USAGE,
    InventoryError,
    PlaybookError,
    ProjectFileError,
    SourceError,
)
from cpuaccel.inventory.inventory import Inventory, Origin, parse_extra_vars
from cpuaccel.playbook import loader


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


# --- '<<' merge keys in each file kind ------------------------------------------------


def test_merge_keys_in_an_inventory(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "inventory.yaml",
        """
        all:
          vars:
            ssh: &ssh
              ansible_user: train
              ansible_port: 2200
            other: &other
              ansible_user: other
              cpuaccel_ppn: 4
          hosts:
            a:
              <<: [*ssh, *other]
              ansible_port: 2201
            b:
              <<: *other
        """,
    )
    inv = Inventory.load(path)
    a, b = inv.hosts["a"], inv.hosts["b"]
    # Of a list of merged mappings the first wins; a key written beside '<<' wins over all.
    assert (a.user, a.port, a.vars["cpuaccel_ppn"]) == ("train", 2201, 4)
    assert (b.user, b.vars["cpuaccel_ppn"]) == ("other", 4)
    # A merged value was written at the anchor.
    assert inv.origin("a", "ansible_user") == Origin(str(path), 4)
    assert inv.origin("a", "ansible_port") == Origin(str(path), 12)


def test_merge_keys_in_a_group_and_in_extra_vars(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "inventory.yaml",
        """
        web:
          hosts:
            w1:
          vars:
            <<: {nproc: 2, x: 1}
            x: 3
        """,
    )
    assert {"nproc": 2, "x": 3}.items() <= Inventory.load(path).hosts["w1"].vars.items()
    vars_file = write(tmp_path, "vars.yaml", "base: &b {a: 1, b: 2}\nmine:\n  <<: *b\n  b: 5\n")
    assert parse_extra_vars([f"@{vars_file}"])["mine"] == {"a": 1, "b": 5}


def test_merge_keys_in_a_project_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "cpuaccel.yaml",
        """
        <<: &defaults
          ppn: 2
          nodes: 1
        nodes: 2
        env:
          <<: {OMP_NUM_THREADS: 4, A: x}
          A: y
        """,
    )
    config = load_config(path)
    assert (config.get("ppn"), config.lines["ppn"]) == (2, 2)
    assert (config.get("nodes"), config.lines["nodes"]) == (2, 4)
    assert config.get("env") == {"OMP_NUM_THREADS": "4", "A": "y"}


def test_merge_keys_in_an_accelerate_config(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "default_config.yaml",
        """
        base: &base
          num_machines: 1
          num_processes: 4
        compute_environment: LOCAL_MACHINE
        distributed_type: MULTI_CPU
        <<: *base
        """,
    )
    config = load_config(path)
    assert (config.get("nodes"), config.get("ppn")) == (1, 4)


def test_merge_keys_in_a_playbook(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "play.yaml",
        """
        - hosts: all
          tasks:
            - &say
              name: say
              command: echo hi
              tags: [a]
            - <<: *say
              name: say again
        """,
    )
    first, second = loader.load(path).tasks()
    # 'name' written beside '<<' is not a duplicate of the merged one: it wins.
    assert (second.name, second.module, second.args) == ("say again", "command", first.args)
    assert second.line == 7 and second.tags == {"a"}


# --- errors: the same wording and file:line in every file kind -------------------------

Loader = Callable[[Path], Any]


def _inventory(path: Path) -> Any:
    return Inventory.load(path)


def _extra_vars(path: Path) -> Any:
    return parse_extra_vars([f"@{path}"])


KINDS: list[Any] = [
    pytest.param(
        "inventory.yaml", "all:\n  hosts:\n    a:\n", _inventory, InventoryError, id="inventory"
    ),
    pytest.param("vars.yaml", "", _extra_vars, InventoryError, id="extra-vars"),
    pytest.param("cpuaccel.yaml", "", load_config, ProjectFileError, id="project"),
    pytest.param(
        "play.yaml",
        "- hosts: all\n  tasks:\n    - command: 'true'\n",
        loader.load,
        PlaybookError,
        id="playbook",
    ),
]


def _error(path: Path, load: Loader, kind: type[SourceError]) -> SourceError:
    with pytest.raises(kind) as info:
        load(path)
    error = info.value
    assert isinstance(error, SourceError) and error.exit_code == EXIT_USAGE
    assert error.source == str(path) and error.hint
    return error


@pytest.mark.parametrize(("name", "prefix", "load", "kind"), KINDS)
def test_a_nested_duplicate_key_is_the_same_error_everywhere(
    tmp_path: Path, name: str, prefix: str, load: Loader, kind: type[SourceError]
) -> None:
    # A mapping inside a value, where each file kind leaves reading to the shared reader.
    lines = prefix.count("\n")
    field = "      env:\n" if name == "inventory.yaml" else "env:\n"
    pad = "        " if name == "inventory.yaml" else "  "
    if name == "play.yaml":
        field, pad = "      environment:\n", "        "
    text = f"{prefix}{field}{pad}K: 1\n{pad}J: 2\n{pad}K: 3\n"
    path = tmp_path / name
    path.write_text(text)
    error = _error(path, load, kind)
    assert str(error).startswith(
        f"{path}:{lines + 4}: duplicate key 'K' (first written at line {lines + 2})"
    )
    assert "keep one of them" in str(error)


@pytest.mark.parametrize(("name", "prefix", "load", "kind"), KINDS)
def test_a_syntax_error_names_file_and_line_everywhere(
    tmp_path: Path, name: str, prefix: str, load: Loader, kind: type[SourceError]
) -> None:
    path = tmp_path / name
    indent = "      " if name == "play.yaml" else ""
    path.write_text(f"{prefix}{indent}x: [1, 2\n")
    error = _error(path, load, kind)
    assert error.line == prefix.count("\n") + 2
    assert "YAML syntax error" in str(error) or "invalid YAML" in str(error)


@pytest.mark.parametrize(("name", "prefix", "load", "kind"), KINDS)
def test_a_bad_merge_key_is_an_error_at_its_line(
    tmp_path: Path, name: str, prefix: str, load: Loader, kind: type[SourceError]
) -> None:
    path = tmp_path / name
    indent = "      " if name == "play.yaml" else ""
    path.write_text(f"{prefix}{indent}<<: 5\n")
    error = _error(path, load, kind)
    assert error.line == prefix.count("\n") + 1
    assert "a '<<' merge key takes a mapping or a list of mappings, got the value '5'" in str(error)


def test_a_mapping_merging_itself_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, "vars.yaml", "a: &a\n  x: 1\n  <<: *a\n")
    error = _error(path, _extra_vars, InventoryError)
    assert "merges the mapping that contains it" in str(error)


def test_the_three_errors_are_siblings() -> None:
    assert not issubclass(PlaybookError, InventoryError)
    assert not issubclass(ProjectFileError, InventoryError)
    for kind in (InventoryError, ProjectFileError, PlaybookError):
        error = kind("bad", source="f.yaml", line=3, hint="fix it")
        assert isinstance(error, SourceError)
        assert str(error) == "f.yaml:3: bad\n  fix: fix it"


def test_an_inline_extra_vars_mapping_names_its_item() -> None:
    with pytest.raises(InventoryError) as info:
        parse_extra_vars(["{a: 1, a: 2}"])
    assert str(info.value).startswith("-e '{a: 1, a: 2}': duplicate key 'a'")
    assert parse_extra_vars(["{<<: {a: 1, b: 1}, b: 2}"]) == {"a": 1, "b": 2}


# --- bounds against hostile files (the refusals are cases of tests/hostile/) ----------


def test_aliases_used_often_but_within_the_budget_still_load() -> None:
    from cpuaccel.yamlsource import ALIAS_ALLOWANCE, YamlReader

    # 2,000 hosts sharing one 20-key anchored mapping: 40,000 values read through aliases.
    lines = ["base: &base {" + ", ".join(f"k{i}: {i}" for i in range(20)) + "}"]
    lines += [f"h{n}: *base" for n in range(2000)]
    data = YamlReader("f.yaml", InventoryError).load("\n".join(lines))
    assert len(data) == 2001 and data["h1999"]["k19"] == 19
    assert ALIAS_ALLOWANCE > 2000 * 21


def test_the_alias_budget_is_per_read_not_per_reader() -> None:
    from cpuaccel.yamlsource import ALIAS_ALLOWANCE, YamlReader

    reader = YamlReader("f.yaml", InventoryError)
    text = "a: &a [" + ", ".join(["x"] * 1000) + "]\nb: [" + ", ".join(["*a"] * 60) + "]\n"
    for _ in range(3):  # 60,000 values each time: a fresh compose() restores the budget
        assert len(reader.load(text)["b"]) == 60
    assert 60 * 1000 < ALIAS_ALLOWANCE < 3 * 60 * 1000


def test_nesting_up_to_the_bound_loads_and_beyond_is_an_error_at_its_line() -> None:
    from cpuaccel.yamlsource import MAX_DEPTH, YamlReader

    reader = YamlReader("f.yaml", InventoryError)
    deep = MAX_DEPTH - 2  # the root mapping is a level, and so is the scalar 1
    expected: Any = 1
    for _ in range(deep):
        expected = [expected]
    assert reader.load(f"x: {'[' * deep}1{']' * deep}\n") == {"x": expected}
    with pytest.raises(InventoryError) as info:
        reader.load("a: 1\nx: " + "[" * (MAX_DEPTH + 5) + "]" * (MAX_DEPTH + 5) + "\n")
    assert info.value.line == 2
    assert f"nested more than {MAX_DEPTH} levels deep" in str(info.value)
