"""The ``jobs`` node program (node/jobctl.py) never writes, or removes, a run's files
through a link.

Each test runs the bundled program as a node runs it (``python -c BOOT ...`` with its
source on stdin, isolated from this checkout) against a tmp tree with a hostile link."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from cpuaccel import node
from cpuaccel.connectors import programs
from cpuaccel.connectors.connect_options import ConnectOptions
from cpuaccel.errors import EXIT_USAGE, UsageError
from cpuaccel.executor import ConnectionPool
from cpuaccel.inventory.host import Host
from cpuaccel.jobs.connections import Nodes, copy_files

RUN_ID = "20260101-000000-abcd"
FILES = {"secret.env": [0o600, "export T=s3cret\n"], "env.sh": [0o600, "export A=1\n"]}


def jobs(*words: str, payload: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    argv = programs.argv(sys.executable, "jobctl", list(words))
    isolated = [argv[0], "-I", *argv[1:]]  # the node has no cpuaccel: only what ships
    source = node.program("jobctl")
    return subprocess.run(isolated, input=source + payload, capture_output=True, check=False)


def write(run_dir: Path) -> subprocess.CompletedProcess[bytes]:
    return jobs("write", str(run_dir), payload=json.dumps({"files": FILES}).encode())


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path]:
    """(a workdir, a folder elsewhere that nothing may touch)"""
    (tmp_path / "work").mkdir()
    (tmp_path / "elsewhere").mkdir()
    return tmp_path / "work", tmp_path / "elsewhere"


def refused(done: subprocess.CompletedProcess[bytes], path: Path) -> None:
    err = done.stderr.decode()
    assert done.returncode != 0 and done.stdout == b""
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert f"refused: {path} is a symbolic link" in err and "remove it" in err


def test_a_linked_runs_folder_is_refused(tree: tuple[Path, Path]) -> None:
    work, elsewhere = tree
    (work / "runs").symlink_to(elsewhere)
    refused(write(work / "runs" / RUN_ID), work / "runs")
    assert list(elsewhere.iterdir()) == []


def test_a_linked_run_folder_is_refused(tree: tuple[Path, Path]) -> None:
    work, elsewhere = tree
    (work / "runs").mkdir()
    (work / "runs" / RUN_ID).symlink_to(elsewhere)
    refused(write(work / "runs" / RUN_ID), work / "runs" / RUN_ID)
    assert list(elsewhere.iterdir()) == []
    assert (work / "runs" / RUN_ID).is_symlink()  # refused, not replaced


def test_a_file_where_the_runs_folder_belongs_is_refused(tree: tuple[Path, Path]) -> None:
    work, _ = tree
    (work / "runs").write_text("x")
    refused(write(work / "runs" / RUN_ID), work / "runs")


def test_the_folders_it_makes_are_private_and_the_workdir_may_be_a_link(
    tree: tuple[Path, Path],
) -> None:
    """The workdir is the user's choice (a scratch disk); below it, cpuaccel's own."""
    work, elsewhere = tree
    linked = work / "linked"
    linked.symlink_to(elsewhere)
    old = os.umask(0o022)
    try:
        done = write(linked / "runs" / RUN_ID)
    finally:
        os.umask(old)
    assert done.returncode == 0, done.stderr
    run = elsewhere / "runs" / RUN_ID
    assert mode_of(elsewhere / "runs") == 0o700 and mode_of(run) == 0o700
    assert mode_of(run / "secret.env") == 0o600
    assert sorted(p.name for p in run.iterdir()) == ["env.sh", "secret.env"]


def test_a_link_in_the_run_folder_is_replaced_not_written_through(
    tree: tuple[Path, Path],
) -> None:
    work, elsewhere = tree
    run = work / "runs" / RUN_ID
    run.mkdir(parents=True)
    (elsewhere / "target").write_text("keep")
    (run / "secret.env").symlink_to(elsewhere / "target")
    assert write(run).returncode == 0
    assert (elsewhere / "target").read_text() == "keep"
    assert not (run / "secret.env").is_symlink() and mode_of(run / "secret.env") == 0o600


def test_write_names_the_large_files_the_run_folder_holds_as_they_are(
    tree: tuple[Path, Path],
) -> None:
    """A restart's request: only a regular file with the mode and sha256 asked counts as
    held; a link is never read through, and a fifo is not opened for reading."""
    work, elsewhere = tree
    run = work / "runs" / RUN_ID
    run.mkdir(parents=True)
    data = b"pickled call " * 1000
    for name, mode in (("same", 0o600), ("other-mode", 0o644), ("other-bytes", 0o600)):
        (run / name).write_bytes(data if name != "other-bytes" else data + b"!")
        (run / name).chmod(mode)
    (elsewhere / "target").write_bytes(data)
    (elsewhere / "target").chmod(0o600)
    (run / "linked").symlink_to(elsewhere / "target")
    os.mkfifo(run / "fifo", 0o600)
    digest = hashlib.sha256(data).hexdigest()
    names = ["same", "other-mode", "other-bytes", "linked", "fifo", "missing"]
    asked = {"files": FILES, "held": {name: [0o600, digest] for name in names}}
    done = subprocess.run(
        [*programs.argv(sys.executable, "jobctl", ["write", str(run)])],
        input=node.program("jobctl") + json.dumps(asked).encode(),
        capture_output=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"written": sorted(FILES), "held": ["same"]}
    assert (elsewhere / "target").read_bytes() == data  # untouched


def test_write_refuses_a_held_name_with_a_path(tree: tuple[Path, Path]) -> None:
    work, _ = tree
    asked = {"files": {}, "held": {"../x": [0o600, "0" * 64]}}
    done = jobs("write", str(work / "runs" / RUN_ID), payload=json.dumps(asked).encode())
    assert done.returncode != 0 and done.stderr == b"refusing file name '../x'\n"


def test_the_end_never_removes_a_secret_behind_a_link(tree: tuple[Path, Path]) -> None:
    work, elsewhere = tree
    (elsewhere / RUN_ID).mkdir()
    (elsewhere / RUN_ID / "secret.env").write_text("someone else's")
    (work / "runs").symlink_to(elsewhere)
    done = jobs("end", RUN_ID, "0", str(work / "runs" / RUN_ID))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["forgot"] is False
    assert (elsewhere / RUN_ID / "secret.env").exists()


def test_the_end_removes_a_linked_secret_itself_not_its_target(
    tree: tuple[Path, Path],
) -> None:
    work, elsewhere = tree
    run = work / "runs" / RUN_ID
    run.mkdir(parents=True)
    (elsewhere / "secret.env").write_text("keep")
    (run / "secret.env").symlink_to(elsewhere / "secret.env")
    done = jobs("end", RUN_ID, "0", str(run))
    assert json.loads(done.stdout)["forgot"] is True
    assert not os.path.lexists(run / "secret.env")
    assert (elsewhere / "secret.env").read_text() == "keep"


def test_reach_removes_its_folder_by_descriptors(tree: tuple[Path, Path]) -> None:
    """ssh.sh (anything on the node) plants a link in the reach folder: the cleanup
    removes the link, never what it leads to, and leaves no folder it made."""
    work, elsewhere = tree
    (elsewhere / "keep").write_text("x")
    plant = f'#!/bin/sh\nln -s "{elsewhere}" "$(dirname "$0")/planted"\nexit 0\n'
    folder = work / "new" / f"cpuaccel-reach-{RUN_ID}"
    payload = json.dumps({"ssh.sh": [0o700, plant]}).encode()
    done = jobs("reach", str(folder), "5", "n2", payload=payload)
    assert json.loads(done.stdout) == {"reach": {"n2": [0, ""]}}, done.stderr
    assert [p.name for p in elsewhere.iterdir()] == ["keep"]
    assert list(work.iterdir()) == []


def test_run_refuses_with_one_line_naming_the_node_and_path(tree: tuple[Path, Path]) -> None:
    """Through the controller: the node's refusal is a usage error (exit 64)."""
    work, elsewhere = tree
    (work / "runs").symlink_to(elsewhere)
    host = Host("node1", {"ansible_connection": "local", "cpuaccel_python": sys.executable})
    plan = SimpleNamespace(hosts=[host], run_dir=str(work / "runs" / RUN_ID), run_id=RUN_ID)
    nodes = Nodes(ConnectOptions(), 1, ConnectionPool(ConnectOptions()))
    with pytest.raises(UsageError) as caught:
        copy_files(cast(Any, plan), cast(Any, FILES), nodes)
    message = caught.value.message  # one line; the hint is printed under it
    assert caught.value.exit_code == EXIT_USAGE
    assert message.startswith("node1: writing the run's files failed on the node")
    assert f"refused: {work / 'runs'} is a symbolic link" in message
    assert "\n" not in message and "s3cret" not in message
    assert list(elsewhere.iterdir()) == []
