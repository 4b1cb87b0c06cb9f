"""A sync never sends the command's own output (`> train.log`, `| tee train.log`), and a
file that changes while it is synced is retried once, then named with the fix."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cpuaccel.connectors.connect_options import ConnectOptions
from cpuaccel.errors import EXIT_USAGE
from cpuaccel.executor import Status
from cpuaccel.inventory.host import Host
from cpuaccel.projectsync import engine, transfer
from cpuaccel.projectsync.engine import SyncOptions
from cpuaccel.projectsync.manifest import SourceChanging, build
from testsupport.command import inherited_env

pytestmark = pytest.mark.usefixtures("private_hash_cache")

# Builds the manifest of the current folder in a process whose stdout and stderr are what
# the shell line gives it, and writes what it found into the file named by its argument.
PROBE = (
    "import json, sys, time, os\n"
    "from cpuaccel.projectsync.manifest import build\n"
    "while not os.path.exists('train.log'): time.sleep(0.01)\n"
    "m = build(['.'])\n"
    "print('training...', flush=True)\n"
    "open(sys.argv[1], 'w').write(json.dumps([sorted(m.entries), m.own_outputs]))\n"
)


def probe(shell_line: str, project: Path) -> tuple[list[str], list[str]]:
    (project / "train.py").write_text("print('hi')\n")
    (project / "probe.py").write_text(PROBE)
    env = inherited_env(XDG_CACHE_HOME=str(project.parent / "xdg-cache"))
    report = project.parent / "report.json"
    line = shell_line.replace("PY", f"{sys.executable} probe.py {report}")
    done = subprocess.run(
        ["sh", "-c", line], cwd=project, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    entries, own = json.loads(report.read_text())
    return entries, own


@pytest.mark.parametrize(
    "line", ["PY > train.log", "PY >> train.log 2>&1", "PY > /dev/null 2> train.log"]
)
def test_redirected_output_is_not_part_of_the_tree(tmp_path: Path, line: str) -> None:
    project = tmp_path / "project"
    project.mkdir()
    entries, own = probe(line, project)
    assert "train.log" not in entries and own == ["train.log"]
    assert {"train.py", "probe.py"} <= set(entries)


def test_tee_output_is_not_part_of_the_tree(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    entries, own = probe("PY | tee train.log > /dev/null", project)
    assert "train.log" not in entries and own == ["train.log"]
    assert (project / "train.log").read_text() == "training...\n"


def test_tee_after_tee_is_followed(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    entries, own = probe("PY | tee train.log | tee -a copy.log > /dev/null", project)
    assert sorted(own) == ["copy.log", "train.log"]
    assert "train.log" not in entries


def test_an_unrelated_log_is_still_synced(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "old.log").write_text("kept\n")
    entries, own = probe("touch train.log; PY > /dev/null", project)
    assert "old.log" in entries and "train.log" in entries and own == []


def test_changed_since_build_names_written_and_removed_files(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name in ("a.py", "b.log", "c.tmp"):
        (src / name).write_text(name)
    manifest = build([str(src)])
    assert manifest.changed_since_build() == []
    with (src / "b.log").open("a") as f:
        f.write("more\n")
    (src / "c.tmp").unlink()
    assert manifest.changed_since_build() == ["b.log", "c.tmp"]
    manifest.rebuild()
    assert manifest.changed_since_build() == [] and "c.tmp" not in manifest.entries


def local_host(name: str, workdir: Path) -> Host:
    return Host(
        name,
        {
            "ansible_connection": "local",
            "cpuaccel_workdir": str(workdir),
            "cpuaccel_python": sys.executable,
        },
    )


def appending_while_sending(monkeypatch: pytest.MonkeyPatch, log: Path, times: int) -> list[int]:
    """Append to log before and after the tar stream is made, the first `times` times (as
    a running program's log grows during a sync, and after it)."""
    real = transfer.tar_stream
    calls: list[int] = []

    def append(text: str) -> None:
        if len(calls) <= times:
            with log.open("a") as f:
                f.write(text)

    def tar_stream(*args: Any) -> Any:
        calls.append(1)
        append(f"line {len(calls)}\n")
        stream = real(*args)
        append(f"line {len(calls)}b\n")
        return stream

    monkeypatch.setattr(transfer, "tar_stream", tar_stream)
    return calls


def test_a_file_changing_during_the_sync_is_retried_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("x = 1\n")
    log = src / "events.log"
    log.write_text("start\n")
    calls = appending_while_sending(monkeypatch, log, times=1)
    seen: list[Status] = []
    results = engine.sync(
        [local_host("one", tmp_path / "w")],
        build([str(src)]),
        SyncOptions("{{ cpuaccel_workdir }}/proj"),
        forks=1,
        connect=ConnectOptions(),
        listen=engine.SyncListeners(on_result=lambda r: seen.append(r.status)),
    )
    assert [r.status for r in results] == [Status.OK], [r.error for r in results]
    assert len(calls) == 2 and seen == [Status.OK]  # the failed first try was not reported
    assert (tmp_path / "w" / "proj" / "events.log").read_text() == "start\nline 1\nline 1b\n"


def test_a_file_changing_at_every_try_is_named_with_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("x = 1\n")
    log = src / "events.log"
    log.write_text("start\n")
    calls = appending_while_sending(monkeypatch, log, times=99)
    with pytest.raises(SourceChanging) as raised:
        engine.sync(
            [local_host("one", tmp_path / "w")],
            build([str(src)]),
            SyncOptions("{{ cpuaccel_workdir }}/proj"),
            forks=1,
            connect=ConnectOptions(),
        )
    assert len(calls) == 2  # one retry, no more
    assert raised.value.paths == ["events.log"]
    assert raised.value.exit_code == EXIT_USAGE
    assert raised.value.message.startswith("events.log: changed while being synced")
    assert ".cpuaccelignore" in (raised.value.hint or "")
    assert "--exclude events.log" in (raised.value.hint or "")
