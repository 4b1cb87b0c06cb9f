"""The playbook loader and templar: every bad playbook is one error with file and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from cpuaccel import templating
from cpuaccel.errors import PlaybookError
from cpuaccel.playbook import loader, templar
from cpuaccel.playbook.argspec import Where
from cpuaccel.playbook.loader import Task
from cpuaccel.playbook.modules import MODULES, normalise
from cpuaccel.playbook.strategy import default_playbook, selected

GOOD = """\
- name: demo
  hosts: all
  vars:
    greeting: hi
  tasks:
    - name: say
      command: echo {{ greeting }}
      register: said
      changed_when: false
    - name: dir
      file:
        path: /tmp/x
        state: directory
        mode: "0755"
      when: said is succeeded
      tags: [files]
    - name: loop
      debug:
        msg: "{{ item }}"
      loop: [1, 2]
"""

# (playbook text, words the message must contain, line it must name)
BAD = [
    (
        "- hosts: all\n  tasks:\n    - name: x\n      frobnicate: {a: 1}\n",
        "unknown module 'frobnicate'",
        4,
    ),
    (
        "- hosts: all\n  tasks:\n    - name: x\n      copy:\n        dest: /x\n        content: a\n        bogus: 1\n",
        "unsupported argument 'bogus'",
        7,
    ),
    (
        "- hosts: all\n  tasks:\n    - name: x\n      command: true\n      shell: true\n",
        "has two modules: command, shell",
        5,
    ),
    (
        "- hosts: all\n  tasks:\n    - name: x\n      template:\n        src: nope.j2\n        dest: /x\n",
        "template 'nope.j2' not found",
        4,
    ),
    (
        "- hosts: all\n  tasks:\n    - name: x\n      command: true\n      when: x ==\n",
        "when: cannot parse",
        5,
    ),
    (
        "- hosts: all\n  tasks:\n    - name: x\n      file: {state: directory}\n",
        "needs the argument 'path'",
        4,
    ),
    (
        "- hosts: all\n  tasks:\n    - name: x\n      file: {path: /x, state: dir}\n",
        "state must be one of",
        4,
    ),
    ("- hosts: all\n  tasks:\n    - name: x\n      file: {path: /x, mode: rwx}\n", "octal mode", 4),
    ("- hosts: all\n  hosts: web\n  tasks: []\n", "duplicate key 'hosts'", 2),
    (
        "- hosts: all\n  tasks:\n    - name: x\n      command: [unclosed\n",
        "YAML syntax error",
        None,
    ),
    ("hosts: all\n", "a playbook is a list of plays", 1),
    ("- hosts: all\n  roles: [x]\n", "roles: not supported by cpuaccel (no roles)", 2),
    ("- hosts: all\n  frobnicate: [x]\n", "unknown play keyword 'frobnicate'", 2),
    ("- name: p\n  tasks: []\n", "has no 'hosts:'", 1),
    ("- hosts: all\n  tasks:\n    - name: lonely\n", "has no module", 3),
    (
        "- hosts: all\n  tasks:\n    - name: x\n      assert: {that: ['a =']}\n",
        "that: cannot parse",
        4,
    ),
    (
        "- hosts: all\n  tasks:\n    - name: x\n      debug: {msg: '{{ broken'}\n",
        "cannot parse",
        4,
    ),
    (
        "- hosts: all\n  tasks:\n    - name: x\n      copy: {dest: /x}\n",
        "copy needs src or content",
        4,
    ),
    (
        "- hosts: all\n  tasks:\n    - name: x\n      file: {path: /x}\n      environment: {A: b}\n",
        "applies to command, shell and pip only",
        5,
    ),
]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "play.yaml"
    path.write_text(text)
    return path


def test_good_playbook_loads_with_lines(tmp_path: Path) -> None:
    book = loader.load(write(tmp_path, GOOD))
    (play,) = book.plays
    assert play.name == "demo" and play.hosts == "all" and play.vars == {"greeting": "hi"}
    say, directory, loop = play.tasks
    assert (say.module, say.args, say.line) == ("command", {"cmd": "echo {{ greeting }}"}, 6)
    assert say.register == "said" and say.changed_when == ("False",)
    assert directory.when == ("said is succeeded",) and directory.tags == {"files"}
    assert directory.where == f"{book.path}:10"
    assert loop.loop == [1, 2]


@pytest.mark.parametrize(("text", "words", "line"), BAD)
def test_bad_playbook_is_one_error_naming_file_and_line(
    tmp_path: Path, text: str, words: str, line: int | None
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(PlaybookError) as info:
        loader.load(path)
    assert words in info.value.message
    assert info.value.source == str(path)
    if line is not None:
        assert info.value.line == line
    assert info.value.hint


def test_missing_playbook_file(tmp_path: Path) -> None:
    with pytest.raises(PlaybookError, match="playbook not found"):
        loader.load(tmp_path / "nope.yaml")


def test_default_playbook_is_valid() -> None:
    book = loader.load(default_playbook())
    modules = {task.module for task in book.tasks()}
    assert {"wheelhouse", "synchronize", "pip", "setvars", "alike", "assert"} <= modules


def test_templar_keeps_types_and_refuses_undefined() -> None:
    variables = {"pkgs": ["a", "b"], "n": 2, "name": "x"}
    assert templar.render("{{ pkgs }}", variables) == ["a", "b"]
    assert templar.render("{{ n + 1 }}", variables) == 3
    assert templar.render("v{{ n }}-{{ name }}", variables) == "v2-x"
    assert templar.render({"a": ["{{ name }}"]}, variables) == {"a": ["x"]}
    with pytest.raises(templating.TemplateError, match="undefined variable"):
        templar.render("{{ missing }}/bin", variables)
    assert templar.condition("n == 2", variables) is True
    assert templar.condition("{{ n == 3 }}", variables) is False
    assert templar.condition("r is changed", {"r": {"changed": True}}) is True
    assert templar.condition("r is succeeded", {"r": {"failed": True}}) is False
    assert templar.render("{{ 'a b' | quote }}", {}) == "'a b'"
    assert templar.render("{{ x | default('d') }}", {}) == "d"


def test_templar_is_sandboxed() -> None:
    with pytest.raises(templating.TemplateError):
        templar.render("{{ ''.__class__.__mro__[1].__subclasses__() }}", {})


def test_normalise_coerces_and_checks() -> None:
    args = normalise(MODULES["file"], {"dest": "/x", "state": "directory", "mode": "0750"})
    assert args == {"path": "/x", "state": "directory", "mode": 0o750}
    args = normalise(MODULES["pip"], {"name": "a, b", "no_index": "yes"})
    assert args["name"] == ["a", "b"] and args["no_index"] is True
    assert normalise(MODULES["copy"], {"dest": "/x", "content": "y"})["force"] is True


def test_a_module_spec_checks_its_own_arguments(tmp_path: Path) -> None:
    where = Where(str(tmp_path / "play.yaml"), 7, "task 'x'", tmp_path, {"bogus": 9})
    with pytest.raises(PlaybookError) as info:
        MODULES["copy"].validate({"dest": "/x"}, where)
    assert "task 'x': copy needs src or content" in info.value.message
    assert (info.value.line, info.value.hint) == (7, MODULES["copy"].one_of[0].hint)
    with pytest.raises(PlaybookError, match="unsupported argument 'bogus'") as info:
        MODULES["copy"].validate({"dest": "/x", "content": "a", "bogus": 1}, where)
    assert info.value.line == 9
    with pytest.raises(PlaybookError, match=r"template 't\.j2' not found"):
        MODULES["template"].validate({"src": "t.j2", "dest": "/x"}, where)
    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "t.j2").write_text("{{ x }}")
    MODULES["template"].validate({"src": "t.j2", "dest": "/x"}, where)
    with pytest.raises(PlaybookError, match="that: cannot parse"):
        MODULES["assert"].validate({"that": ["a ="]}, where)


@pytest.mark.parametrize(
    ("task_tags", "tags", "skip", "runs"),
    [
        (set(), set(), set(), True),
        ({"a"}, {"b"}, set(), False),
        ({"a"}, {"a"}, set(), True),
        ({"always"}, {"b"}, set(), True),
        ({"always"}, set(), {"always"}, False),
        ({"never"}, set(), set(), False),
        ({"never", "x"}, {"x"}, set(), True),
        ({"a"}, set(), {"a"}, False),
    ],
)
def test_tag_selection_follows_ansible(
    task_tags: set[str], tags: set[str], skip: set[str], runs: bool
) -> None:
    task = Task("t", "debug", {}, "f", 1, tags=frozenset(task_tags))
    assert selected(task, frozenset(tags), frozenset(skip)) is runs


def test_loops_over_an_expression_and_public_attributes_still_load(tmp_path: Path) -> None:
    # The load-time refusals (tests/hostile/playbook/) must not catch what is fine.
    text = """\
- hosts: all
  vars:
    names: [a, b]
    conf: {port: 1}
  tasks:
    - debug: {msg: "{{ item }} {{ conf.port }} {{ conf['port'] }} {{ _local | default(1) }}"}
      loop: "{{ names }}"
      register: said_1
    - debug: {msg: hi}
      with_items: [1, 2]
"""
    book = loader.load(write(tmp_path, text))
    tasks = book.plays[0].tasks
    assert tasks[0].loop == "{{ names }}" and tasks[0].register == "said_1"
    assert tasks[1].loop == [1, 2]
    with pytest.raises(templating.TemplateError, match="private attribute '__class__'"):
        templar.check_expression("conf['__class__']")


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("'yes' | bool", True),
        ("'Off' | bool", False),
        ("1 | bool", True),
        ("none | bool", False),
        ("n", True),  # n == 2: a number's truth, as Jinja's
        ("'false'", False),
        ("[]", False),
    ],
)
def test_bool_and_conditions_read_the_boolean_spellings(expr: str, expected: bool) -> None:
    assert templar.condition(expr, {"n": 2}) is expected


@pytest.mark.parametrize("expr", ["'ture' | bool", "'enabled'", "2 | bool"])
def test_a_word_that_is_no_boolean_is_an_error_not_false(expr: str) -> None:
    with pytest.raises(templating.TemplateError, match="not a boolean"):
        templar.condition(expr, {})
