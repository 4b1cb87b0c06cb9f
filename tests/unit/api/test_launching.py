"""cpuaccel.launch and Run on this machine: the CLI's path from Python, silent unless
asked, safe from threads, never exiting the caller."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

import cpuaccel
from cpuaccel.errors import PreflightError, WaitTimeout
from testsupport.command import cpuaccel as cpuaccel_command
from testsupport.command import inherited_env

# Each rank says who it is; rank 1 leaves with EXIT (0 unless the argument says).
SCRIPT = """\
import os, sys, time
rank = int(os.environ["RANK"])
print(f"hello from rank {rank} of {os.environ['WORLD_SIZE']}", flush=True)
if len(sys.argv) > 2:
    time.sleep(float(sys.argv[2]))
sys.exit(int(sys.argv[1]) if rank == 1 and len(sys.argv) > 1 else 0)
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project of this machine alone (no inventory): the script, and nothing else."""
    (tmp_path / "hello.py").write_text(SCRIPT)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CPUACCEL_INVENTORY", raising=False)
    return tmp_path


def test_a_run_prints_nothing_and_its_handle_reads_what_ps_and_logs_read(
    project: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    run = cpuaccel.launch("hello.py", nodes=1, ppn=2)
    assert capfd.readouterr() == ("", "")  # no printing by default, not even the ranks'
    result = run.wait(timeout=5)  # a foreground run has ended when launch returns
    assert (result.exit_code, result.state, result.ranks) == (0, "succeeded", {0: 0, 1: 0})
    assert result.ok and result.seconds is not None and result.seconds > 0
    assert run.folder == project / "runs" / run.id
    # status() is the run's row of `cpuaccel ps --json`, field for field.
    listed = cpuaccel_command("ps", "--json", cwd=project, env=inherited_env())
    row = json.loads(listed.stdout)[0]
    status = run.status()
    assert status == {**row, "seconds": status["seconds"]} and row["id"] == run.id
    assert [r["id"] for r in cpuaccel.runs()] == [run.id]
    texts = {(line.rank, line.text) for line in run.logs()}
    assert texts == {(0, "hello from rank 0 of 2"), (1, "hello from rank 1 of 2")}
    assert [line.text for line in run.logs(rank=1)] == ["hello from rank 1 of 2"]
    assert capfd.readouterr() == ("", "")


def test_progress_prints_what_cpuaccel_run_prints(
    project: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    run = cpuaccel.launch("hello.py", "3", "0.5", nodes=1, ppn=2, progress=True)
    out, err = capfd.readouterr()
    assert "[rank 0 localhost] hello from rank 0 of 2" in out
    assert f"run directory: {run.folder}" in err
    result = run.wait()
    # A failing rank is a result, not an exception: the first failing rank's code.
    assert (result.exit_code, result.state, result.ranks[1]) == (3, "failed", 3)


def test_two_threads_launch_at_once_and_only_the_one_that_asked_prints(
    project: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    runs: dict[str, cpuaccel.Run] = {}
    errors: list[BaseException] = []

    def start(name: str, progress: bool) -> None:
        try:
            runs[name] = cpuaccel.launch("hello.py", nodes=1, ppn=1, progress=progress)
        except BaseException as exc:  # the test fails on it below
            errors.append(exc)

    threads = [
        threading.Thread(target=start, args=("loud", True)),
        threading.Thread(target=start, args=("quiet", False)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors and set(runs) == {"loud", "quiet"}, errors
    assert runs["loud"].id != runs["quiet"].id
    assert all(run.wait(timeout=5).ok for run in runs.values())
    _, err = capfd.readouterr()
    assert f"run directory: {runs['loud'].folder}" in err
    assert runs["quiet"].id not in err


def test_a_detached_run_is_waited_for_and_stopped(project: Path) -> None:
    run = cpuaccel.launch("hello.py", "0", "60", nodes=1, ppn=2, detach=True)
    assert run.status()["state"] == "running" and run.status()["detached"] is True
    with pytest.raises(WaitTimeout) as late:
        run.wait(timeout=0.5, poll=0.1)
    assert isinstance(late.value, TimeoutError) and "still running" in str(late.value)
    stopped = run.stop()
    assert (stopped.state, stopped.left) == ("stopped", {})
    result = run.wait(timeout=30)
    assert (result.state, result.exit_code) == ("stopped", 143)


def test_a_failed_preflight_raises_with_the_node_and_the_fix(project: Path) -> None:
    with pytest.raises(PreflightError) as failed:
        cpuaccel.launch("hello.py", nodes=1, python="/nonexistent/python3")
    assert failed.value.exit_code == 69
    assert failed.value.problems[0].startswith("localhost: the interpreter '/nonexistent/python3'")
    assert not (project / "runs").exists() or not list((project / "runs").iterdir())


def test_a_script_that_is_not_there_raises_and_never_exits(project: Path) -> None:
    with pytest.raises(cpuaccel.errors.UsageError) as missing:
        cpuaccel.launch("nothere.py")
    assert missing.value.message == "nothere.py: no such script"


def test_a_call_from_python_never_takes_the_run_id_of_its_environment(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    given = "20260101-000000-abcdef"  # e.g. the calling process is a rank of that run
    monkeypatch.setenv("CPUACCEL_RUN_ID", given)
    run = cpuaccel.launch("hello.py", nodes=1, ppn=1)
    assert run.id != given and run.wait().ok
    assert os.environ["CPUACCEL_RUN_ID"] == given  # left as it was


KILLED = """\
import os, signal, time
if os.environ["RANK"] == "1":
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(60)
"""


def test_each_rank_s_code_and_signal_are_in_the_result(project: Path) -> None:
    (project / "killed.py").write_text(KILLED)
    run = cpuaccel.launch("killed.py", nodes=1, ppn=2)
    assert run.report is not None
    assert (run.report.exit_code, run.report.ranks) == (137, {0: 143, 1: 137})
    assert run.report.signals == {0: "SIGTERM", 1: "SIGKILL"}
    result = run.wait()
    assert (result.state, result.exit_code, result.ranks) == ("failed", 137, {0: 143, 1: 137})
    assert result.signals == {0: "SIGTERM", 1: "SIGKILL"}
