"""ps, logs, fetch and results brought home, on this machine (issue 14, items 2, 3, 5).

The node side (the ``jobs`` program's ``list`` and ``read``) runs as the real bundled
program through the local connector; "the head" is a run folder elsewhere on disk.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from cpuaccel.connectors import programs
from cpuaccel.connectors.choose import connector_for
from cpuaccel.errors import EXIT_NODE_FAILED, EXIT_OK, EXIT_USAGE, HostError
from cpuaccel.inventory.inventory import Inventory
from cpuaccel.runs import records
from cpuaccel.runs.homecoming import Homecoming
from cpuaccel.testing.command import clean_env, cpuaccel
from cpuaccel.testing.runs import BackgroundRun, cpuaccel_run, make_project

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def conn() -> Any:
    connection = connector_for(Inventory.implicit().hosts["localhost"])
    connection.connect()
    yield connection
    connection.close()


def head_run(tmp_path: Path, run_id: str = "20250101-120000-abcdef") -> Path:
    folder = tmp_path / "work" / "runs" / run_id
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text('{"step": 1, "loss": 2.5}\n')
    (folder / "secret.env").write_text("export TOKEN=x\n")
    (folder / "rank-0.log").write_text("hello\n")
    (folder / ".checkpoint.pt.tmp-1").write_text("half")
    (folder / "attempt-1").mkdir()
    (folder / "attempt-1" / "rank-0.log").write_text("first attempt\n")
    return folder


# ---------------------------------------------------------------- the node program


def test_list_names_regular_files_and_attempts_never_secrets(conn: Any, tmp_path: Path) -> None:
    folder = head_run(tmp_path)
    os.symlink("/etc/passwd", folder / "passwd")
    os.mkfifo(folder / "fifo")
    found = programs.call(conn, "jobctl", ["list", str(folder)], what="list")["files"]
    names = [name for name, _, _ in found]
    assert names == ["attempt-1/rank-0.log", "metrics.jsonl", "rank-0.log"]
    size = {name: size for name, size, _ in found}
    assert size["metrics.jsonl"] == len('{"step": 1, "loss": 2.5}\n')
    gone = programs.call(conn, "jobctl", ["list", str(tmp_path / "work/runs/nope")], what="list")
    assert gone == {"files": None}


def test_read_from_an_offset_and_refusals(conn: Any, tmp_path: Path) -> None:
    folder = head_run(tmp_path)
    os.symlink("/etc/passwd", folder / "passwd")
    got = programs.call(conn, "jobctl", ["read", str(folder), "rank-0.log", "2", "100"], what="r")
    assert base64.b64decode(got["data"]) == b"llo\n" and got["offset"] == 6 and got["size"] == 6
    sub = ["read", str(folder), "attempt-1/rank-0.log", "0", "5"]
    assert base64.b64decode(programs.call(conn, "jobctl", sub, what="r")["data"]) == b"first"
    missing = programs.call(conn, "jobctl", ["read", str(folder), "rank-9.log", "0", "9"], what="r")
    assert missing["data"] is None
    for name in ("secret.env", "../runs/x", "passwd", "/etc/passwd", "attempt-1/../secret.env"):
        with pytest.raises(HostError) as caught:
            programs.call(conn, "jobctl", ["read", str(folder), name, "0", "100"], what="reading")
        assert "Traceback" not in str(caught.value), name
        assert "refusing" in str(caught.value) or "cannot read" in str(caught.value), name


def test_a_link_in_place_of_the_run_folder_is_not_followed(conn: Any, tmp_path: Path) -> None:
    elsewhere = head_run(tmp_path)
    runs = tmp_path / "other" / "runs"
    runs.mkdir(parents=True)
    os.symlink(elsewhere, runs / "linked")
    answer = programs.call(conn, "jobctl", ["list", str(runs / "linked")], what="list")
    assert answer == {"files": None}


# ---------------------------------------------------------------- results brought home


def test_homecoming_copies_only_what_changed(conn: Any, tmp_path: Path) -> None:
    head = head_run(tmp_path)
    (head / "status.json").write_text('{"state": "running"}')
    (head / "checkpoint.pt").write_bytes(b"x" * 5000)
    home = tmp_path / "proj" / "runs" / head.name
    home.mkdir(parents=True)
    (home / "rank-0.log").write_text("the controller's own\n")
    coming = Homecoming(lambda: conn, str(head), home, supervised_there=False)
    first = coming.once()
    assert first is not None and first.files == ["metrics.jsonl", "checkpoints.json"]
    # A foreground run: the controller's logs and status stay its own.
    assert (home / "rank-0.log").read_text() == "the controller's own\n"
    assert not (home / "status.json").exists() and not (home / "checkpoint.pt").exists()
    listing = json.loads((home / "checkpoints.json").read_text())["checkpoints"]
    assert [(c["name"], c["size"]) for c in listing] == [("checkpoint.pt", 5000)]
    # Appended on the head: only the new bytes come, the copy grows.
    with open(head / "metrics.jsonl", "a") as f:
        f.write('{"step": 2, "loss": 2.0}\n')
    second = coming.once()
    assert second is not None and second.files == ["metrics.jsonl"]
    assert second.bytes == len('{"step": 2, "loss": 2.0}\n')
    assert (home / "metrics.jsonl").read_text() == (head / "metrics.jsonl").read_text()
    nothing = coming.once()
    assert nothing is not None and nothing.files == []


def test_homecoming_of_a_detached_run_with_checkpoints(conn: Any, tmp_path: Path) -> None:
    head = head_run(tmp_path)
    (head / "status.json").write_text('{"state": "succeeded", "exit_code": 0}')
    data = os.urandom(3 * 1024 * 1024 + 17)
    (head / "checkpoint.pt").write_bytes(data)
    home = tmp_path / "proj" / "runs" / head.name
    home.mkdir(parents=True)
    coming = Homecoming(lambda: conn, str(head), home, supervised_there=True)
    got = coming.once(checkpoints=True)
    assert got is not None
    assert set(got.files) == {"metrics.jsonl", "rank-0.log", "status.json", "checkpoint.pt"} | {
        "checkpoints.json"
    }
    assert (home / "checkpoint.pt").read_bytes() == data
    assert json.loads((home / "status.json").read_text())["state"] == "succeeded"
    assert not list(home.glob(".*")), "no temporary file left"
    again = coming.once(checkpoints=True)
    assert again is not None and again.files == []  # same size and mtime: not copied again


# ---------------------------------------------------------------- records: RUN, ps


def record(base: Path, run_id: str, **fields: Any) -> Path:
    folder = base / "runs" / run_id
    folder.mkdir(parents=True)
    data = {"run_id": run_id, "hosts": ["n1", "n2"], "ppn": 2, "world": 4, "started": 1000.0}
    command = ["mpirun", "-n", "4", "/bin/sh", "/w/runs/x/rank.sh", "train.py", "--steps"]
    (folder / "run.json").write_text(json.dumps({**data, "command": command, **fields}))
    return folder


def test_run_names_ids_prefixes_and_last(tmp_path: Path) -> None:
    for run_id in ("20250101-120000-aaaaaa", "20250101-120000-aaabbb", "20250102-090000-cccccc"):
        record(tmp_path, run_id)
    runs = tmp_path / "runs"
    assert records.find_run("last", runs).name == "20250102-090000-cccccc"
    assert records.find_run("20250102", runs).name == "20250102-090000-cccccc"
    assert records.find_run("20250101-120000-aaab", runs).name == "20250101-120000-aaabbb"
    ambiguous = cpuaccel("logs", "20250101", cwd=tmp_path, env=clean_env())
    assert ambiguous.returncode == EXIT_USAGE, ambiguous.stderr
    assert "20250101-120000-aaaaaa, 20250101-120000-aaabbb" in ambiguous.stderr
    assert "Traceback" not in ambiguous.stderr
    unknown = cpuaccel("fetch", "2024", cwd=tmp_path, env=clean_env())
    assert unknown.returncode == EXIT_USAGE and "no run '2024'" in unknown.stderr


def test_ps_states_from_status_record_and_supervisor(tmp_path: Path) -> None:
    done = record(tmp_path, "20250101-000001-aaaaaa", exit_code=0, reason="completed", seconds=5)
    cut = '{"st'  # a line being written: left out
    lines = '{"step": 9, "loss": 1.5}\n{"step": 10, "loss": 1.25}\n'
    (done / "metrics.jsonl").write_text(lines + cut)
    record(tmp_path, "20250101-000002-bbbbbb", exit_code=3, reason="failed")
    dead = {"host": records.this_host(), "pid": 2**22 + 7, "start_time": 5}  # > pid_max
    gone = record(tmp_path, "20250101-000003-cccccc")
    (gone / "status.json").write_text(json.dumps({"state": "running", "supervisor": dead}))
    stopped = record(tmp_path, "20250101-000004-dddddd", detached=True, head="n1")
    (stopped / "status.json").write_text(
        json.dumps({"state": "stopped", "exit_code": 143, "started": 1000.0, "ended": 1060.0})
    )
    shown = cpuaccel("ps", "--json", cwd=tmp_path, env=clean_env())
    assert shown.returncode == EXIT_OK, shown.stderr
    rows = {row["id"][-6:]: row for row in json.loads(shown.stdout)}
    assert list(rows) == ["dddddd", "cccccc", "bbbbbb", "aaaaaa"]  # newest first
    assert rows["aaaaaa"]["state"] == "succeeded" and rows["aaaaaa"]["seconds"] == 5
    assert (rows["aaaaaa"]["step"], rows["aaaaaa"]["loss"]) == (10, 1.25)
    assert rows["aaaaaa"]["script"] == "train.py" and rows["aaaaaa"]["nodes"] == 2
    assert (rows["bbbbbb"]["state"], rows["bbbbbb"]["exit_code"]) == ("failed", 3)
    assert rows["cccccc"]["state"] == "lost"
    assert rows["dddddd"]["state"] == "stopped" and rows["dddddd"]["seconds"] == 60
    table = cpuaccel("ps", "-n", "2", cwd=tmp_path, env=clean_env())
    assert "stopped" in table.stdout and "lost" in table.stdout and "failed" not in table.stdout


# ---------------------------------------------------------------- logs and resume, real runs

SLOW = """\
import os, sys, time
rank = int(os.environ["RANK"])
for i in range(int(sys.argv[1])):
    print(f"line {i} of rank {rank}", flush=True)
    time.sleep(0.3)
"""


def test_logs_follow_a_running_job_and_filter_ranks(tmp_path: Path) -> None:
    project = make_project(tmp_path, {"slow.py": SLOW})
    job = BackgroundRun(project, "--nodes", "1", "--ppn", "2", "slow.py", "12")
    try:
        job.wait_for("line 1 of rank 1", 1)
        listed = cpuaccel("ps", "--json", cwd=project, env=clean_env())
        assert [row["state"] for row in json.loads(listed.stdout)] == ["running"], listed
        follow = cpuaccel("logs", "last", "-f", "--rank", "1", cwd=project, env=clean_env())
        # It returned once the run had ended (recorded), not before.
        run_json = json.loads(next((project / "runs").glob("*/run.json")).read_text())
        assert run_json.get("exit_code") == 0, run_json
        ended = job.finish()
    finally:
        job.stop()
    assert ended.code == 0, ended
    assert follow.returncode == EXIT_OK, follow.stderr
    lines = follow.stdout.splitlines()
    assert lines == [f"[rank 1 localhost] line {i} of rank 1" for i in range(12)], follow.stdout
    assert "ended: succeeded" in follow.stderr
    both = cpuaccel("logs", "last", "--host", "localhost", cwd=project, env=clean_env())
    assert sum("of rank 0" in line for line in both.stdout.splitlines()) == 12
    bad = cpuaccel("logs", "last", "--rank", "2", cwd=project, env=clean_env())
    assert bad.returncode == EXIT_USAGE and "ranks 0 to 1" in bad.stderr


def test_resume_takes_a_run_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = importlib.util.spec_from_file_location("example_train", REPO / "examples/train.py")
    assert spec is not None and spec.loader is not None
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    monkeypatch.chdir(tmp_path)
    run_id = "20250101-120000-abcdef"
    assert train.resume_path(run_id, None) == f"runs/{run_id}/checkpoint.pt"
    head_runs = tmp_path / "work" / "runs"
    (head_runs / run_id).mkdir(parents=True)
    (head_runs / run_id / "checkpoint.pt").write_bytes(b"x")
    this = str(head_runs / "20250102-000000-000000")
    assert train.resume_path(run_id, this) == str(head_runs / run_id / "checkpoint.pt")
    assert train.resume_path("ckpt.pt", this) == "ckpt.pt"


def test_a_local_run_needs_no_fetch(tmp_path: Path) -> None:
    project = make_project(tmp_path, {"hi.py": "print('hi')\n"})
    run = cpuaccel_run(project, "--nodes", "1", "--ppn", "1", "hi.py")
    assert run.code == 0, run
    fetched = cpuaccel("fetch", "last", cwd=project, env=clean_env())
    assert fetched.returncode == EXIT_OK and "ran on this machine" in fetched.stderr
    started = time.time()
    listed = cpuaccel("ps", cwd=project, env=clean_env())
    assert "succeeded" in listed.stdout and time.time() - started < 30


def test_an_unreachable_head_is_named_and_bounded(tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        "all:\n  hosts:\n    deadhead:\n      ansible_host: 127.0.0.1\n      ansible_port: 1\n"
    )
    run_id = "20250101-120000-abcdef"
    fields = {"detached": True, "head": "deadhead", "head_run_dir": "/nowhere/runs/x"}
    record(tmp_path, run_id, inventory=str(inventory), hosts=["deadhead"], **fields)
    started = time.monotonic()
    listed = cpuaccel("ps", "--json", cwd=tmp_path, env=clean_env())
    assert listed.returncode == EXIT_OK and json.loads(listed.stdout)[0]["state"] == "running"
    fetched = cpuaccel("fetch", "last", cwd=tmp_path, env=clean_env())
    assert fetched.returncode == EXIT_NODE_FAILED, fetched.stderr
    assert "deadhead" in fetched.stderr and "Traceback" not in fetched.stderr
    followed = cpuaccel("logs", "last", "-f", cwd=tmp_path, env=clean_env())
    assert followed.returncode == EXIT_NODE_FAILED, followed.stderr
    assert time.monotonic() - started < 60


def test_ps_reads_only_what_it_needs_of_hundreds_of_runs(tmp_path: Path) -> None:
    lines = "".join(json.dumps({"step": s, "loss": 1 / (s + 1)}) + "\n" for s in range(5000))
    for i in range(300):
        folder = record(tmp_path, f"20250101-{i // 60:02d}{i % 60:02d}00-{i:06x}", exit_code=0)
        (folder / "metrics.jsonl").write_text(lines)
    started = time.monotonic()
    shown = cpuaccel("ps", "--json", cwd=tmp_path, env=clean_env())
    seconds = time.monotonic() - started
    rows = json.loads(shown.stdout)
    assert len(rows) == 300 and {row["step"] for row in rows} == {4999}
    assert seconds < 15, seconds  # ~1 s here: run.json, status.json, 8 KB of metrics a run
    bad = cpuaccel("ps", "-i", str(tmp_path / "missing.yaml"), cwd=tmp_path, env=clean_env())
    assert bad.returncode == EXIT_USAGE and "missing.yaml" in bad.stderr
