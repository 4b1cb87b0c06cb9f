"""``cpuaccel.api.provisioning``: ``provision()`` of a small playbook on this machine
returns each host's recap and the ``--json`` object, is idempotent, changes nothing with
``check``; a failing task is a result, a bad keyword or playbook an error before
anything runs; it prints the tasks and recap only with ``progress``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from cpuaccel.api.provisioning import ProvisionResult, provision, tag_set
from cpuaccel.errors import EXIT_NODE_FAILED, EXIT_USAGE, PlaybookError, UsageError
from cpuaccel.playbook.strategy import HostStats
from testsupport.command import cpuaccel, inherited_env

PLAYBOOK = """\
- name: a folder and a file
  hosts: all
  tasks:
    - name: the folder
      file: {path: "{{ base }}/tree", state: directory}
    - name: the file
      copy: {dest: "{{ base }}/tree/motd", content: "hello {{ inventory_hostname }}\\n"}
    - name: tagged away
      command: touch {{ base }}/tree/tagged
      tags: [extra]
"""


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder without inventory.yaml or cpuaccel.yaml (the host is this machine),
    holding play.yaml."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CPUACCEL_INVENTORY", raising=False)
    (tmp_path / "play.yaml").write_text(PLAYBOOK)
    return tmp_path


def base(here: Path) -> dict[str, Any]:
    return {"base": str(here), "ansible_python_interpreter": sys.executable}


def test_a_playbook_on_this_machine_then_again_changes_nothing(here: Path) -> None:
    first = provision(playbook="play.yaml", extra_vars=base(here), skip_tags="extra")
    assert isinstance(first, ProvisionResult)
    assert first.ok and first.exit_code == 0 and not first.check
    assert isinstance(first.stats["localhost"], HostStats)
    assert first.stats["localhost"].changed == 2
    assert (here / "tree" / "motd").read_text() == "hello localhost\n"
    assert not (here / "tree" / "tagged").exists()
    tasks = [t["task"] for play in first.plays for t in play["tasks"]]
    assert tasks[-2:] == ["the folder", "the file"]
    again = provision(playbook=here / "play.yaml", extra_vars=base(here), tags=["extra"])
    assert again.ok and again.stats["localhost"].changed == 1  # the tagged task alone
    assert (here / "tree" / "tagged").exists()
    third = provision(playbook="play.yaml", extra_vars=base(here), skip_tags="extra")
    assert third.ok and third.stats["localhost"].changed == 0


def test_check_changes_nothing_and_to_json_is_what_the_cli_prints(here: Path) -> None:
    found = provision(playbook="play.yaml", extra_vars=base(here), check=True)
    assert found.ok and found.check and found.stats["localhost"].changed == 2
    assert not (here / "tree").exists()
    words = [f"base={here}", "-e", f"ansible_python_interpreter={sys.executable}"]
    cli = cpuaccel(
        "provision", "--playbook", "play.yaml", "-e", *words, "--check", "--json",
        cwd=here, env=inherited_env(),
    )  # fmt: skip
    assert cli.returncode == found.exit_code == 0, cli.stderr
    printed, ours = json.loads(cli.stdout), found.to_json()
    assert printed.pop("seconds") >= 0 and ours.pop("seconds") >= 0
    assert printed["stats"] == ours["stats"] and printed.keys() == ours.keys()
    assert [t["task"] for p in printed["plays"] for t in p["tasks"]] == [
        t["task"] for p in ours["plays"] for t in p["tasks"]
    ]


def test_a_failing_task_is_a_result(here: Path) -> None:
    (here / "fail.yaml").write_text(
        "- hosts: all\n  tasks:\n    - name: no\n      command: 'false'\n"
    )
    found = provision(playbook="fail.yaml", extra_vars=base(here))
    assert not found.ok and found.exit_code == EXIT_NODE_FAILED
    assert found.stats["localhost"].failed == 1
    assert found.to_json()["ok"] is False


def test_a_bad_playbook_raises_before_anything_runs(here: Path) -> None:
    (here / "bad.yaml").write_text(
        "- hosts: all\n  tasks:\n    - name: first\n      file: {path: x, state: directory}\n"
        "    - name: bad\n      no_such_module: {}\n"
    )
    with pytest.raises(PlaybookError) as caught:
        provision(playbook="bad.yaml")
    assert "bad.yaml:" in str(caught.value) and caught.value.exit_code == EXIT_USAGE
    assert not (here / "x").exists()


def test_the_default_playbook_on_this_machine_is_refused_as_by_the_cli(here: Path) -> None:
    with pytest.raises(UsageError) as caught:
        provision()
    assert "tags='wheelhouse'" in (caught.value.hint or "")
    cli = cpuaccel("provision", cwd=here, env=inherited_env())
    assert cli.returncode == EXIT_USAGE
    assert f"error: {caught.value.message}" in " ".join(cli.stderr.split())


@pytest.mark.parametrize(
    ("keywords", "said"),
    [
        ({"playbook": 1}, "playbook=1: expected a path"),
        ({"check": "yes"}, "check='yes': expected True or False"),
        ({"become": 1}, "become=1: expected True or False"),
        ({"tags": [1]}, "tags=[1]: expected a tag or a list of tags"),
        ({"skip_tags": None}, "skip_tags=None: expected a tag"),
        ({"become_user": "a b"}, "become_user='a b', not a login name"),
        ({"become_user": 0}, "become_user=0: expected a login name"),
        ({"become_password": 1234}, "become_password: expected a string"),
        ({"limit": 5}, "limit=5: expected a string"),
        ({"forks": 2000}, "forks=2000: expected a whole number from 1 to 1024"),
    ],
)
def test_a_bad_keyword_is_a_usage_error_naming_it(
    here: Path, keywords: dict[str, Any], said: str
) -> None:
    with pytest.raises(UsageError) as caught:
        provision(**{"playbook": "play.yaml", "extra_vars": base(here), **keywords})
    assert caught.value.message.startswith(said) and caught.value.hint
    assert "1234" not in str(caught.value)  # a password is never said
    assert not (here / "tree").exists()


def test_tasks_and_recap_are_printed_only_with_progress(
    here: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    assert provision(playbook="play.yaml", extra_vars=base(here)).ok
    assert capfd.readouterr() == ("", "")
    assert provision(playbook="play.yaml", extra_vars=base(here), progress=True).ok
    out = capfd.readouterr().out
    assert "the file" in out and "PLAY RECAP" in out and "localhost" in out


def test_tags_may_hold_several_comma_separated() -> None:
    assert tag_set(["a,b", " c ", ""]) == {"a", "b", "c"}


NO_PYTHON_INVENTORY = """\
all:
  hosts:
    node1: {ansible_connection: local, ansible_python_interpreter: %s}
"""


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        ([], "node1: neither cpuaccel_venv nor cpuaccel_python is set"),
        (["cpuaccel_venv=venv"], "node1 (venv): neither cpuaccel_venv nor cpuaccel_python is an"),
        (
            ["cpuaccel_venv=/opt/v", "cpuaccel_stack=cuda"],
            "node1: cpuaccel_stack 'cuda' is not one of upstream, ipex-legacy",
        ),
    ],
)
def test_a_setting_the_default_playbook_needs_is_bad_input_before_any_node(
    here: Path, extra: list[str], said: str
) -> None:
    """Exit 64 with the hosts named and the fix, not 69 from a task failed on each node;
    and cpuaccel_stack is not asked for when it is only left out (it has a default)."""
    (here / "inventory.yaml").write_text(NO_PYTHON_INVENTORY % sys.executable)
    with pytest.raises(UsageError) as caught:
        provision("inventory.yaml", extra_vars=extra)
    assert said in caught.value.message
    assert caught.value.exit_code == EXIT_USAGE
    args = [word for pair in extra for word in ("-e", pair)]
    cli = cpuaccel("provision", "inventory.yaml", *args, cwd=here, env=inherited_env())
    assert cli.returncode == EXIT_USAGE, cli.stdout + cli.stderr
    text = " ".join(cli.stderr.split())
    assert said in text and "fix:" in text and "Traceback" not in text
    assert "PLAY" not in cli.stdout  # no task ran on any node
    if not any(word.startswith("cpuaccel_stack") for word in extra):
        assert "cpuaccel_stack" not in text
