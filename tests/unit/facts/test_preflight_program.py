"""The ``preflight`` node program: run's fact probe and its look at the project's copy
in one call, answering as the two programs would apart."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cpuaccel import node
from cpuaccel.connectors import programs
from cpuaccel.connectors.connect_options import ConnectOptions
from cpuaccel.connectors.local import LocalConnector
from cpuaccel.errors import HostError
from cpuaccel.executor import ConnectionPool
from cpuaccel.facts.gather import gather, gather_and_look, gather_look_and_keep
from cpuaccel.inventory.host import Host
from cpuaccel.projectsync import receiver
from cpuaccel.projectsync.location import DestinationRefused
from cpuaccel.projectsync.manifest import build


def _conn(workdir: Path) -> LocalConnector:
    vars_ = {"ansible_connection": "local", "cpuaccel_python": sys.executable}
    host = Host("box", {**vars_, "cpuaccel_workdir": str(workdir)})
    return LocalConnector(host, ConnectOptions())


def test_one_call_gives_the_facts_and_the_look(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("print('hi')\n")
    source = build([str(project)])
    conn = _conn(tmp_path / "work")
    look = receiver.words("look", str(project), conn.host.workdir, source.hash)[1:]
    facts, found = gather_and_look(conn, ["localhost"], 29511, look)
    alone = gather(conn, ["localhost"], 29511)
    assert facts["python"] == alone["python"] and facts["resolve"] == alone["resolve"]
    assert "port_free" in facts and "clock_skew" in facts
    # The node holds exactly the source's tree: the look says so without its entries.
    assert found["hash"] == source.hash and found["entries"] is None
    session = receiver.NodeSession(conn, str(project))  # the sync's own look
    try:
        # The sync's own look also lists the jobs' processes there (it ends an ended
        # run's leftovers): the preflight's facts carry those.
        looked = session.request("look", expect=source.hash)
        assert isinstance(looked.pop("runs"), dict)
        assert found == looked
    finally:
        session.close()
    (project / "train.py").write_text("print('changed')\n")
    _, changed = gather_and_look(conn, [], None, look)
    assert changed["hash"] != source.hash and "train.py" in changed["entries"]


def test_a_refused_destination_is_refused_as_by_the_tree_program(tmp_path: Path) -> None:
    conn = _conn(tmp_path / "work")
    look = receiver.words("look", "/", conn.host.workdir, "0" * 64)[1:]
    _, found = gather_and_look(conn, [], None, look)
    with pytest.raises(DestinationRefused):
        receiver.checked("box", found)


def test_the_program_carries_the_probe_the_receiver_and_the_jobs_part() -> None:
    assert node.parts("prelaunch") == [
        "boundedjson", "common", "jobprocs", "netif", "facts", "nofollow", "mux", "progress",
        "runfiles",
        "jobctl", "destination", "entries", "unfinished", "tree", "prelaunch",
    ]  # fmt: skip


RUN_ID = "20261201-000000-abcdef"
FILES = {"launch.sh": [0o700, "echo hi\n"], "secret.env": [0o600, "TOKEN=x\n"]}


def _kept(
    tmp_path: Path, idle: int = 30, heartbeat: float | None = None
) -> tuple[LocalConnector, programs.Kept]:
    project = tmp_path / "project"
    project.mkdir(exist_ok=True)
    conn = _conn(tmp_path / "work")
    look = receiver.words("look", str(project), conn.host.workdir, "0" * 64)[1:]
    facts, found, kept = gather_look_and_keep(conn, [], None, look, idle, heartbeat)
    assert facts["python"]["executable"] and "clock_skew" in facts and "entries" in found
    return conn, kept


def _ended(kept: programs.Kept, within: float) -> bool:
    process = kept._process  # the node program itself
    try:
        process.wait(within)
    except Exception:  # no status in time
        return False
    return True


def test_a_kept_program_answers_the_jobs_requests_on_its_channel(tmp_path: Path) -> None:
    """After its answer the program stays: the run's files and the sweep are requests
    on the same channel, answered as the jobs program answers them; EOF ends it."""
    _, kept = _kept(tmp_path)
    run_dir = tmp_path / "work" / "runs" / RUN_ID
    assert not run_dir.exists()  # the preflight itself writes nothing
    payload = json.dumps({"files": FILES}).encode()
    done = kept.request(["write", str(run_dir)], payload, what="writing", timeout=30)
    assert done == {"written": ["launch.sh", "secret.env"], "held": []}
    assert (run_dir / "secret.env").stat().st_mode & 0o777 == 0o600
    swept = kept.request(["end", RUN_ID, "0", str(run_dir)], b"", what="sweeping", timeout=30)
    assert swept["forgot"] is True and swept["left"] == [] and not (run_dir / "secret.env").exists()
    (tmp_path / "work" / "runs" / "link").symlink_to(tmp_path)
    with pytest.raises(HostError, match=r"writing failed on the node: refused: .*symbolic link"):
        kept.request(["write", str(tmp_path / "work" / "runs" / "link")], payload, what="writing",
                     timeout=30)  # fmt: skip
    assert not kept.alive  # a refusal ends what the controller keeps
    assert _ended(kept, 10)


def test_a_kept_program_leaves_after_its_idle_time_having_written_nothing(
    tmp_path: Path,
) -> None:
    _, kept = _kept(tmp_path, idle=1)
    started = time.monotonic()
    assert _ended(kept, 10) and time.monotonic() - started < 5
    assert not (tmp_path / "work" / "runs").exists()
    with pytest.raises(programs.KeptGone):
        kept.request(["procs", RUN_ID], b"", what="listing", timeout=5)


def _rank(run_id: str) -> subprocess.Popen[bytes]:
    """A process of the run on this node, as a rank is: its CPUACCEL_RUN_ID, its own
    session (no signal of the test's reaches it by the process group)."""
    env = {**os.environ, "CPUACCEL_RUN_ID": run_id}
    return subprocess.Popen(["sleep", "60"], env=env, start_new_session=True)


def _written(kept: programs.Kept, tmp_path: Path, run_id: str) -> None:
    run_dir = tmp_path / "work" / "runs" / run_id
    payload = json.dumps({"files": FILES}).encode()
    kept.request(["write", str(run_dir)], payload, what="writing", timeout=30)


def test_a_kept_program_that_hears_nothing_ends_its_runs_processes(tmp_path: Path) -> None:
    """No heartbeat and no EOF: the controller's session is gone unseen (a link cut).
    The program ends the processes of the run it wrote, and only those, then leaves."""
    run_id, other_id = "20261201-000000-aaaaaa", "20261201-000000-bbbbbb"
    _, kept = _kept(tmp_path, idle=2)
    rank, other = _rank(run_id), _rank(other_id)
    try:
        _written(kept, tmp_path, run_id)
        started = time.monotonic()
        assert _ended(kept, 15)
        assert rank.wait(10) == -signal.SIGTERM  # ended by the program, not by its end
        assert time.monotonic() - started < 2 + 8  # the idle time, the sweep's grace
        assert other.poll() is None  # another run's process is no concern of it
        assert not (tmp_path / "work" / "runs" / run_id / "secret.env").exists()
    finally:
        for proc in (rank, other):
            proc.kill()
            proc.wait()


def test_a_kept_program_that_gets_heartbeats_keeps_its_runs_processes(tmp_path: Path) -> None:
    run_id = "20261201-000000-cccccc"
    _, kept = _kept(tmp_path, idle=2, heartbeat=0.5)
    rank = _rank(run_id)
    try:
        _written(kept, tmp_path, run_id)
        time.sleep(5)  # more than twice the idle time, in heartbeats
        assert rank.poll() is None and kept.alive
        done = kept.request(["procs", run_id], b"", what="listing", timeout=10)
        assert [pid for pid, _ in done["pids"]] == [rank.pid]
        kept.close()  # EOF: the run goes on without this program (a detached run's way)
        assert _ended(kept, 10) and rank.poll() is None
    finally:
        rank.kill()
        rank.wait()


def test_the_run_files_go_to_the_kept_program_else_to_a_fresh_call(tmp_path: Path) -> None:
    from types import SimpleNamespace
    from typing import Any, cast

    from cpuaccel.jobs.connections import Nodes, copy_files

    conn, kept = _kept(tmp_path)
    run_dir = tmp_path / "work" / "runs" / RUN_ID
    plan = SimpleNamespace(hosts=[conn.host], run_dir=str(run_dir), run_id=RUN_ID)
    with Nodes(ConnectOptions(), 1, ConnectionPool(ConnectOptions())) as nodes:
        nodes.kept.add("box", kept)
        copy_files(cast(Any, plan), cast(Any, FILES), nodes)
        assert sorted(p.name for p in run_dir.iterdir()) == ["launch.sh", "secret.env"]
        assert nodes.kept.get("box") is kept  # still open, for the sweep
        kept._process.close()  # gone (EOF): a fresh call writes
        assert _ended(kept, 10)
        (run_dir / "launch.sh").unlink()
        copy_files(cast(Any, plan), cast(Any, FILES), nodes)
        assert (run_dir / "launch.sh").exists() and nodes.kept.get("box") is None
    assert not kept.alive
