"""RUN, as every verb that takes a run reads it: `last`, an id, a unique prefix or a
folder; `report` and `logs` default to `last`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cpuaccel.errors import EXIT_USAGE
from testsupport.command import cpuaccel

OLD = "20250101-120000-aaaaaa"
NEW = "20250102-120000-bbbbbb"


def _run(project: Path, run_id: str, loss: float) -> Path:
    folder = project / "runs" / run_id
    folder.mkdir(parents=True)
    record = {"run_id": run_id, "hosts": ["localhost"], "ppn": 1, "world": 1, "exit_code": 0}
    (folder / "run.json").write_text(json.dumps(record))
    lines = [{"step": s, "loss": loss, "samples_per_s": 10.0} for s in range(1, 4)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (folder / "rank-0.log").write_text(f"hello from {run_id}\n")
    return folder


@pytest.fixture
def project(tmp_path: Path) -> Path:
    _run(tmp_path, OLD, 1.0)
    _run(tmp_path, NEW, 2.0)
    return tmp_path


@pytest.mark.parametrize(
    ("words", "run_id"),
    [
        ((), NEW),
        (("last",), NEW),
        ((OLD,), OLD),
        (("20250101",), OLD),
        (("runs/" + OLD,), OLD),
        (("./runs/" + NEW + "/",), NEW),
    ],
)
def test_report_takes_last_an_id_a_prefix_or_a_folder(
    project: Path, words: tuple[str, ...], run_id: str
) -> None:
    proc = cpuaccel("report", *words, "--json", cwd=project, timeout=120)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert (project / summary["run_dir"]).resolve() == (project / "runs" / run_id).resolve()
    assert (project / "runs" / run_id / "report.png").exists()


@pytest.mark.parametrize(
    ("words", "run_id"),
    [((), NEW), (("last",), NEW), (("2025010",), None), (("runs/" + OLD,), OLD)],
)
def test_logs_takes_the_same_run_names(
    project: Path, words: tuple[str, ...], run_id: str | None
) -> None:
    proc = cpuaccel("logs", *words, cwd=project)
    if run_id is None:  # two runs begin so
        assert proc.returncode == EXIT_USAGE
        assert proc.stderr.splitlines() == [
            f"error: run '2025010' is ambiguous: {OLD}, {NEW}",
            "  fix: give more of the id, or the whole id",
        ]
        return
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"[rank 0 localhost] hello from {run_id}\n"


@pytest.mark.parametrize("verb", ["report", "logs", "fetch", "stop"])
def test_an_unknown_run_is_one_error_naming_the_choices(project: Path, verb: str) -> None:
    proc = cpuaccel(verb, "2024", cwd=project)
    assert proc.returncode == EXIT_USAGE, proc.stderr
    assert proc.stderr.splitlines() == [
        f"error: no run '2024' in {project / 'runs'}",
        f"  fix: give an id from cpuaccel ps, last (the newest: {NEW}), or a run folder",
    ]


@pytest.mark.parametrize("verb", ["report", "logs", "fetch", "stop"])
def test_a_missing_folder_is_named(project: Path, verb: str) -> None:
    proc = cpuaccel(verb, "runs/nope", cwd=project)
    assert proc.returncode == EXIT_USAGE, proc.stderr
    assert proc.stderr.splitlines() == [
        "error: runs/nope: no such run directory",
        "  fix: give a run folder, runs/<id>/, an id from cpuaccel ps, or last",
    ]


def test_fetch_of_a_run_folder_on_this_machine(project: Path) -> None:
    proc = cpuaccel("fetch", "runs/" + OLD, cwd=project)
    assert proc.returncode == 0, proc.stderr
    assert "ran on this machine" in proc.stderr


def test_report_without_runs_says_where_it_looked(tmp_path: Path) -> None:
    proc = cpuaccel("report", cwd=tmp_path)
    assert proc.returncode == EXIT_USAGE
    assert proc.stderr.splitlines()[0] == (
        f"error: no run 'last' in {tmp_path / 'runs'}: no runs recorded there"
    )
