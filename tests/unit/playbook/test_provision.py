"""`cpuaccel provision` end to end on this machine (ansible_connection: local).

The same runner, agent and modules as over SSH; the cluster tests add what only many
real nodes show (per-host templates, a node failing alone, the default playbook).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from cpuaccel.errors import EXIT_NODE_FAILED, EXIT_USAGE
from testsupport.command import cpuaccel

PLAYBOOK = """\
- name: every module
  hosts: all
  vars:
    root: "{{ base }}/tree"
  tasks:
    - name: a directory
      file: {path: "{{ root }}/etc", state: directory, mode: "0750"}
    - name: a file from content
      copy: {dest: "{{ root }}/etc/motd", content: "hello {{ inventory_hostname }}\\n", mode: "0640"}
    - name: a file from src
      copy: {src: data.txt, dest: "{{ root }}/etc/"}
    - name: a template
      template: {src: conf.j2, dest: "{{ root }}/etc/app.conf"}
    - name: run once, then never again
      command:
        argv: [touch, "{{ root }}/made-by-command"]
        creates: "{{ root }}/made-by-command"
    - name: a shell pipeline that reports no change
      shell: echo one two | wc -w
      register: words
      changed_when: false
      check_mode: false
    - name: what the pipeline said
      assert:
        that: ["words.stdout | trim == '2'", "words is succeeded"]
    - name: look at a path
      stat: {path: "{{ root }}/etc/motd"}
      register: motd
    - name: facts from results
      set_fact:
        motd_mode: "{{ motd.stat.mode | default('none') }}"
    - name: loop and when
      file: {path: "{{ root }}/{{ item }}", state: directory}
      loop: [a, b, c]
      when: item != 'b'
    - name: skipped by when
      command: "false"
      when: motd_mode != '0640'
    - name: touch without changing times
      file: {path: "{{ root }}/stamp", state: touch, modification_time: preserve, access_time: preserve}
    - name: tagged away
      command: touch {{ root }}/tagged
      tags: [never, extra]
    - name: a message
      debug: {msg: "mode is {{ motd_mode }}"}
"""


def provision(
    tmp_path: Path, *args: str, playbook: str | None = None
) -> subprocess.CompletedProcess[str]:
    inventory = tmp_path / "inventory.yaml"
    if not inventory.exists():
        inventory.write_text(
            "all:\n  hosts:\n    local0:\n      ansible_connection: local\n"
            f"      ansible_python_interpreter: {sys.executable}\n"
            f"      cpuaccel_python: {sys.executable}\n"
            f"  vars:\n    base: {tmp_path}\n"
        )
    book = tmp_path / "play.yaml"
    book.write_text(playbook if playbook is not None else PLAYBOOK)
    (tmp_path / "files").mkdir(exist_ok=True)
    (tmp_path / "files" / "data.txt").write_text("data\n")
    (tmp_path / "templates").mkdir(exist_ok=True)
    (tmp_path / "templates" / "conf.j2").write_text(
        "host={{ inventory_hostname }} root={{ root }}\n"
    )
    return cpuaccel("provision", str(inventory), "--playbook", str(book), *args, timeout=120)


def as_json(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert proc.returncode in (0, EXIT_NODE_FAILED), proc.stderr
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


def statuses(report: dict[str, Any], host: str = "local0") -> dict[str, str]:
    return {
        task["task"]: task["hosts"][host]["status"]
        for play in report["plays"]
        for task in play["tasks"]
        if host in task["hosts"]
    }


def test_every_module_then_a_rerun_changes_nothing(tmp_path: Path) -> None:
    first = as_json(provision(tmp_path, "--json"))
    assert first["ok"], first
    done = statuses(first)
    assert done["a directory"] == "changed"
    assert done["a template"] == "changed"
    assert done["a shell pipeline that reports no change"] == "ok"
    assert done["skipped by when"] == "skipped"
    assert "tagged away" not in done
    root = tmp_path / "tree"
    assert (root / "etc" / "motd").read_text() == "hello local0\n"
    assert oct((root / "etc" / "motd").stat().st_mode & 0o777) == "0o640"
    assert oct((root / "etc").stat().st_mode & 0o777) == "0o750"
    assert (root / "etc" / "data.txt").read_text() == "data\n"
    assert (root / "etc" / "app.conf").read_text() == f"host=local0 root={root}\n"
    assert sorted(p.name for p in root.iterdir()) == ["a", "c", "etc", "made-by-command", "stamp"]
    loop = next(t for p in first["plays"] for t in p["tasks"] if t["task"] == "loop and when")
    assert [r.get("skipped", False) for r in loop["hosts"]["local0"]["results"]] == [
        False,
        True,
        False,
    ]

    second = as_json(provision(tmp_path, "--json"))
    assert second["ok"]
    assert second["stats"]["local0"]["changed"] == 0, statuses(second)
    assert second["stats"]["local0"]["failed"] == 0


def test_check_mode_changes_nothing_and_reports_changes(tmp_path: Path) -> None:
    report = as_json(provision(tmp_path, "--check", "--json"))
    assert report["check"] and report["ok"]
    assert report["stats"]["local0"]["changed"] >= 4
    assert not (tmp_path / "tree").exists()


def test_diff_shows_the_template_change(tmp_path: Path) -> None:
    assert provision(tmp_path).returncode == 0
    (tmp_path / "tree" / "etc" / "app.conf").write_text("host=old\n")
    proc = provision(tmp_path, "--diff")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "-host=old" in proc.stdout
    assert f"+host=local0 root={tmp_path / 'tree'}" in proc.stdout
    assert "PLAY RECAP" in proc.stdout
    assert "local0 : ok=" in proc.stdout and "changed=1 " in proc.stdout


def test_tags_select_tasks(tmp_path: Path) -> None:
    report = as_json(provision(tmp_path, "--tags", "extra", "--json"))
    assert list(statuses(report)) == ["Gathering Facts", "tagged away"]
    assert (tmp_path / "tree" / "tagged").exists() is False  # the folder does not exist yet
    assert report["ok"] is False  # touch fails: the tree was never created


def test_a_failing_task_fails_the_host_with_its_message_and_exit_69(tmp_path: Path) -> None:
    book = """\
- hosts: all
  tasks:
    - name: breaks
      shell: echo oops >&2; exit 3
    - name: never reached
      command: "true"
"""
    proc = provision(tmp_path, playbook=book)
    assert proc.returncode == EXIT_NODE_FAILED
    assert "failed: local0" in proc.stdout and "oops" in proc.stdout
    assert "never reached" not in proc.stdout
    assert "local0 : ok=1 changed=0 unreachable=0 failed=1" in proc.stdout
    assert "Traceback" not in proc.stderr


def test_undefined_variable_names_task_and_host(tmp_path: Path) -> None:
    book = "- hosts: all\n  tasks:\n    - name: uses a typo\n      command: echo {{ nmae }}\n"
    report = as_json(provision(tmp_path, "--json", playbook=book))
    result = report["plays"][0]["tasks"][1]["hosts"]["local0"]
    assert result["status"] == "failed"
    assert "play.yaml:3" in result["msg"] and "nmae" in result["msg"]


def test_expressions_that_would_exhaust_the_controller_fail_their_task(tmp_path: Path) -> None:
    """`{{ 'a' * 4000000000 }}` allocated 4 GB, and a catastrophic regex_replace in a
    template ran for hours: each is now its task's failure, naming the playbook's line
    (or the template file) and the fix."""
    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "slow.j2").write_text(
        "{{ ('a' * 40 ~ '!') | regex_replace('(a+)+$', '') }}\n"
    )
    book = (
        "- hosts: all\n  gather_facts: false\n  tasks:\n"
        "    - name: a huge message\n"
        "      debug: {msg: \"{{ 'a' * 4000000000 }}\"}\n"
        "      ignore_errors: true\n"
        "    - name: a slow template\n"
        "      template: {src: slow.j2, dest: '{{ base }}/out.txt'}\n"
    )
    started = time.monotonic()
    report = as_json(provision(tmp_path, "--json", playbook=book))
    assert time.monotonic() - started < 60
    tasks = {t["task"]: t["hosts"]["local0"] for t in report["plays"][0]["tasks"]}
    huge, slow = tasks["a huge message"], tasks["a slow template"]
    assert huge["status"] == "ignored"
    assert f"{tmp_path}/play.yaml:4: " in huge["msg"]
    assert "str * 4000000000 would be more than" in huge["msg"] and "16 MiB" in huge["hint"]
    assert slow["status"] == "failed"
    assert f"{tmp_path}/play.yaml:7: template " in slow["msg"]
    assert "slow.j2: regex_replace: the pattern '(a+)+$' took more than 5 s" in slow["msg"]
    assert "'a+$'" in slow["hint"]
    assert not (tmp_path / "out.txt").exists()


def test_bad_playbook_exits_64_before_touching_anything(tmp_path: Path) -> None:
    book = "- hosts: all\n  tasks:\n    - name: first\n      file: {path: '{{ base }}/x', state: directory}\n    - name: bad\n      copy: {dest: /x, content: y, nope: 1}\n"
    proc = provision(tmp_path, playbook=book)
    assert proc.returncode == EXIT_USAGE
    assert "play.yaml:6" in proc.stderr and "unsupported argument 'nope'" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("flag", ["--list-modules", "--help"])
def test_help_and_module_list(tmp_path: Path, flag: str) -> None:
    proc = cpuaccel("provision", flag)
    assert proc.returncode == 0
    assert (
        ("synchronize" in proc.stdout) if flag == "--list-modules" else ("Examples" in proc.stdout)
    )


def test_no_inventory_refuses_to_provision_the_controller(tmp_path: Path) -> None:
    proc = cpuaccel("provision", cwd=tmp_path)
    assert proc.returncode == EXIT_USAGE
    assert "no inventory given" in proc.stderr and "Traceback" not in proc.stderr
