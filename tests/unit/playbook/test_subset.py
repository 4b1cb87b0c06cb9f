"""The playbook subset: task and play keywords outside it are errors at their line (and
the documentation's table names each), Ansible's booleans are read as Ansible reads
them, and hosts given as a list of patterns are their comma list."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from cpuaccel.errors import PlaybookError
from cpuaccel.playbook import loader

REFUSED = [
    ("      delegate_to: localhost\n", "delegate_to: not supported by cpuaccel", 5),
    ("      notify: restart\n", "notify: not supported by cpuaccel (no handlers)", 5),
    ("      until: r is succeeded\n", "until: not supported by cpuaccel (no retry loop)", 5),
    ("      async: 60\n", "async: not supported by cpuaccel", 5),
    ("      no_log: true\n", "no_log: not supported by cpuaccel", 5),
    ("      with_dict: {a: 1}\n", "with_dict: not supported by cpuaccel (only with_items)", 5),
    ("      loop: [1]\n      loop_control: {label: x}\n", "loop_control.label: not supp", 6),
    ("      ignore_errors: maybe\n", "ignore_errors: takes true or false, got 'maybe'", 5),
    ("      run_once: '{{ x }}'\n", "run_once: takes true or false", 5),
    ("      debug: {msg: '{{ x | to_yaml }}'}\n", "the filter 'to_yaml' is not supported", 5),
    ("      when: x is version('1', '>')\n", "the test 'version' is not supported", 5),
    ("      debug: {msg: \"{{ lookup('env', 'HOME') }}\"}\n", "lookup() is not supported", 5),
    ("      ansible.builtin.debug: {msg: hi}\n", "cpuaccel's modules have no collection prefix", 5),
]


@pytest.mark.parametrize(("extra", "words", "line"), REFUSED)
def test_task_keywords_outside_the_subset_are_errors_at_their_line(
    tmp_path: Path, extra: str, words: str, line: int
) -> None:
    book = "- hosts: all\n  tasks:\n    - name: t\n      command: 'true'\n" + extra
    if "debug:" in extra and "builtin" not in extra:
        book = "- hosts: all\n  tasks:\n    - name: t\n      tags: [a]\n" + extra
    path = tmp_path / "site.yaml"
    path.write_text(book)
    with pytest.raises(PlaybookError) as info:
        loader.load(path)
    assert words in info.value.message and f"site.yaml:{line}:" in info.value.message


@pytest.mark.parametrize(
    ("play_line", "words"),
    [
        ("  serial: 1\n", "serial: not supported by cpuaccel (no batches)"),
        ("  handlers: []\n", "handlers: not supported by cpuaccel (no handlers)"),
        ("  vars_files: [x.yml]\n", "vars_files: not supported by cpuaccel"),
        ("  environment: {A: b}\n", "environment: cpuaccel takes it on tasks, not on plays"),
        ("  gather_facts: sometimes\n", "gather_facts: takes true or false"),
        ("  roles: [common]\n", "roles: not supported by cpuaccel (no roles)"),
    ],
)
def test_play_keywords_outside_the_subset_are_errors(
    tmp_path: Path, play_line: str, words: str
) -> None:
    path = tmp_path / "site.yaml"
    path.write_text("- hosts: all\n" + play_line + "  tasks: []\n")
    with pytest.raises(PlaybookError) as info:
        loader.load(path)
    assert words in info.value.message and "site.yaml:2:" in info.value.message


def test_ansible_booleans_are_read_as_ansible_reads_them(tmp_path: Path) -> None:
    path = tmp_path / "site.yaml"
    path.write_text(
        textwrap.dedent(
            """\
            - hosts: all
              gather_facts: "no"
              tasks:
                - command: 'true'
                  ignore_errors: "no"
                  run_once: "yes"
                  check_mode: off
                  loop: [1]
                  loop_control: {loop_var: n}
            """
        )
    )
    (play,) = loader.load(path).plays
    (task,) = play.tasks
    assert play.gather_facts is False
    assert (task.ignore_errors, task.run_once, task.check_mode, task.loop_var) == (
        False,
        True,
        False,
        "n",
    )


def test_hosts_as_a_list_of_patterns_is_their_comma_list(tmp_path: Path) -> None:
    path = tmp_path / "site.yaml"
    path.write_text("- hosts: [workers, '!node2']\n  tasks: []\n")
    (play,) = loader.load(path).plays
    assert play.hosts == "workers,!node2"


def test_the_docs_table_names_every_refused_keyword() -> None:
    from cpuaccel.playbook.subset import PLAY_KEYS, REFUSED, TASK_KEYS

    page = (Path(__file__).parents[3] / "docs" / "provision.md").read_text()
    section = page.split("\n## Playbook subset\n", 1)[1].split("\n## ", 1)[0]
    for key in [*REFUSED, *PLAY_KEYS, *TASK_KEYS]:
        assert f"`{key}`" in section, key
