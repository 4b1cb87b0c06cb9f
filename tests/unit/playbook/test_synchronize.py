"""The playbook's synchronize deletes only where ``cpuaccel sync --delete`` may: the
node judges the resolved dest (~ and links resolved there) before rsync runs.

End to end on this machine (ansible_connection: local), with HOME a tmp folder.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cpuaccel.errors import EXIT_NODE_FAILED
from testsupport.command import cpuaccel, inherited_env


def provision(tmp_path: Path, task: str) -> subprocess.CompletedProcess[str]:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        "all:\n  hosts:\n    local0:\n      ansible_connection: local\n"
        f"      ansible_python_interpreter: {sys.executable}\n"
        f"      cpuaccel_workdir: {tmp_path}/work\n"
        f"  vars:\n    base: {tmp_path}\n"
    )
    book = tmp_path / "play.yaml"
    book.write_text(f"- hosts: all\n  tasks:\n    - name: push\n      synchronize: {task}\n")
    env = inherited_env(HOME=str(tmp_path / "home"))
    return cpuaccel("provision", str(inventory), "--playbook", str(book), "--json", env=env)


def pushed(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert "Traceback" not in proc.stderr, proc.stderr
    report = json.loads(proc.stdout)
    (task,) = [t for t in report["plays"][0]["tasks"] if t["task"] == "push"]
    return task["hosts"]["local0"]  # type: ignore[no-any-return]


@pytest.fixture
def layout(tmp_path: Path) -> Path:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "new.txt").write_text("new\n")
    for folder in ("home", "work/runs", "dest"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "precious").write_text("keep\n")
    (tmp_path / "to-home").symlink_to(tmp_path / "home")
    return tmp_path


@pytest.mark.parametrize(
    ("dest", "delete", "why"),
    [
        ("~", "delete: true", "home folder"),
        ("{{ base }}/to-home/", "delete: true", "home folder"),  # a link to it, resolved
        ("{{ base }}/work", "delete: true", "workdir"),
        ("~/../home", "rsync_opts: [--delete-after]", "home folder"),  # an rsync option
        ("{{ base }}/work/runs/..", "rsync_opts: ['--del']", "workdir"),
    ],
)
def test_a_delete_into_a_folder_it_must_not_own_is_refused_before_rsync(
    layout: Path, dest: str, delete: str, why: str
) -> None:
    proc = provision(layout, f'{{src: "{{{{ base }}}}/src/", dest: "{dest}", {delete}}}')
    assert proc.returncode == EXIT_NODE_FAILED
    result = pushed(proc)
    assert result["status"] == "failed", result
    assert "synchronize: refusing to delete in dest" in result["msg"]
    assert why in result["msg"] and "cpuaccel sync --delete" in result["msg"]
    for folder in ("home", "work/runs"):
        assert sorted(p.name for p in (layout / folder).iterdir()) == ["precious"]


def test_a_delete_into_a_folder_of_its_own_goes_ahead(layout: Path) -> None:
    proc = provision(layout, '{src: "{{ base }}/src/", dest: "{{ base }}/dest/", delete: true}')
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert pushed(proc)["status"] == "changed"
    assert sorted(p.name for p in (layout / "dest").iterdir()) == ["new.txt"]
