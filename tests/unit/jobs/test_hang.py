"""`run --hang-timeout` without nodes: the progress marker and its
parsing, the tracker fed lines and times, the rank side's rate limit and its own pipe,
the setting (flag, project file, bad values), the output router, the stack dumps'
plumbing, the detached supervisor with a stand-in launch.sh, and a real local run.
The same on real nodes: tests/cluster/test_hang.py."""

from __future__ import annotations

import io
import json
import os
import secrets
import socket
import stat
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from cpuaccel import _progress
from cpuaccel.config.effective import resolve
from cpuaccel.config.project import parse_project
from cpuaccel.errors import EXIT_USAGE, ProjectFileError
from cpuaccel.inventory.host import Host
from cpuaccel.inventory.inventory import Inventory
from cpuaccel.jobs.foreground import terminal
from cpuaccel.jobs.plan import Script, build_plan
from cpuaccel.jobs.rundir import RunDir
from cpuaccel.node import detached, progress, supervisor
from cpuaccel.node.progress import ProgressTracker, marker, parse
from cpuaccel.node.supervisor import (
    EXIT_TIMEOUT,
    Limits,
    Output,
    Side,
    Supervised,
    Watched,
    _outcome,
)
from tests.unit.node.detached_runs import detached_run
from tests.unit.node.test_supervisor import final_status
from testsupport.command import clean_env, cpuaccel
from testsupport.runs import cpuaccel_run, make_project

# Its own id: a run's processes are found (and swept) by run id, and another test file
# may run a job at the same time.
RUN_ID = f"20260101-000000-{secrets.token_hex(3)}"
HERE = socket.gethostname()


# ---------------------------------------------------------------- the marker


def test_a_marker_is_read_back_only_in_its_exact_form_for_this_run() -> None:
    assert marker(RUN_ID, step=12) == f"[cpuaccel] progress {RUN_ID} step=12"
    assert parse(marker(RUN_ID, step=12), RUN_ID) == {"step": 12}
    assert parse(marker(RUN_ID, pid=345), RUN_ID) == {"pid": 345}
    assert parse(marker(RUN_ID, step=1, pid=2), RUN_ID) == {"step": 1, "pid": 2}
    # Lines a user may well print, or copy from another run's log: theirs, not ours.
    for text in (
        "[cpuaccel] progress 20250505-000000-ffffff step=3",  # another run's id
        "[cpuaccel] progress step=3",  # no run id
        f"[cpuaccel] progress {RUN_ID}",  # no field
        f"[cpuaccel] progress {RUN_ID} step=three",
        f"[cpuaccel] progress {RUN_ID} step=-1",
        f"[cpuaccel] progress {RUN_ID} step=\u00b2",  # a digit to str.isdigit, no int
        f"[cpuaccel] progress {RUN_ID} step=1 done",  # words after it
        f"[cpuaccel] progress {RUN_ID} step=1 step=2",
        f"[cpuaccel] progress {RUN_ID} loss=0.5",
        f"[cpuaccel] progress {RUN_ID}  step=1",  # spaced otherwise
        f" [cpuaccel] progress {RUN_ID} step=1",
        f"[cpuaccel] progressing {RUN_ID} step=1",
    ):
        assert parse(text, RUN_ID) is None, text


def test_the_marker_interval_is_a_tenth_of_the_timeout_within_bounds() -> None:
    assert progress.marker_interval(20) == 2.0
    assert progress.marker_interval(2) == 0.5
    assert progress.marker_interval(3600) == 5.0


# ---------------------------------------------------------------- the tracker


def tracker(timeout: float = 20, world: int = 3) -> ProgressTracker:
    return ProgressTracker(RUN_ID, timeout, world, 100.0, {0: "n1", 1: "n1", 2: "n2"})


def test_a_job_stalls_only_when_no_rank_progressed_for_the_timeout() -> None:
    t = tracker()
    slack = progress.marker_interval(20)  # a marker may trail its step by one interval
    assert not t.stalled(100.0 + 20 + slack - 0.01)  # from the start, before any line
    assert t.stalled(100.0 + 20 + slack)
    assert t.line(0, "n1", "loading data", 110.0) is False  # any line is progress
    assert not t.stalled(110.0 + 20 + slack - 0.01)
    t.line(2, "n2", marker(RUN_ID, step=4), 125.0)  # one rank progressing is enough
    assert t.idle(130.0) == pytest.approx(5.0)
    assert not t.stalled(140.0) and t.stalled(125.0 + 20 + slack)


def test_markers_are_hidden_and_tracked_but_a_look_alike_is_the_users() -> None:
    t = tracker()
    assert t.line(1, "n1", marker(RUN_ID, pid=4321), 101.0) is True
    assert t.line(1, "n1", marker(RUN_ID, step=7), 102.0) is True
    look_alike = "[cpuaccel] progress 20250505-000000-ffffff step=99"
    assert t.line(1, "n1", look_alike, 103.0) is False
    assert (t.ranks[1].step, t.ranks[1].pid, t.ranks[1].last) == (7, 4321, 103.0)
    assert t.pids() == {"1": ["n1", 4321]}  # only the ranks that announced a pid


def test_the_report_puts_the_likeliest_stuck_ranks_first() -> None:
    t = tracker(world=4)
    t.line(0, "node-a", marker(RUN_ID, step=41), 130.0)
    t.line(1, "node-a", marker(RUN_ID, step=40), 131.0)  # behind the others
    t.line(3, "node-b", marker(RUN_ID, step=41), 120.0)
    # rank 2 never wrote a line: the plan's host, and first in the report
    assert [p.rank for p in t.stuck_first()] == [2, 1, 3, 0]
    assert t.report(151.0) == [
        "rank 2 on n2: no step seen, 51.0 s since the start (no output seen)",
        "rank 1 on node-a: last step 40, 20.0 s since its last progress",
        "rank 3 on node-b: last step 41, 31.0 s since its last progress",
        "rank 0 on node-a: last step 41, 21.0 s since its last progress",
    ]
    assert t.ranks[1].to_json(151.0) == {"rank": 1, "host": "node-a", "step": 40, "idle": 20.0}
    assert progress.planned_hosts(["a", "b"], 2, 4) == {0: "a", 1: "a", 2: "b", 3: "b"}
    assert progress.planned_hosts(["a"], None, 4) == {}


# ---------------------------------------------------------------- the rank side


def test_the_heartbeat_writes_at_most_one_marker_an_interval() -> None:
    written: list[str] = []
    beat = _progress.Heartbeat(RUN_ID, 2.0, written.append)
    assert beat.beat(1, now=10.0) is True  # the first step at once
    assert [beat.beat(s, now=10.0 + s / 10) for s in range(2, 15)] == [False] * 13
    assert beat.beat(21, now=12.0) is True
    assert written == [marker(RUN_ID, step=1), marker(RUN_ID, step=21)]
    beat.announce()
    assert written[-1] == marker(RUN_ID, pid=os.getpid())


def test_no_heartbeat_unless_the_run_asked_for_hang_detection() -> None:
    env = {"CPUACCEL_RUN_ID": RUN_ID}
    assert _progress.Heartbeat.from_environ(env) is None
    assert _progress.Heartbeat.from_environ({**env, progress.ENV: "bad"}) is None
    assert _progress.Heartbeat.from_environ({progress.ENV: "2"}) is None  # not under run
    found = _progress.Heartbeat.from_environ({**env, progress.ENV: "2"})
    assert found is not None and (found.run_id, found.interval) == (RUN_ID, 2.0)


def test_a_prepared_optimizer_beats_after_each_step_when_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch

    def optimizer() -> torch.optim.Optimizer:
        return torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)

    written: list[str] = []
    monkeypatch.setattr(_progress, "_beat", None)  # not asked: not even a hook
    quiet = optimizer()
    _progress.watch_optimizer(quiet, lambda: 0)
    assert not quiet._optimizer_step_post_hooks  # nothing runs after its steps
    monkeypatch.setattr(_progress, "_beat", _progress.Heartbeat(RUN_ID, 0.0, written.append))
    opt = optimizer()
    _progress.watch_optimizer(opt, lambda: 0)
    opt.step()
    opt.step()
    behind = optimizer()
    _progress.watch_optimizer(behind, lambda: 7)  # ctx.backward counted further
    behind.step()
    assert written == [marker(RUN_ID, step=s) for s in (1, 2, 7)]


def worker(tmp_path: Path, source: str, **env: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "script.py").write_text(source)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "SLURM_"))}
    return subprocess.run(
        [sys.executable, "-m", "cpuaccel.worker", "script.py"],
        capture_output=True,
        text=True,
        env={**base, "CPUACCEL_LABEL_OUTPUT": "1", "PMI_RANK": "1", "PMI_SIZE": "2", **env},
        cwd=tmp_path,
        timeout=60,
    )


# A script writing half a line on stderr (a progress bar does) around its steps.
HALF_LINES = """\
import sys
from cpuaccel import _progress
sys.stderr.write("10%|#")
sys.stderr.flush()
_progress.beat(1)
_progress.beat(2)  # within the interval: no marker
sys.stderr.write("#| 20%\\n")
print("done")
"""


def test_the_worker_announces_its_pid_and_markers_never_split_a_users_line(
    tmp_path: Path,
) -> None:
    label = f"[rank 1 {HERE}] "
    done = worker(tmp_path, HALF_LINES, CPUACCEL_RUN_ID=RUN_ID, CPUACCEL_PROGRESS="60")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [label + "done"]
    err = done.stderr.splitlines()
    assert label + "10%|##| 20%" in err  # whole, as the script wrote it
    markers = [parse(line[len(label) :], RUN_ID) for line in err if "progress" in line]
    assert len(markers) == 2 and markers[1] == {"step": 1}, err
    assert markers[0] is not None and markers[0]["pid"] > 0  # the script's process
    # Without hang detection asked for: not one marker.
    plain = worker(tmp_path, HALF_LINES, CPUACCEL_RUN_ID=RUN_ID)
    assert "progress" not in plain.stderr and label + "10%|##| 20%" in plain.stderr


# ---------------------------------------------------------------- the setting


def settings(flags: dict[str, Any], project_text: str | None = None) -> Any:
    chosen = [Host("n1", {"cpuaccel_python": "/opt/venv/bin/python"})]
    inventory = Inventory(None, {h.name: h for h in chosen}, {})
    project = parse_project(project_text, "cpuaccel.yaml") if project_text else None
    return resolve(flags, project, inventory, chosen)


def test_hang_timeout_from_the_flag_the_project_file_or_off() -> None:
    assert settings({}).hang_timeout.value is None
    from_file = settings({}, "ppn: 1\nhang_timeout: 30\n").hang_timeout
    assert (from_file.value, from_file.where) == (30.0, "cpuaccel.yaml:2")
    flag = settings({"hang_timeout": 12.5}, "hang_timeout: 30\n").hang_timeout
    assert (flag.value, flag.source, flag.where) == (12.5, "flag", "--hang-timeout")
    plan = build_plan(settings({"hang_timeout": 20.0, "ppn": 2}), Script("t.py"), None, RUN_ID)
    assert plan.hang_timeout == 20.0 and plan.env[progress.ENV] == "2"
    plan = build_plan(settings({"ppn": 2}), Script("t.py"), None, RUN_ID)
    assert plan.hang_timeout is None and progress.ENV not in plan.env


@pytest.mark.parametrize("value", ["0", "-5", "'soon'", "true", ".nan"])
def test_a_bad_hang_timeout_in_the_project_file_names_its_line(value: str) -> None:
    with pytest.raises(ProjectFileError) as caught:
        parse_project(f"ppn: 2\nhang_timeout: {value}\n", "cpuaccel.yaml")
    assert str(caught.value).startswith("cpuaccel.yaml:2: hang_timeout must be")


@pytest.mark.parametrize("value", ["0", "abc", "-1"])
def test_a_bad_hang_timeout_flag_is_one_line_exit_64(tmp_path: Path, value: str) -> None:
    (tmp_path / "t.py").write_text("print(1)\n")
    done = cpuaccel("run", "--hang-timeout", value, "t.py", cwd=tmp_path, env=clean_env())
    assert done.returncode == EXIT_USAGE, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0].startswith("error: Invalid value for '--hang-timeout'"), lines
    assert len(lines) == 2 and lines[1].startswith("  fix:") and "Traceback" not in done.stderr


def test_a_bad_hang_timeout_in_the_project_file_is_exit_64(tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text("print(1)\n")
    (tmp_path / "cpuaccel.yaml").write_text("nodes: 1\nhang_timeout: 0.5\n")
    done = cpuaccel("run", "--dry-run", "t.py", cwd=tmp_path, env=clean_env())
    assert done.returncode == EXIT_USAGE, done.stderr
    assert "cpuaccel.yaml:2: hang_timeout must be at least 1 s, got 0.5" in done.stderr


def test_config_show_names_where_the_hang_timeout_comes_from(tmp_path: Path) -> None:
    (tmp_path / "cpuaccel.yaml").write_text("nodes: 1\nhang_timeout: 300\n")
    done = cpuaccel("config", "show", "--json", cwd=tmp_path, env=clean_env())
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)["hang_timeout"]
    assert shown == {"value": 300.0, "source": "project file", "where": "cpuaccel.yaml:2"}


# ---------------------------------------------------------------- the supervisors


def router(tmp_path: Path) -> tuple[Output, io.StringIO, io.StringIO, RunDir]:
    run_dir = RunDir(tmp_path / "run")
    run_dir.path.mkdir()
    out, err = io.StringIO(), io.StringIO()
    consoles = [Console(file=f, color_system=None, highlight=False, width=250) for f in (out, err)]
    return Output(str(run_dir.path), terminal(*consoles)), out, err, run_dir


def test_the_router_keeps_markers_out_of_view_and_logs_but_not_look_alikes(
    tmp_path: Path,
) -> None:
    r, out, err, run_dir = router(tmp_path)
    r.progress = tracker()
    r.feed("err", f"[rank 1 n1] {marker(RUN_ID, pid=77)}")
    r.feed("err", f"[rank 1 n1] {marker(RUN_ID, step=5)}")
    r.feed("out", "[rank 1 n1] [cpuaccel] progress 20250505-000000-ffffff step=9")
    r.feed("out", "[rank 0 n1] epoch 1")
    r.close()
    assert out.getvalue().splitlines() == [
        "[rank 1 n1] [cpuaccel] progress 20250505-000000-ffffff step=9",
        "[rank 0 n1] epoch 1",
    ]
    assert err.getvalue() == ""
    assert (run_dir.path / "rank-1.log").read_text() == (
        "[cpuaccel] progress 20250505-000000-ffffff step=9\n"
    )
    assert (r.progress.ranks[1].step, r.progress.ranks[1].pid) == (5, 77)
    assert r.progress.ranks[0].seen and not r.progress.ranks[2].seen


def test_a_hang_ends_the_job_as_a_failure_with_124(tmp_path: Path) -> None:
    r, _, _, run_dir = router(tmp_path)
    hung = [{"rank": 1, "host": "n1", "step": 3, "idle": 21.0}]
    outcome = _outcome("hang", 143, 25.0, r, Watched(hung=hung))
    assert (outcome.exit_code, outcome.reason) == (EXIT_TIMEOUT, "hang") == (124, "hang")

    here = Side()
    here.run_id, here.run_dir, here.hosts = RUN_ID, str(run_dir.path), ["n1"]
    doc = supervisor.status_doc(RUN_ID, 1.0, False, None, 2)
    Supervised(here, Limits(hang_timeout=20.0, ppn=2), doc).finish(outcome)
    status = json.loads((run_dir.path / "status.json").read_text())
    assert (status["state"], status["ended_by"], status["exit_code"]) == ("failed", "hang", 124)
    assert status["hang"] == hung


def fake_py_spy(folder: Path) -> str:
    path = folder / "py-spy"
    path.write_text('#!/bin/sh\necho "stack of $3 ($1 $2)"\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_stacks_are_dumped_only_for_this_nodes_ranks_of_this_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ranks = {"0": [HERE, 101], "1": [HERE, 102], "2": ["elsewhere", 101]}
    monkeypatch.setattr(progress, "find_py_spy", lambda: None)
    assert progress.stacks(ranks, {101, 102}, 5) == {}  # no py-spy: nothing, silently
    monkeypatch.setattr(progress, "find_py_spy", lambda: fake_py_spy(tmp_path))
    # 102 is not among the job's processes here (a stale or foreign pid): never touched.
    found = progress.stacks(ranks, {101}, 5)
    assert found == {"0": "stack of 101 (dump --pid)\n"}
    assert progress.write_stacks(str(tmp_path), found) == ["hang-0.txt"]
    assert (tmp_path / "hang-0.txt").read_text() == found["0"]
    assert (tmp_path / "hang-0.txt").stat().st_mode & 0o777 == 0o600


def test_the_detached_supervisor_ends_a_hung_job(tmp_path: Path) -> None:
    look_alike = "[cpuaccel] progress 20250505-000000-ffffff step=9"
    # An id of its own: a sweep of another test's run on this machine must not end it.
    run_id = f"20260101-000000-{uuid.uuid4().hex[:6]}"
    run_dir = detached_run(
        tmp_path,
        run_id,
        f"echo '[rank 0 h] {marker(run_id, step=3)}'\n"
        f"echo '[rank 1 h] {look_alike}'\n"
        "exec sleep 60\n",
        hang_timeout=3,  # room for a slow start on a loaded machine: 3.5 s from the last line
    )
    detached.start(run_dir)
    status = final_status(run_dir)
    assert (status["state"], status["ended_by"], status["exit_code"]) == ("failed", "hang", 124)
    # Each rank named by its node's inventory name (the hosts of supervisor.json), not
    # by the hostname its label carried.
    assert [(h["rank"], h["host"], h["step"]) for h in status["hang"]] == [
        (1, "here", None),
        (0, "here", 3),
    ]
    assert status["ended"] - status["started"] < 15  # the sleep was ended, not waited for
    assert not Path(run_dir, "rank-0.log").exists()  # the marker only: nothing for the log
    assert Path(run_dir, "rank-1.log").read_text() == look_alike + "\n"
    log = Path(run_dir, "supervisor.log").read_text()
    assert "hang: no rank made progress for" in log
    assert "rank 1 on here: no step seen" in log and "rank 0 on here: last step 3" in log


# Rank 0 takes steps through the runtime's marker, then both ranks fall silent.
SILENT = """\
import os, time
from cpuaccel import _progress
if os.environ["RANK"] == "0":
    for step in range(1, 4):
        _progress.beat(step)
        time.sleep(0.6)
print("waiting", flush=True)
time.sleep(120)
"""


def this_runs_processes(run_id: str) -> list[int]:
    mark = f"CPUACCEL_RUN_ID={run_id}".encode()
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] == b"Z":
                continue  # dead already, waiting for its parent to reap it
            if mark in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                found.append(int(pid))
        except OSError:
            continue
    return found


def test_a_local_run_that_hangs_is_ended_with_its_report(tmp_path: Path) -> None:
    proj = make_project(tmp_path, {"silent.py": SILENT})
    run = cpuaccel_run(proj, "--nodes", "1", "--ppn", "2", "--hang-timeout", "5", "silent.py")
    assert run.code == 124, run
    assert "hang: no rank made progress for" in run.stderr
    # The node by its inventory name (localhost), as logs and the dashboard name it.
    assert "rank 0 on localhost: last step 3," in run.stderr  # markers may skip none here
    assert "rank 1 on localhost: no step seen," in run.stderr
    assert run.stderr.index("rank 1 on") < run.stderr.index("rank 0 on")  # stuck first
    assert "hang: 2 rank(s) on 1 node(s)" in run.stderr and "[cpuaccel] progress" not in run.stdout
    status = json.loads((run.run_dir / "status.json").read_text())
    assert (status["state"], status["ended_by"], status["exit_code"]) == ("failed", "hang", 124)
    assert json.loads((run.run_dir / "run.json").read_text())["reason"] == "hang"
    assert "progress" not in (run.run_dir / "rank-0.log").read_text()
    if progress.find_py_spy() is not None:  # the dev install has it (pyproject's dev extra)
        for rank in (0, 1):
            assert "silent.py" in (run.run_dir / f"hang-{rank}.txt").read_text()
    assert this_runs_processes(status["run_id"]) == []


def _dump(pid: int, *frames: str) -> str:
    """A ``py-spy dump`` as py-spy prints it: the innermost frame first."""
    lines = [f"Process {pid}: python -m cpuaccel.worker hang.py", "Python v3.11.7", ""]
    lines.append(f'Thread {pid + 1} (idle): "gloo"')
    lines.append("    run (threading.py:975)")
    lines.append(f'Thread {pid} (idle): "MainThread"')
    lines += [f"    {frame}" for frame in frames]
    return "\n".join(lines) + "\n"


COLLECTIVE = "all_reduce (torch/distributed/distributed_c10d.py:2050)"


def test_the_rank_outside_the_collective_the_others_wait_in_is_the_odd_one_out() -> None:
    dumps = {
        "0": _dump(100, COLLECTIVE, "backward (cpuaccel/runtime/context.py:300)"),
        "1": _dump(200, COLLECTIVE, "backward (cpuaccel/runtime/context.py:300)"),
        "2": _dump(300, "<module> (hang.py:15)"),
        "3": _dump(400, COLLECTIVE, "backward (cpuaccel/runtime/context.py:300)"),
    }
    assert progress.innermost(dumps["2"]) == "<module> (hang.py:15)"
    assert progress.odd_ones_out(dumps) == (["2"], COLLECTIVE)


def test_no_odd_one_out_without_a_majority_in_one_frame() -> None:
    assert progress.odd_ones_out({"0": _dump(1, COLLECTIVE), "1": _dump(2, "f (a.py:1)")}) is None
    same = {str(r): _dump(r + 10, COLLECTIVE) for r in range(3)}
    assert progress.odd_ones_out(same) is None  # all alike: no one is elsewhere
    assert progress.odd_ones_out({"0": "py-spy failed: no such process"}) is None
