"""A detached run's supervisor (the ``detached`` node program, node/detached.py, running
node/supervisor.py's loop) on this machine, with a stand-in launch.sh, and `cpuaccel
stop`'s run lookup. The real thing on nodes: tests/cluster/test_detach.py."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from cpuaccel import node, worker
from cpuaccel.errors import EXIT_USAGE, UsageError
from cpuaccel.jobs import teardown as stop
from cpuaccel.node import detached, progress, supervisor
from testsupport.command import clean_env, cpuaccel


def new_run_id() -> str:
    """An id of its own: a run's processes are found (and swept) by run id, and another
    run, of this file or another, may still be ending (its supervisor sweeping) meanwhile."""
    return f"20260101-000000-{secrets.token_hex(3)}"


RUN_ID = new_run_id()


def make_run(tmp_path: Path, launch: str, timeout: float | None = None, run_id: str = "") -> str:
    """A detached run's folder, under ``run_id`` or a new one (its folder's name)."""
    run_id = run_id or new_run_id()
    run_dir = tmp_path / "runs" / run_id
    run_dir.mkdir(parents=True)
    config = {"run_id": run_id, "head": "here", "world": 2, "timeout": timeout, "nodes": {}}
    (run_dir / "supervisor.json").write_text(json.dumps(config))
    (run_dir / "supervisor.py").write_bytes(node.program("detached"))
    (run_dir / "launch.sh").write_text(
        f"export CPUACCEL_RUN_ID={run_id}\necho $$ > {run_dir}/launcher.pid\n{launch}"
    )
    return str(run_dir)


def final_status(run_dir: str, timeout: float = 30, running: bool = False) -> dict[str, Any]:
    """status.json once its state is no longer running (or, with ``running``, is)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = supervisor.read_status(run_dir)
        if status and (status["state"] == "running") == running:
            return status
        time.sleep(0.1)
    raise AssertionError(supervisor.read_status(run_dir))


def test_a_job_that_completes_is_logged_per_rank_and_succeeds(tmp_path: Path) -> None:
    run_dir = make_run(
        tmp_path,
        "echo '[rank 0 h] hello'\necho '[rank 1 h] world' >&2\necho 'launcher words'\n"
        "echo '[rank 0 h] [cpuaccel] exit code 0'\necho '[rank 1 h] [cpuaccel] exit code 0'\n",
    )
    started = detached.start(run_dir)
    assert started["pid"] > 0
    status = final_status(run_dir)
    assert status["state"] == "succeeded" and status["exit_code"] == 0
    assert status["ranks"] == {"0": 0, "1": 0} and status["ended_by"] == "completed"
    assert status["detached"] is True and status["supervisor"]["pid"] == started["pid"]
    assert Path(run_dir, "rank-0.log").read_text() == "hello\n"
    assert Path(run_dir, "rank-1.log").read_text() == "world\n"
    assert Path(run_dir, "launcher.log").read_text() == "launcher words\n"
    assert Path(run_dir, "status.json").stat().st_mode & 0o777 == 0o600


def test_a_failing_rank_ends_the_job_with_its_code(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, "echo '[rank 1 h] [cpuaccel] exit code 7'\nexec sleep 60\n")
    detached.start(run_dir)
    status = final_status(run_dir)
    assert status["state"] == "failed" and status["exit_code"] == 7
    # Rank 0 never reported: the supervisor's SIGTERM ended it, and says so.
    assert status["ended_by"] == "rank 1" and status["ranks"] == {"0": 143, "1": 7}
    assert status["signals"] == {"0": "SIGTERM"}
    assert status["ended"] - status["started"] < 15  # the sleep was ended, not waited for


def test_timeout_and_stop(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path / "a", "exec sleep 60\n", timeout=1)
    detached.start(run_dir)
    status = final_status(run_dir)
    assert status["state"] == "timeout" and status["exit_code"] == 124

    run_dir = make_run(tmp_path / "b", "exec sleep 60\n")
    pid = detached.start(run_dir)["pid"]
    # Stopped once its job runs: a supervisor ended while Python still starts writes no
    # status (teardown marks such a run itself).
    final_status(run_dir, running=True)
    assert detached.stop("some-other-run", pid, 5) == {"signalled": False, "alive": False}
    run_id = Path(run_dir).name
    assert detached.is_supervisor(pid, run_id)
    assert detached.stop(run_id, pid, 30) == {"signalled": True, "alive": False}
    status = final_status(run_dir)
    assert status["state"] == "stopped" and status["exit_code"] == 143
    assert status["ended_by"] == "stop" and status["left"] == {}


def test_mark_ended_changes_only_a_running_status(tmp_path: Path) -> None:
    run_dir = str(tmp_path)
    supervisor.write_status(run_dir, supervisor.status_doc("r", 1.0, True, None, 1))
    assert supervisor.mark_ended(run_dir, "stopped", "stop")["state"] == "stopped"  # type: ignore[index]
    assert supervisor.mark_ended(run_dir, "lost", "x")["state"] == "stopped"  # type: ignore[index]


def test_the_supervisor_reads_the_lines_the_worker_writes() -> None:
    assert worker.EXIT_MARKER is progress.EXIT_MARKER
    assert worker.KILLED_MARKER is progress.KILLED_MARKER
    label = f"[rank 3 node-2.example] {worker.EXIT_MARKER} 7"  # as worker.py labels it
    found = supervisor.LABEL.match(label)
    assert found is not None and (found[1], found[2]) == ("3", "node-2.example")
    assert supervisor._reported_code(found[3]) == 7
    assert supervisor.STATES.keys() >= {"completed", "failed", "terminated", "timeout", "lost"}


def test_a_rank_s_marker_after_another_writer_s_unfinished_line_is_read(
    tmp_path: Path,
) -> None:
    """setsid -w writes "setsid: " and its message apart on the launcher's stream, which
    the ranks share: a rank's marker lines can land in between (seen under 2 x 2 runs,
    a rank cpuaccel ended then recorded None)."""
    output = supervisor.Output(str(tmp_path))
    output.quiet = True  # the supervisor is ending the job
    output.feed("err", f"setsid: [rank 3 node2] {worker.KILLED_MARKER} SIGTERM")
    output.feed("err", "child 28750 did not exit normally: Success")
    output.feed("err", f"[rank 3 node2] {worker.EXIT_MARKER} 143")
    output.feed("err", f"[mpirun] a word [rank 2 node2] {worker.EXIT_MARKER} 9")
    output.feed("err", "[mpirun] [rank 1 x] is only the launcher's word")
    output.close()
    assert output.codes == {3: 143, 2: 9} and output.signals == {3: "SIGTERM"}
    launcher = (tmp_path / "launcher.log").read_text().splitlines()
    assert launcher == [
        "setsid: ",
        "child 28750 did not exit normally: Success",
        "[mpirun] a word ",
        "[mpirun] [rank 1 x] is only the launcher's word",
    ]


def test_find_run_takes_an_id_a_prefix_or_last(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    for name in ("20260101-000000-aaaaaa", "20260102-000000-bbbbbb", "20260102-000000-bbbccc"):
        (runs / name).mkdir(parents=True)
        (runs / name / "run.json").write_text("{}")
    (runs / "20270101-notarun").mkdir()  # no run.json: not a run
    assert stop.find_run(runs, "last").name == "20260102-000000-bbbccc"
    assert stop.find_run(runs, "20260101").name == "20260101-000000-aaaaaa"
    assert stop.find_run(runs, "20260102-000000-bbbbbb").name == "20260102-000000-bbbbbb"
    with pytest.raises(UsageError, match="ambiguous"):
        stop.find_run(runs, "20260102")
    with pytest.raises(UsageError, match="no run"):
        stop.find_run(runs, "2027")
    with pytest.raises(UsageError, match="no run"):
        stop.find_run(tmp_path / "none", "last")


def test_stop_of_an_unknown_run_is_a_usage_error(tmp_path: Path) -> None:
    done = cpuaccel("stop", "nosuchrun", cwd=tmp_path, env=clean_env(), timeout=60)
    assert done.returncode == EXIT_USAGE, done.stderr
    assert "no run 'nosuchrun'" in done.stderr and "Traceback" not in done.stderr


def test_detach_with_dry_run_is_refused(tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text("print(1)\n")
    done = cpuaccel(
        "run", "--detach", "--dry-run", "t.py", cwd=tmp_path, env=clean_env(), timeout=60
    )
    assert done.returncode == EXIT_USAGE, done.stderr
    assert "--detach and --dry-run together" in done.stderr


def test_supervisor_program_is_bundled_with_what_it_imports() -> None:
    parts = node.parts("detached")
    assert parts[-1] == "detached" and {"supervisor", "jobctl", "common"} <= set(parts)
    assert os.environ.get(detached.MARK) is None


def _hold(run_dir: str) -> subprocess.Popen[bytes]:
    """``supervisor.py - hold RUN_DIR`` as the head's ssh.sh starts it, stdin held here."""
    proc = subprocess.Popen(
        [sys.executable, os.path.join(run_dir, "supervisor.py"), "-", "hold", run_dir],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == detached.ALIVE.encode() + b"\n"
    return proc


def test_a_held_session_ends_when_the_head_closes_it(tmp_path: Path) -> None:
    proc = _hold(make_run(tmp_path, "true"))
    assert proc.stdin is not None
    proc.stdin.close()
    assert proc.stdout is not None
    out = proc.stdout.read()
    assert proc.wait(timeout=10) == 0 and json.loads(out.splitlines()[-1]) == {}


def test_a_held_session_ends_once_the_guard_found_the_head_lost(tmp_path: Path) -> None:
    """The head's link went silent: nothing closes the session, the guard's lost.json
    ends it (the stdin pipe stays open here throughout)."""
    run_dir = make_run(tmp_path, "true")
    proc = _hold(run_dir)
    time.sleep(detached.HOLD_POLL * 2)
    assert proc.poll() is None  # open stdin, no lost.json: it holds
    Path(run_dir, "lost.json").write_text('{"lost": "here"}\n')
    assert proc.stdout is not None
    out = proc.stdout.read()  # ends without stdin closing
    assert proc.wait(timeout=10) == 0
    assert json.loads(out.splitlines()[-1]) == {"head": "lost"}
    assert proc.stdin is not None
    proc.stdin.close()


class _TwoNodes(supervisor.Side):
    run_id, run_dir, hosts = RUN_ID, ".", ["n1", "n2"]


def _filled(sent: int | None, lost: list[str]) -> supervisor.Outcome:
    job = supervisor.Supervised(_TwoNodes(), supervisor.Limits(ppn=2), {"ranks": {}})
    outcome = supervisor.Outcome(
        3, "failed", 1.0, 1, None, codes={1: 3, 3: 143}, signals={3: "SIGTERM"}, sent=sent,
        lost=lost,
    )  # fmt: skip
    job.unreported(outcome)
    return outcome


def test_a_rank_the_supervisor_ended_before_it_could_report_is_recorded_so() -> None:
    """A rank still starting when the supervisor's SIGTERM came reports nothing: it is
    recorded as ended by that signal, never on a lost node, never when none was sent."""
    ended = _filled(signal.SIGTERM, [])
    assert ended.codes == {0: 143, 1: 3, 2: 143, 3: 143}
    assert ended.signals == {0: "SIGTERM", 2: "SIGTERM", 3: "SIGTERM"}
    killed = _filled(signal.SIGKILL, ["n2"])  # rank 2 was n2's: unknown
    assert killed.codes == {0: 137, 1: 3, 3: 143}
    assert killed.signals == {0: "SIGKILL", 3: "SIGTERM"}
    assert _filled(None, []).codes == {1: 3, 3: 143}
