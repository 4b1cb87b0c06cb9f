"""`cpuaccel sync`'s command line: bad input is one line, exit 64, with nothing written;
--json and the exit codes on a local host."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cpuaccel.errors import EXIT_USAGE
from cpuaccel.projectsync.manifest import build
from tests.unit.projectsync.trees import make_tree
from testsupport.command import cpuaccel, inherited_env

pytestmark = pytest.mark.usefixtures("private_hash_cache")


# ---------------------------------------------------------------- the command line


def cached_cpuaccel(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`cpuaccel ARGS` with a cache of the test's own, next to its project folder."""
    return cpuaccel(*args, cwd=cwd, env=inherited_env(XDG_CACHE_HOME=str(cwd.parent / "xdg-cache")))


@pytest.fixture
def local_inventory(tmp_path: Path) -> Path:
    inv = tmp_path / "inv.yaml"
    inv.write_text(
        "all:\n  hosts:\n    here:\n"
        f"      ansible_connection: local\n"
        f"      cpuaccel_python: {sys.executable}\n"
        f"      cpuaccel_workdir: {tmp_path / 'work'}\n"
    )
    return inv


BAD_INPUT = [
    ("missing source", {}, ["nope"], ["nope: no such file or folder"]),
    ("relative --dest", {}, ["--dest", "rel/dir"], ["not an absolute path"]),
    ("--dest /", {}, ["--dest", "/"], ["top-level"]),
    ("--delete on the workdir", {}, ["--delete", "--dest", "{{ cpuaccel_workdir }}"], ["workdir"]),
    ("the workdir's parent", {}, ["--dest", "{{ cpuaccel_workdir }}/.."], ["workdir"]),
    # Refused by the node, on the path as it resolves there: the text check cannot see it.
    ("--dest ~/../..", {}, ["--delete", "--dest", "~/../../etc"], ["resolves to /etc", "top-"]),
    ("--dest $HOME", {}, ["--delete", "--dest", os.path.expanduser("~")], ["home folder"]),
    ("--dest ~/.ssh", {}, ["--delete", "--dest", "~/.ssh"], ["refusing"]),
    ("--dest /usr/local", {}, ["--dest", "/usr/local"], ["resolves to /usr/local", "system"]),
    ("--dest in a sandbox", {}, ["--dest", "/x/{{ cycler.__init__.__globals__ }}"], ["unsafe"]),
    ("undefined variable", {}, ["--dest", "{out}/{{ nothing }}"], ["'nothing' is undefined"]),
    ("newline in --dest", {}, ["--dest", "{out}/a\nb"], ["newline"]),
    ("--dest //", {}, ["--delete", "--dest", "//"], ["top-level"]),
    ("newline in a name", {"bad\nname.py": ""}, [], ["newline"]),
    ("symlink outside", {}, ["../linked"], ["symlink points outside", "--copy-links"]),
    ("unknown option", {}, ["--no-such-option"], ["no-such-option"]),
]


@pytest.mark.parametrize(
    ("files", "args", "words"),
    [pytest.param(f, a, w, id=name) for name, f, a, w in BAD_INPUT],
)
def test_cli_bad_input_exits_64_without_traceback_and_writes_nothing(
    tmp_path: Path,
    local_inventory: Path,
    files: dict[str, str],
    args: list[str],
    words: list[str],
) -> None:
    make_tree(tmp_path / "proj", {"a.py": "", **files})
    (tmp_path / "linked").mkdir()
    (tmp_path / "linked" / "ext").symlink_to("/etc/hostname")
    out = str(tmp_path / "out")
    args = [a.replace("{out}", out) for a in args]
    proc = cached_cpuaccel("sync", "-i", str(local_inventory), *args, cwd=tmp_path / "proj")
    assert proc.returncode == EXIT_USAGE, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    message = " ".join(proc.stderr.split())
    for word in words:
        assert word in message
    assert not (tmp_path / "work").exists()
    assert not (tmp_path / "out").exists()


def test_cli_json_and_exit_codes_on_a_local_host(tmp_path: Path, local_inventory: Path) -> None:
    proj = make_tree(tmp_path / "proj", {"a.py": "1", "run.sh": "#!/bin/sh\n"})
    first = cached_cpuaccel("sync", "-i", str(local_inventory), "--json", cwd=proj)
    assert first.returncode == 0, first.stdout + first.stderr
    report = json.loads(first.stdout)
    assert report["files"] == 2 and report["manifest"] == build([str(proj)]).hash
    here = report["hosts"]["here"]
    assert here["status"] == "ok" and here["in_sync"] is True
    assert here["dest"] == str(tmp_path / "work" / "proj")
    assert sorted(here["changed"]) == ["a.py", "run.sh"]
    (proj / "a.py").write_text("2")
    check = cached_cpuaccel("sync", "-i", str(local_inventory), "--check", cwd=proj)
    assert check.returncode == 1, check.stdout + check.stderr
    assert "here: 1 would change, 0 deleted" in check.stdout
    assert "0/1 node(s) match the source" in check.stdout
    assert (tmp_path / "work" / "proj" / "a.py").read_text() == "1"
    second = cached_cpuaccel("sync", "-i", str(local_inventory), cwd=proj)
    assert second.returncode == 0 and "1/1 node(s) match the source" in second.stdout
    assert (tmp_path / "work" / "proj" / "a.py").read_text() == "2"
