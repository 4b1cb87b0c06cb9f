"""``cpuaccel.notebook.launch`` on the controller: the preflight's version check, how a
job's end becomes a value or an exception, where the ranks' lines go, and whole jobs
on this machine (the default inventory: this machine alone)."""

from __future__ import annotations

import importlib.metadata
import io
import os
import sys
from pathlib import Path

import pytest

import cpuaccel
import cpuaccel.notebook as notebook
from cpuaccel.errors import PreflightError, UsageError
from cpuaccel.jobs.result import PREFLIGHT, JobReport
from cpuaccel.node import facts as probe
from cpuaccel.notebook import launching, payload
from cpuaccel.notebook.launching import CellOutput, Outcome, finish, version_problems

TREE = str(Path(cpuaccel.__file__).resolve().parent.parent)
ENV = {"PYTHONPATH": TREE}  # the ranks import cpuaccel from the tree under test


def facts(python: str, cloudpickle: str | None) -> dict[str, object]:
    return {"python": {"version": python}, "packages": {"cloudpickle": cloudpickle}}


# ---------------------------------------------------------------- the version check


def test_nodes_with_the_kernels_versions_pass() -> None:
    found = {"node1": facts("3.11.9", "3.1.3"), "node2": facts("3.11.2", "3.1.3")}
    assert version_problems(found, "3.11", "3.1.3") == []


def test_a_node_with_another_python_or_cloudpickle_is_one_error_naming_both() -> None:
    found = {
        "node1": facts("3.11.9", "3.1.3"),
        "node2": facts("3.10.12", "3.1.3"),
        "node3": facts("3.11.4", None),
    }
    problems = version_problems(found, "3.11", "3.1.3")
    assert [(p.severity, p.host) for p in problems] == [("error", "node2"), ("error", "node3")]
    two, three = problems
    assert "Python 3.10 with cloudpickle 3.1.3" in two.message
    assert "this notebook runs Python 3.11 with cloudpickle 3.1.3" in two.message
    assert "cloudpickle (not installed)" in three.message
    assert "cloudpickle==3.1.3" in (three.hint or "")


def test_the_fact_probe_reports_cloudpickle_without_importing_it() -> None:
    versions = probe.package_versions()
    assert versions["cloudpickle"] == importlib.metadata.version("cloudpickle")
    assert launching.kernel_versions() == (
        f"{sys.version_info[0]}.{sys.version_info[1]}",
        importlib.metadata.version("cloudpickle"),
    )


# ---------------------------------------------------------------- the job's end


def report(code: int, ended_by: str, world: int = 2, **ranks: int | None) -> JobReport:
    done = JobReport(code, ended_by, 1.0, "r1", "/p/runs/r1", ["n1", "n2"], 1, world)
    done.ranks = {int(k[1:]): v for k, v in ranks.items()}
    return done


KEY = "ab" * payload.KEY_BYTES


def test_values_come_back_rank_zeros_or_all() -> None:
    values = {r: payload.seal(KEY, r, payload.value_bytes(v)) for r, v in enumerate("ab")}
    outcome = Outcome(key=KEY, values=values)
    assert finish(report(0, "completed"), outcome, gather=False) == "a"
    assert finish(report(0, "completed"), outcome, gather=True) == ["a", "b"]


def test_the_first_traceback_written_is_raised_with_its_rank_and_node() -> None:
    outcome = Outcome(
        errors={0: ("n1", "T0\n", 20.0), 1: ("n2", "Traceback\nValueError: x\n", 10.0)}
    )
    with pytest.raises(notebook.RankError) as raised:
        finish(report(1, "failed", r0=143, r1=1), outcome, gather=False)
    error = raised.value
    assert (error.rank, error.host, error.exit_code, error.run_id) == (1, "n2", 1, "r1")
    assert str(error).startswith("the function raised on rank 1 on n2 (run r1):")
    assert str(error).endswith("Traceback\nValueError: x")
    assert isinstance(error, notebook.JobError)


def test_a_job_that_ended_without_a_value_says_how() -> None:
    with pytest.raises(notebook.JobError) as raised:
        finish(report(137, "failed", r0=0, r1=137), Outcome(), gather=True)
    text = str(raised.value)
    assert "ended (failed, exit code 137)" in text and "rank 1: 137" in text
    assert "no value from rank(s) 0-1" in text and "/p/runs/r1" in text
    assert not isinstance(raised.value, notebook.RankError)


def test_preflight_and_interrupt_are_raised_as_such() -> None:
    failed = report(69, PREFLIGHT)
    failed.error, failed.problems = "1 problem(s)", ["n2: Python 3.10 ..."]
    with pytest.raises(PreflightError, match=r"n2: Python 3\.10"):
        finish(failed, Outcome(), gather=False)
    with pytest.raises(KeyboardInterrupt):
        finish(report(130, "interrupted"), Outcome(errors={1: ("n2", "x", 1.0)}), gather=False)


# ---------------------------------------------------------------- the cell's lines


def test_rank_zeros_output_and_every_ranks_errors_reach_the_cell() -> None:
    out, err = io.StringIO(), io.StringIO()
    sink = CellOutput(out, err)
    sink("out", 0, "n1", "step 1")
    sink("out", 1, "n2", "a line of rank 1")
    sink("err", 0, "n1", "a warning")
    sink("err", 1, "n2", "ValueError: x")
    sink("err", None, "n1", "mpirun says")
    sink.group([0, 1, 2, 3], ["n1", "n2"], ["Traceback", "KeyError: k"])
    assert out.getvalue() == "step 1\n"
    assert err.getvalue().splitlines() == [
        "a warning",
        "[rank 1 n2] ValueError: x",
        "[mpirun] mpirun says",
        "[ranks 0-3 n1,n2] Traceback",
        "[ranks 0-3 n1,n2] KeyError: k",
    ]


def test_a_ranks_escapes_reach_the_cell_shown_not_obeyed() -> None:
    out, err = io.StringIO(), io.StringIO()
    sink = CellOutput(out, err)
    sink("out", 0, "n1", "loss 1\x1b]52;c;SGVsbG8=\x07\r\x1b[1A")
    sink("err", 1, "n\x1b[2J2", "\x9b2Jboom")
    assert out.getvalue() == "loss 1\\x1b]52;c;SGVsbG8=\\x07\\x0d\\x1b[1A\n"
    assert err.getvalue() == "[rank 1 n\\x1b[2J2] \\x9b2Jboom\n"


def test_settings_that_would_run_something_else_are_refused() -> None:
    with pytest.raises(UsageError, match="module"):
        notebook.launch(len, module=True)
    with pytest.raises(UsageError, match="not a function"):
        notebook.launch(42)  # type: ignore[arg-type]


# ---------------------------------------------------------------- jobs on this machine


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project folder of this machine, with mpirun beside this Python on PATH."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CPUACCEL_INVENTORY", raising=False)
    bin_dir = os.path.dirname(sys.executable)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / ".cache"))
    return tmp_path


def where(scale: int) -> tuple[int, int, int]:
    import os

    print(f"rank {os.environ['RANK']} here", flush=True)
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), scale * 2


def fails_on_one() -> None:
    import os

    if os.environ["RANK"] == "1":
        raise ValueError("rank one fails")


def test_a_function_runs_on_every_rank_of_this_machine(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert notebook.launch(where, 21, nodes=1, ppn=2, env=ENV) == (0, 2, 42)
    out = capsys.readouterr()
    assert out.out == "rank 0 here\n"  # rank 0's line alone, and nothing of cpuaccel's
    assert out.err == ""
    values = notebook.launch(where, 5, ppn=2, gather=True, env=ENV)  # nodes=1: this machine
    assert values == [(0, 2, 10), (1, 2, 10)]
    assert len(list((here / "runs").iterdir())) == 2


def test_a_rank_that_raises_raises_here_with_its_traceback(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(notebook.RankError) as raised:
        notebook.launch(fails_on_one, nodes=1, ppn=2, env=ENV)
    error = raised.value
    assert (error.rank, error.host, error.exit_code) == (1, "localhost", 1)
    assert "rank 1 on localhost" in str(error)
    assert error.remote_traceback.splitlines()[-1] == "ValueError: rank one fails"
    assert ", in fails_on_one" in error.remote_traceback
    assert "[rank 1 localhost] ValueError: rank one fails" in capsys.readouterr().err


def test_a_node_with_other_versions_fails_the_preflight(
    here: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(launching, "kernel_versions", lambda: ("3.99", "0.0.1"))
    with pytest.raises(PreflightError) as raised:
        notebook.launch(where, 1, nodes=1, env=ENV)
    text = str(raised.value)
    mine = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert f"localhost: Python {mine} with cloudpickle " in text
    assert "this notebook runs Python 3.99 with cloudpickle 0.0.1" in text
    assert not (here / "runs").exists() or not any((here / "runs").iterdir())


# ---------------------------------------------------------------- the traceback's source


class Checker:
    def check(self, value: int) -> None:
        raise ValueError(f"bad {value}")  # the method's line


def calls_a_checker(value: int) -> None:
    Checker().check(value)  # the function's line


def test_frames_pickled_by_value_get_their_source_lines_back() -> None:
    import inspect

    first = inspect.getsourcelines(calls_a_checker)[1] + 1
    method = inspect.getsourcelines(Checker.check)[1] + 1
    remote = (
        "Traceback (most recent call last):\n"
        f'  File "<dynamic-code>", line {first}, in calls_a_checker\n'
        f'  File "<dynamic-code>", line {method}, in check\n'
        '  File "/usr/lib/python3/x.py", line 3, in elsewhere\n'
        "    kept as it is\n"
        "ValueError: bad 3\n"
    )
    shown = launching.with_source(remote, calls_a_checker).splitlines()
    assert shown == [
        "Traceback (most recent call last):",
        f'  File "<dynamic-code>", line {first}, in calls_a_checker',
        "    Checker().check(value)  # the function's line",
        f'  File "<dynamic-code>", line {method}, in check',
        '    raise ValueError(f"bad {value}")  # the method\'s line',
        '  File "/usr/lib/python3/x.py", line 3, in elsewhere',
        "    kept as it is",
        "ValueError: bad 3",
    ]
    unknown = '  File "<dynamic-code>", line 1, in nowhere\nValueError: x\n'
    assert launching.with_source(unknown, calls_a_checker) == unknown
