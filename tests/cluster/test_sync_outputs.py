"""`cpuaccel run ... > train.log` and `| tee train.log` from the project folder, the
ordinary way to keep a log, on real nodes: the sync before the launch never sends the
command's own output; a file that keeps changing during the sync is named, with the fix."""

from __future__ import annotations

import shlex
import subprocess
import threading
from pathlib import Path

import pytest

from cpuaccel.errors import EXIT_USAGE
from cpuaccel.testbed.cluster import WORKDIR, Cluster
from testsupport.command import cpuaccel_argv
from testsupport.runs import ENV, make_project

pytestmark = pytest.mark.cluster

SCRIPT = "import os\nprint('rank', os.environ['RANK'], 'done', flush=True)\n"


def shell_run(project: Path, inventory: str, redirect: str) -> subprocess.CompletedProcess[str]:
    """`cpuaccel run -i INV --nodes 3 --ppn 1 script.py REDIRECT` typed in a shell."""
    argv = cpuaccel_argv("run", "-i", inventory, "--nodes", "3", "--ppn", "1", "script.py")
    line = f"{shlex.join(argv)} {redirect}"
    return subprocess.run(
        ["sh", "-c", line], cwd=project, env=ENV, capture_output=True, text=True, timeout=240
    )


def on_node(cluster: Cluster, project: Path, name: str) -> bool:
    found = cluster.exec("node2", ["test", "-e", f"{WORKDIR}/{project.name}/{name}"])
    return found.returncode == 0


@pytest.mark.parametrize(
    ("redirect", "appending"),
    [
        ("> train.log 2>&1", ">> train.log 2>&1"),
        ("2>&1 | tee train.log", "2>&1 | tee -a train.log"),
        ("2> train.log", "2>> train.log"),
    ],
)
def test_run_with_its_output_in_the_project_folder(
    cluster: Cluster, inventory: str, tmp_path: Path, redirect: str, appending: str
) -> None:
    project = make_project(tmp_path, {"script.py": SCRIPT})
    done = shell_run(project, inventory, redirect)
    log = (project / "train.log").read_text()
    assert done.returncode == 0, (done, log)
    assert "syncing it first" in log and "completed: 3 rank(s) on 3 node(s)" in log, log
    assert "rank 2 done" in log or "rank 2 done" in done.stdout
    assert on_node(cluster, project, "script.py")
    assert not on_node(cluster, project, "train.log")
    # The next run finds the nodes in sync: the log (grown since) is still not the project.
    again = shell_run(project, inventory, appending)
    assert again.returncode == 0, (again, (project / "train.log").read_text())
    assert (project / "train.log").read_text().count("syncing it first") == 1


def test_a_file_written_during_the_sync_is_named_with_the_fix(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    project = make_project(tmp_path, {"script.py": SCRIPT})
    events = project / "events.log"
    events.write_text("")
    stop = threading.Event()

    def writer() -> None:  # another program of the user's, logging into the project
        with events.open("a") as f:
            while not stop.wait(0.005):
                f.write("event\n")
                f.flush()

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        refused = shell_run(project, inventory, "")
        assert refused.returncode == EXIT_USAGE, refused
        lines = refused.stderr.splitlines()
        assert any(
            line.startswith("error: events.log: changed while being synced, twice in a row")
            for line in lines
        ), refused.stderr
        assert any("fix: add it to .cpuaccelignore" in line for line in lines), refused.stderr
        assert "Traceback" not in refused.stderr
        assert not (project / "runs").exists() or not any((project / "runs").iterdir())

        (project / ".cpuaccelignore").write_text("events.log\n")
        done = shell_run(project, inventory, "")
        assert done.returncode == 0, done
        assert "completed: 3 rank(s) on 3 node(s)" in done.stderr
    finally:
        stop.set()
        thread.join()
