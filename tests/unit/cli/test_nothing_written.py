"""A refused command, and a dry run, write nothing on the controller (a ``sync --check``
with a bad ``--dest`` once wrote ``~/.cache/cpuaccel/hashes`` before the destination was
judged).

Each case runs ``python -m cpuaccel`` with HOME and XDG_CACHE_HOME in tmp_path, and
compares every path below tmp_path (name, size, mtime) before and after."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from cpuaccel.errors import EXIT_USAGE
from testsupport.command import cpuaccel, inherited_env

TIMEOUT = 60.0


def listing(root: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(root)): (p.lstat().st_size, p.lstat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
    }


def run_in(folder: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = inherited_env(HOME=str(folder / "home"), XDG_CACHE_HOME=str(folder / "cache"))
    return cpuaccel(*args, cwd=cwd, env=env, timeout=TIMEOUT)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    for name in ("home", "cache", "project"):
        (tmp_path / name).mkdir()
    (tmp_path / "project" / "train.py").write_text("print('hi')\n")
    return tmp_path / "project"


# Refused as text before any connection, and by the node (localhost) on the resolved path.
BAD_DESTS = ["/", "{{ no_such_var }}/x", "/usr", "{home}"]


@pytest.mark.parametrize("check", [True, False], ids=["check", "sync"])
@pytest.mark.parametrize("dest", BAD_DESTS)
def test_a_refused_sync_writes_nothing_on_the_controller(
    tmp_path: Path, project: Path, dest: str, check: bool
) -> None:
    before = listing(tmp_path)
    dest = dest.replace("{home}", str(tmp_path / "home"))
    argv = ["sync", *(["--check"] if check else []), "--dest", dest, "."]
    done = run_in(tmp_path, project, *argv)
    assert done.returncode == EXIT_USAGE, done.stderr
    assert "--dest" in done.stderr and "Traceback" not in done.stderr
    assert listing(tmp_path) == before  # no hash cache, no sync memory, nothing else


def test_an_accepted_sync_check_keeps_its_hash_cache(tmp_path: Path, project: Path) -> None:
    # The control for the test above: the cache it looks for is really written.
    done = run_in(tmp_path, project, "sync", "--check", "--dest", str(tmp_path / "dst"), ".")
    assert done.returncode == 1, done.stderr  # the destination differs (it is empty)
    assert (tmp_path / "cache" / "cpuaccel" / "hashes").is_file()
    assert not (tmp_path / "dst").exists()


INVENTORY = """\
all:
  hosts:
    node1: {ansible_host: 10.255.0.1, ansible_user: u, cpuaccel_secret_env: {TOKEN: s3cret}}
    node2: {ansible_host: 10.255.0.2, ansible_port: 2222}
"""


@pytest.mark.parametrize("inventory", [None, INVENTORY], ids=["localhost", "two-nodes"])
def test_a_dry_run_writes_nothing_anywhere(
    tmp_path: Path, project: Path, inventory: str | None
) -> None:
    if inventory is not None:
        (project / "inventory.yaml").write_text(inventory)
    before = listing(tmp_path)
    done = run_in(tmp_path, project, "run", "--dry-run", "--ppn", "2", "train.py")
    assert done.returncode == 0, done.stderr
    assert "dry run: no node was contacted" in done.stdout
    assert "/runs/" in done.stdout  # the run folder it names ...
    assert listing(tmp_path) == before  # ... is not made, nor is anything else
