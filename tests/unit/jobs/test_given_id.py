"""CPUACCEL_RUN_ID: `cpuaccel run` keeps a run id given from outside (cpuaccel submit's
batch script), checked first; the controller itself never carries the sweep's marker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cpuaccel.errors import EXIT_OK, EXIT_USAGE
from cpuaccel.jobs import given_id
from testsupport.command import clean_env, cpuaccel

RUN_ID = "20261130-211500-a1b2c3"


def project(tmp_path: Path, script: str = "print('hello')\n") -> Path:
    folder = tmp_path / "proj"
    folder.mkdir()
    (folder / "train.py").write_text(script)
    return folder


def test_a_given_id_names_the_run_of_a_dry_run(tmp_path: Path) -> None:
    proj = project(tmp_path)
    args = ("run", "--nodes", "1", "--ppn", "1", "--dry-run", "train.py")
    proc = cpuaccel(*args, cwd=proj, env=clean_env(CPUACCEL_RUN_ID=RUN_ID))
    assert proc.returncode == EXIT_OK, proc.stderr
    assert f"# run {RUN_ID} " in proc.stdout
    assert f"CPUACCEL_RUN_ID={RUN_ID}" in proc.stdout  # the ranks' env.sh


@pytest.mark.parametrize(
    "value",
    ["", "last", "../../etc", "20261130-211500-A1B2C3", "20261130-211500-a1b2c3\nx", "x" * 500],
)
def test_a_bad_given_id_is_refused_naming_the_variable(tmp_path: Path, value: str) -> None:
    proj = project(tmp_path)
    args = ("run", "--nodes", "1", "--ppn", "1", "train.py")
    proc = cpuaccel(*args, cwd=proj, env=clean_env(CPUACCEL_RUN_ID=value))
    assert proc.returncode == EXIT_USAGE, proc.stderr
    assert "$CPUACCEL_RUN_ID" in proc.stderr and "not a run id" in proc.stderr
    assert "fix:" in proc.stderr and "Traceback" not in proc.stderr
    assert not (proj / "runs").exists()  # nothing started, nothing written


def test_an_id_that_already_ran_is_refused(tmp_path: Path) -> None:
    proj = project(tmp_path)
    (proj / "runs" / RUN_ID).mkdir(parents=True)
    (proj / "runs" / RUN_ID / "status.json").write_text('{"state": "succeeded"}\n')
    args = ("run", "--nodes", "1", "--ppn", "1", "train.py")
    proc = cpuaccel(*args, cwd=proj, env=clean_env(CPUACCEL_RUN_ID=RUN_ID))
    assert proc.returncode == EXIT_USAGE, proc.stderr
    assert "already started" in proc.stderr
    assert json.loads((proj / "runs" / RUN_ID / "status.json").read_text())["state"] == "succeeded"


def test_a_link_in_place_of_the_runs_folder_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "runs"
    folder.mkdir()
    (folder / RUN_ID).symlink_to(tmp_path)
    with pytest.MonkeyPatch.context() as env:
        env.setenv(given_id.ENV_VAR, RUN_ID)
        with pytest.raises(given_id.UsageError, match="not a folder"):
            given_id.given(folder)


def test_other_verbs_and_unset_variables_are_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(given_id.ENV_VAR, "not an id")
    given_id.hand_over(["cpuaccel", "check"])  # returns: check ignores it
    monkeypatch.delenv(given_id.ENV_VAR)
    given_id.hand_over(["cpuaccel", "run", "x.py"])  # returns: nothing given
    assert given_id.given(Path("/nonexistent")) is None


def test_a_local_run_keeps_the_given_id_and_its_folder(tmp_path: Path) -> None:
    """A real run: the folder `submit` made is used (its file kept), and the run ends
    cleanly, which it could not if the controller carried CPUACCEL_RUN_ID=<id>: the
    final sweep of this machine would end the controller itself (exit 143)."""
    script = "import os\nprint('id', os.environ['CPUACCEL_RUN_ID'])\n"
    proj = project(tmp_path, script)
    folder = proj / "runs" / RUN_ID
    folder.mkdir(parents=True)
    (folder / "sbatch.sh").write_text("#!/bin/sh\n")
    args = ("run", "--nodes", "1", "--ppn", "1", "train.py")
    proc = cpuaccel(*args, cwd=proj, env=clean_env(CPUACCEL_RUN_ID=RUN_ID), timeout=180)
    assert proc.returncode == EXIT_OK, proc.stderr
    assert f"id {RUN_ID}" in proc.stdout
    assert (folder / "sbatch.sh").read_text() == "#!/bin/sh\n"
    status = json.loads((folder / "status.json").read_text())
    assert status["run_id"] == RUN_ID and status["state"] == "succeeded"
    assert sorted(p.name for p in (proj / "runs").iterdir()) == [RUN_ID]


def test_the_hand_over_does_not_import_from_the_project_folder(tmp_path: Path) -> None:
    """The fresh start runs as the console script does: a project module named like a
    library (click.py here) is not imported in place of it."""
    proj = project(tmp_path)
    (proj / "click.py").write_text("raise SystemExit('the project shadowed click')\n")
    args = ("run", "--nodes", "1", "--ppn", "1", "--dry-run", "train.py")
    prelude = "import sys\ndel sys.path[0]  # as the console script: no '' on sys.path"
    proc = cpuaccel(*args, cwd=proj, env=clean_env(CPUACCEL_RUN_ID=RUN_ID), prelude=prelude)
    assert proc.returncode == EXIT_OK, proc.stderr
    assert f"# run {RUN_ID} " in proc.stdout and "shadowed" not in proc.stderr
