"""Launch habits of python -m, torchrun, accelerate launch and DeepSpeed, without nodes:
``-m MODULE``, ``--no-python``, ``--launcher-args`` and ``--json``, typed as their users
type them, checked in ``--dry-run``'s command and in the worker run directly. Their runs
on real nodes: tests/cluster/test_run_options.py.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cpuaccel.cli.run import run_command, wants_json
from cpuaccel.errors import EXIT_USAGE
from cpuaccel.jobs.plan import Script, build_plan
from cpuaccel.jobs.result import JobReport
from cpuaccel.node.supervisor import Outcome
from cpuaccel.worker import EXIT_MARKER
from tests.unit.jobs.test_run import (
    EXAMPLE_INVENTORY,
    RUN_DIR,
    RUN_ID,
    facts,
    hosts,
    router,
    settings_for,
)
from testsupport.command import cpuaccel
from testsupport.command import output_section as section

TRAIN_MODULE = "import sys\nprint(__name__, sys.argv)\n"


def project(tmp_path: Path) -> Path:
    """A project with a package (pkg.train), a script and a shell program."""
    proj = tmp_path / "proj"
    (proj / "pkg").mkdir(parents=True)
    (proj / "pkg" / "__init__.py").write_text("")
    (proj / "pkg" / "train.py").write_text(TRAIN_MODULE)
    (proj / "train.py").write_text("print('hi')\n")
    (proj / "train.sh").write_text('#!/bin/sh\necho "$RANK/$WORLD_SIZE $*"\n')
    (proj / "train.sh").chmod(0o755)
    (proj / "notes.sh").write_text("#!/bin/sh\n")  # not executable
    return proj


def dry_command(proj: Path, *args: str) -> list[str]:
    """The mpirun argv `run --dry-run ARGS` shows (a shell line: split back into words)."""
    proc = cpuaccel("run", "-i", str(EXAMPLE_INVENTORY), "--ppn", "2", "--dry-run", *args, cwd=proj)
    assert proc.returncode == 0, proc.stderr
    return shlex.split(section(proc.stdout, "command")[0])


def refused(proj: Path, *args: str) -> str:
    """The one error line (and fix) of a refused run; nothing contacted, nothing written."""
    proc = cpuaccel("run", "-i", str(EXAMPLE_INVENTORY), "--dry-run", *args, cwd=proj)
    assert proc.returncode == EXIT_USAGE, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert lines[0].startswith("error: ") and len(lines) <= 2, proc.stderr
    assert not (proj / "runs").exists()
    return proc.stderr


def rank_words(command: list[str]) -> list[str]:
    """What follows rank.sh: the worker's words."""
    rank_sh = next(i for i, word in enumerate(command) if word.endswith("/rank.sh"))
    return command[rank_sh + 1 :]


# ---------------------------------------------------------------- -m and --no-python


def test_dash_m_runs_a_module_as_python_m_does(tmp_path: Path) -> None:
    proj = project(tmp_path)
    command = dry_command(proj, "-m", "pkg.train", "--lr", "0.1", "-m", "x")
    assert rank_words(command) == ["-m", "pkg.train", "--lr", "0.1", "-m", "x"]
    # torchrun's and accelerate launch's long spelling
    assert rank_words(dry_command(proj, "--module", "pkg.train")) == ["-m", "pkg.train"]


def test_no_python_runs_a_program_of_the_project_or_the_path(tmp_path: Path) -> None:
    proj = project(tmp_path)
    assert rank_words(dry_command(proj, "--no-python", "train.sh", "a b")) == [
        "--no-python", "./train.sh", "a b",
    ]  # fmt: skip
    assert rank_words(dry_command(proj, "--no-python", "./train.sh")) == [
        "--no-python", "./train.sh",
    ]  # fmt: skip
    # An absolute path outside the project is the nodes' own program.
    assert rank_words(dry_command(proj, "--no-python", "/usr/bin/env")) == [
        "--no-python", "/usr/bin/env",
    ]  # fmt: skip
    # A bare name that is not a file of the project: the nodes' PATH.
    assert rank_words(dry_command(proj, "--no-python", "hostname", "-f")) == [
        "--no-python", "hostname", "-f",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-m", "pkg/train.py"], "-m pkg/train.py: not a module name"),
        (["-m", "pkg.train;rm"], "not a module name"),
        (["-m", "--no-python", "pkg.train"], "-m and --no-python together"),
        (["--no-python", "./missing.sh"], "no such file in the project folder"),
        (["--no-python", "notes.sh"], "notes.sh is not executable"),
        (["--no-python", "../outside.sh"], "is outside the project folder"),
    ],
)
def test_bad_module_or_program_is_one_error(tmp_path: Path, args: list[str], message: str) -> None:
    proj = project(tmp_path)
    (tmp_path / "outside.sh").write_text("#!/bin/sh\n")
    (tmp_path / "outside.sh").chmod(0o755)
    assert message in refused(proj, *args)


def worker(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "SLURM_"))}
    return subprocess.run(
        [sys.executable, "-m", "cpuaccel.worker", *args],
        capture_output=True,
        text=True,
        env={**base, "CPUACCEL_LABEL_OUTPUT": "1", "PMI_RANK": "1", "PMI_SIZE": "2", **env},
        cwd=cwd,
        timeout=60,
    )


def test_worker_runs_a_module_as_main_with_python_m_argv(tmp_path: Path) -> None:
    proj = project(tmp_path)
    proc = worker(proj, "-m", "pkg.train", "--lr", "0.1")
    assert proc.returncode == 0, proc.stderr
    label = f"[rank 1 {socket.gethostname()}] "
    expected = ["__main__", [str(proj / "pkg" / "train.py"), "--lr", "0.1"]]
    assert proc.stdout == label + f"__main__ {expected[1]!r}\n"
    missing = worker(proj, "-m", "pkg.nope")
    assert missing.returncode == 1
    assert f"{label}{sys.executable}: No module named pkg.nope" in missing.stderr.splitlines()
    assert missing.stderr.splitlines()[-1] == f"{label}{EXIT_MARKER} 1"


def test_worker_no_python_execs_the_program_with_the_rank_env(tmp_path: Path) -> None:
    proj = project(tmp_path)
    (proj / "fail.sh").write_text('#!/bin/sh\necho "$LOCAL_RANK $MASTER_ADDR"\nexit 5\n')
    (proj / "fail.sh").chmod(0o755)
    label = f"[rank 1 {socket.gethostname()}] "
    ok = worker(proj, "--no-python", "./train.sh", "a b", "$x")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout == f"{label}1/2 a b $x\n"
    failed = worker(proj, "--no-python", "./fail.sh")
    assert failed.returncode == 5
    assert failed.stdout == f"{label}0 127.0.0.1\n"
    assert failed.stderr.splitlines() == [f"{label}{EXIT_MARKER} 5"]
    absent = worker(proj, "--no-python", "no-such-program-here")
    assert absent.returncode == 127
    assert "no-such-program-here" in absent.stderr
    # Under cpuaccel run, a rank reports success too (run --json's per-rank codes).
    reported = worker(proj, "--no-python", "./train.sh", CPUACCEL_RUN_ID="r1")
    assert reported.stderr.splitlines() == [f"{label}{EXIT_MARKER} 0"]


# ---------------------------------------------------------------- --launcher-args


def test_launcher_args_are_words_before_the_program(tmp_path: Path) -> None:
    proj = project(tmp_path)
    text = "-genv I_MPI_DEBUG 5 -l -genv NOTE 'two words'"
    command = dry_command(proj, "--launcher-args", text, "train.py", "--lr", "1")
    start = command.index("-genv")
    assert command[start : start + 8] == [
        "-genv", "I_MPI_DEBUG", "5", "-l", "-genv", "NOTE", "two words", "/bin/sh",
    ]  # fmt: skip
    assert command[command.index("-ppn") + 1] == "2"  # cpuaccel's own options first
    assert command[-3:] == ["train.py", "--lr", "1"]


def test_launcher_args_from_the_project_file(tmp_path: Path) -> None:
    proj = project(tmp_path)
    (proj / "cpuaccel.yaml").write_text("ppn: 1\nlauncher_args: -genv I_MPI_DEBUG 5\n")
    assert dry_command(proj, "train.py")[-6:-3] == ["-genv", "I_MPI_DEBUG", "5"]
    # The flag wins over the file, as every flag does.
    assert "I_MPI_DEBUG" not in dry_command(proj, "--launcher-args", "-l", "train.py")
    (proj / "cpuaccel.yaml").write_text("ppn: 1\nlauncher_args: -ppn 4\n")
    message = refused(proj, "train.py")
    assert "cpuaccel.yaml:2" in message and "'-ppn' is set by cpuaccel: use --ppn" in message


def test_launcher_args_reach_open_mpi_before_the_program() -> None:
    chosen = hosts(2)
    settings = settings_for(chosen, ppn=2, launcher="openmpi", launcher_args=("--tag-output",))
    found = {h.name: facts(["openmpi"]) for h in chosen}
    command = build_plan(settings, Script("t.py"), found, RUN_ID).command()
    assert command[command.index("--tag-output") + 1 :] == ["/bin/sh", f"{RUN_DIR}/rank.sh", "t.py"]


@pytest.mark.parametrize(
    ("text", "flag"),
    [
        ("-np 8", "--nodes and --ppn"),
        ("-n 8", "--nodes and --ppn"),
        ("-ppn 4", "--ppn"),
        ("--map-by ppr:2:node", "--ppn"),
        ("-f hosts.txt", "-i INVENTORY"),
        ("-hostfile hosts.txt", "-i INVENTORY"),
        ("--hostfile=hosts.txt", "-i INVENTORY"),
        ("-machinefile m", "-i INVENTORY"),
    ],
)
def test_launcher_args_may_not_replace_what_cpuaccel_owns(
    tmp_path: Path, text: str, flag: str
) -> None:
    message = refused(project(tmp_path), "--launcher-args", text, "train.py")
    assert "--launcher-args" in message and f"use {flag}" in message


def test_launcher_args_that_a_shell_could_not_split(tmp_path: Path) -> None:
    message = refused(project(tmp_path), "--launcher-args", "-genv X 'open", "train.py")
    assert "--launcher-args" in message and "No closing quotation" in message


# ---------------------------------------------------------------- --json


def test_json_dry_run_is_one_object(tmp_path: Path) -> None:
    proj = project(tmp_path)
    proc = cpuaccel(
        "run", "-i", str(EXAMPLE_INVENTORY), "--nodes", "2", "--ppn", "2", "--dry-run",
        "--json", "-m", "pkg.train", cwd=proj,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["ended_by"] == "dry-run" and data["world"] == 4 and data["ppn"] == 2
    assert data["hosts"] == ["node0", "node1"]  # inventory.example.yaml's first two
    assert data["command"][-2:] == ["-m", "pkg.train"]


def test_json_on_bad_input_is_one_object_with_the_error(tmp_path: Path) -> None:
    proj = project(tmp_path)
    proc = cpuaccel("run", "-i", str(EXAMPLE_INVENTORY), "--json", "missing.py", cwd=proj)
    assert proc.returncode == EXIT_USAGE
    data = json.loads(proc.stdout)  # the whole of stdout: one object
    assert data["exit_code"] == EXIT_USAGE and data["ended_by"] == "error"
    assert data["error"] == "missing.py: no such script" and data["fix"]
    assert proc.stderr.startswith("error: missing.py: no such script")


@pytest.mark.parametrize(
    ("args", "wanted"),
    [
        (["--json", "--ppn", "0", "t.py"], True),
        (["-i", "inv.yaml", "--ppn", "2", "--json", "t.py"], True),
        (["--env", "--json", "t.py"], False),  # the value of --env
        (["t.py", "--json"], False),  # the script's own flag
        (["--ppn", "2", "--", "--json"], False),
    ],
)
def test_json_is_run_own_option_only_before_script(args: list[str], wanted: bool) -> None:
    assert wants_json(run_command, args) is wanted


def test_json_on_a_bad_flag_is_one_object_too(tmp_path: Path) -> None:
    proj = project(tmp_path)
    proc = cpuaccel("run", "-i", str(EXAMPLE_INVENTORY), "--json", "--ppn", "0", "t.py", cwd=proj)
    assert proc.returncode == EXIT_USAGE
    data = json.loads(proc.stdout)
    assert data["exit_code"] == EXIT_USAGE and data["ended_by"] == "error"
    assert "--ppn" in data["error"] and data["fix"] == "see 'cpuaccel run --help'"
    assert proc.stderr.startswith("error: Invalid value for '--ppn'")
    # After SCRIPT, --json is the script's: stdout stays empty.
    after = cpuaccel("run", "-i", str(EXAMPLE_INVENTORY), "--ppn", "0", "t.py", "--json", cwd=proj)
    assert after.returncode == EXIT_USAGE and after.stdout == ""


def test_router_keeps_each_ranks_code_and_the_report_reads_them(tmp_path: Path) -> None:

    r, term, run_dir = router(tmp_path)
    r.feed("out", "[rank 0 node1] done")
    r.feed("err", f"[rank 0 node1] {EXIT_MARKER} 0")  # success: kept, not a failure
    r.feed("err", f"[rank 1 node1] {EXIT_MARKER} 2")
    r.quiet = True  # cpuaccel ends the others: their codes are kept too
    r.feed("err", f"[rank 2 node2] {EXIT_MARKER} 143")
    r.close()
    assert r.codes == {0: 0, 1: 2, 2: 143}
    assert [(f.rank, f.code) for f in r.failures] == [(1, 2)]
    assert (run_dir.path / "rank-0.log").read_text() == "done\n"  # no marker of success
    assert term.err.getvalue() == ""
    chosen = hosts(2)
    plan = build_plan(settings_for(chosen, ppn=2), Script("t.py"), None, RUN_ID)
    report = JobReport.of_plan(plan, 2, "failed", 3.0)
    report.add_outcome(Outcome(2, "failed", 2.5, 2, None, codes=r.codes), str(run_dir.path))
    assert report.to_json()["ranks"] == {"0": 0, "1": 2, "2": 143, "3": None}
    clean = JobReport.of_plan(plan, 0, "completed", 3.0)
    clean.add_outcome(Outcome(0, "completed", 2.5, 0, None), str(run_dir.path))
    assert clean.to_json()["ranks"] == {"0": 0, "1": 0, "2": 0, "3": 0}  # mpirun said so
