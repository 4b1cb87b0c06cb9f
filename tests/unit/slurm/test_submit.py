"""`cpuaccel submit` and the Slurm side of ps/logs/stop, without a Slurm: the checks of
every value, the batch script, and Slurm's answers parsed (stand-in client commands on
PATH that record their argv and answer what a test tells them). The real Slurm is in
tests/cluster/test_slurm_submit.py."""

from __future__ import annotations

import json
import os
import shlex
import stat
import time
from dataclasses import replace
from pathlib import Path

import pytest

from cpuaccel.config.project import parse_project
from cpuaccel.errors import EXIT_NODE_FAILED, EXIT_OK, EXIT_USAGE, ProjectFileError
from cpuaccel.history.rank_logs import _check_known
from cpuaccel.history.records import find_run, load, row, with_slurm
from cpuaccel.slurm import batch
from cpuaccel.slurm import queue as jobs
from cpuaccel.slurm.commands import SlurmError
from testsupport.command import cpuaccel, inherited_env

# A stand-in for each client command: its argv appended to $FAKE_LOG, its answer the
# file $FAKE_DIR/<command>.out (exit $FAKE_DIR/<command>.rc, default 0).
FAKE = """#!/bin/sh
name=$(basename "$0")
printf '%s' "$name" >> "$FAKE_LOG"; for a in "$@"; do printf ' [%s]' "$a" >> "$FAKE_LOG"; done
echo >> "$FAKE_LOG"
[ -f "$FAKE_DIR/$name.out" ] && cat "$FAKE_DIR/$name.out"
[ -f "$FAKE_DIR/$name.err" ] && cat "$FAKE_DIR/$name.err" >&2
exit $(cat "$FAKE_DIR/$name.rc" 2>/dev/null || echo 0)
"""


class FakeSlurm:
    def __init__(self, root: Path) -> None:
        self.bin = root / "bin"
        self.bin.mkdir()
        self.log = root / "slurm.log"
        self.log.touch()
        for name in ("sbatch", "squeue", "sacct", "scancel", "scontrol"):
            path = self.bin / name
            path.write_text(FAKE)
            path.chmod(path.stat().st_mode | stat.S_IXUSR)

    def answer(self, command: str, out: str, rc: int = 0, err: str = "") -> None:
        (self.bin / f"{command}.out").write_text(out)
        (self.bin / f"{command}.rc").write_text(str(rc))
        (self.bin / f"{command}.err").write_text(err)

    def calls(self) -> list[str]:
        return self.log.read_text().splitlines()

    def env(self) -> dict[str, str]:
        path = f"{self.bin}:{os.environ['PATH']}"
        return inherited_env(PATH=path, FAKE_LOG=str(self.log), FAKE_DIR=str(self.bin))


@pytest.fixture
def project(tmp_path: Path) -> Path:
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "train.py").write_text("print('hi')\n")
    return folder


@pytest.fixture
def slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeSlurm:
    fake = FakeSlurm(tmp_path)
    for key, value in fake.env().items():
        monkeypatch.setenv(key, value)
    return fake


# --- the checks of every value -------------------------------------------------------


@pytest.mark.parametrize(
    "text", ["30", "30:00", "2:00:00", "1-12", "1-12:30", "1-12:30:00", "UNLIMITED"]
)
def test_time_takes_slurms_forms(text: str) -> None:
    assert batch.check_time(text) == text


@pytest.mark.parametrize(
    "text", ["1:2:3:4", "", "2h", "1-", "-1", "1-2-3", "1:2:", "2:00:00\n#SBATCH --x", "1.5"]
)
def test_time_refuses_what_slurm_does_not_read(text: str) -> None:
    with pytest.raises(ValueError, match="time limit"):
        batch.check_time(text)


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("cpu\n#SBATCH --exclusive", "holds '\\\\n'"),
        ("-cpu", "begins with '-'"),
        ("two words", "holds ' '"),
        ("", "must be a name"),
    ],
)
def test_names_are_one_word(value: str, said: str) -> None:
    with pytest.raises(ValueError, match=said):
        batch.check_name(value, "partition")


@pytest.mark.parametrize(
    "arg",
    [
        "--output=x",
        "--out=x",
        "-o",
        "-ox",
        "--nodes=2",
        "-N2",
        "--ntasks-per-node=4",
        "--chdir=/tmp",
        "--job-name=x",
        "--partition=x",
        "--wait",
        "--wrap=hostname",
        # short options grouped in one word, as sbatch's getopt reads them
        "-HN9",
        "-vJevil",
        "-Qo/tmp/x",
        "-sHvW",
        "-vvn4",
        "-HD/tmp",
        "-Oe/tmp/e",
        "-Qpdebug",
    ],
)
def test_sbatch_arg_refuses_what_cpuaccel_sets(arg: str) -> None:
    with pytest.raises(ValueError, match="set by cpuaccel submit"):
        batch.check_sbatch_arg(arg)


@pytest.mark.parametrize(
    ("arg", "said"),
    [
        ("-HN9", "-HN9 sets -N (--nodes), an option set by cpuaccel submit: use submit --nodes"),
        ("-vJevil", "-vJevil sets -J (--job-name), an option set by cpuaccel submit: the job is"),
        ("-Qo/tmp/x", "-Qo/tmp/x sets -o (--output), an option set by cpuaccel submit: the batch"),
    ],
)
def test_a_group_of_short_options_names_the_owned_one_and_the_fix(arg: str, said: str) -> None:
    with pytest.raises(ValueError) as caught:
        batch.check_sbatch_arg(arg)
    assert str(caught.value).startswith(said), str(caught.value)


@pytest.mark.parametrize(
    "arg",
    # A letter that takes a value takes the rest of the word: -C's "intel" is no -n.
    ["--mem=8G", "--exclusive", "--constraint=skylake", "-c2", "-Cintel", "-vc2", "-HcN",
     "-kN9", "-Qs", "--constraint=-N"],
)  # fmt: skip
def test_sbatch_arg_takes_others(arg: str) -> None:
    assert batch.check_sbatch_arg(arg) == arg


@pytest.mark.parametrize(
    ("word", "options"),
    [("-HN9", ["-H", "-N"]), ("-vJevil", ["-v", "-J"]), ("-Cintel", ["-C"]), ("-Hv", ["-H", "-v"]),
     ("--nodes=2", []), ("-", [])],
)  # fmt: skip
def test_short_options_are_read_as_getopt_reads_them(word: str, options: list[str]) -> None:
    assert batch.short_options(word) == options


def test_a_hold_in_a_group_of_short_options_is_the_users_own() -> None:
    assert batch.holds(("--mem=1G", "-vH")) and batch.holds(("--hold",))
    assert not batch.holds(("-vC", "-CH"))  # -C's value "H" holds nothing


@pytest.mark.parametrize("arg", ["mem=8G", "--mem=8G\n#SBATCH --exclusive"])
def test_sbatch_arg_is_one_option_on_one_line(arg: str) -> None:
    with pytest.raises(ValueError):
        batch.check_sbatch_arg(arg)


def test_sbatch_quote_escapes_what_sbatch_reads_specially() -> None:
    # sbatch keeps blanks and '#' only inside quotes, and \\ and " escaped there.
    assert batch.sbatch_quote("/home/a b/#x\"y'$") == '"/home/a b/#x\\"y\'$"'
    assert batch.sbatch_quote("a\\b") == '"a\\\\b"'
    assert batch.sbatch_quote("--mem=8G") == "--mem=8G"
    with pytest.raises(ValueError):
        batch.sbatch_quote("a\nb")


# --- cpuaccel.yaml's slurm: block ------------------------------------------------------


def test_project_slurm_block_is_read_and_checked(tmp_path: Path) -> None:
    text = "ppn: 2\nslurm:\n  partition: cpu\n  time: '2:00:00'\n  sbatch_args: [--mem=8G]\n"
    config = parse_project(text, str(tmp_path / "cpuaccel.yaml"))
    assert config.get("slurm") == {
        "partition": "cpu",
        "time": "2:00:00",
        "sbatch_args": ["--mem=8G"],
    }


@pytest.mark.parametrize(
    ("text", "line", "said"),
    [
        ("slurm:\n  partition: cpu\n  time: '1:2:3:4'\n", 3, "not a Slurm time limit"),
        ("slurm:\n  time: 2:00:00\n", 2, "must be quoted"),  # YAML's base 60: 7200
        ("slurm:\n  sbatch_args: [--output=x]\n", 2, "set by cpuaccel submit"),
        ("slurm:\n  sbatch_args:\n    - --mem=1G\n    - -HN9\n", 2, "-HN9 sets -N (--nodes)"),
        ("slurm:\n  partiton: cpu\n", 2, "not a key of slurm"),
        ("slurm: cpu\n", 1, "must be a mapping"),
        ('slurm:\n  account: "-x"\n', 2, "begins with '-'"),
    ],
)
def test_project_slurm_block_errors_name_their_line(text: str, line: int, said: str) -> None:
    with pytest.raises(ProjectFileError) as caught:
        parse_project(text, "/p/cpuaccel.yaml")
    assert caught.value.line == line
    assert said in str(caught.value)


# --- the batch script ------------------------------------------------------------------


def _dry(project: Path, *args: str, env: dict[str, str] | None = None) -> str:
    done = cpuaccel("submit", "--dry-run", *args, cwd=project, env=env or inherited_env())
    assert done.returncode == EXIT_OK, done.stderr
    return done.stdout


def test_dry_run_prints_the_script_and_queues_nothing(project: Path, slurm: FakeSlurm) -> None:
    out = _dry(
        project, "-p", "cpu", "--time", "1-2", "--nodes", "3", "--ppn", "2",
        "--sbatch-arg=--mem=1G", "train.py", "--steps", "30", "a b", "$x",
    )  # fmt: skip
    assert "#SBATCH --nodes=3\n" in out and "#SBATCH --ntasks-per-node=2\n" in out
    assert "#SBATCH --partition=cpu\n" in out and "#SBATCH --time=1-2\n" in out
    assert "#SBATCH --mem=1G\n" in out
    assert f"#SBATCH --chdir={project.resolve()}\n" in out
    assert "export CPUACCEL_RUN_ID=" in out
    assert "run --nodes 3 --ppn 2 train.py --steps 30 'a b' '$x'" in out
    assert slurm.calls() == [] and not (project / "runs").exists()


def test_dry_run_takes_the_project_files_defaults(project: Path) -> None:
    (project / "cpuaccel.yaml").write_text(
        "slurm:\n  partition: big\n  account: ml\n  sbatch_args: [--exclusive]\n"
    )
    out = _dry(project, "--nodes", "1", "--sbatch-arg=--mem=2G", "train.py")
    assert "#SBATCH --partition=big\n#SBATCH --account=ml\n" in out
    assert "#SBATCH --exclusive\n#SBATCH --mem=2G\n" in out
    out = _dry(project, "-p", "small", "--nodes", "1", "train.py")  # the flag wins
    assert "#SBATCH --partition=small\n" in out and "big" not in out


def test_user_template_from_the_slurm_block(project: Path) -> None:
    own = project / "mine"
    own.mkdir()
    (own / "sbatch.sh.j2").write_text("#!/bin/sh\n# mine {{ run_id }}\n#SBATCH --qos=high\n")
    (project / "cpuaccel.yaml").write_text("slurm:\n  templates: mine\n")
    assert "#SBATCH --qos=high" in _dry(project, "--nodes", "1", "train.py")


def test_dry_run_json_is_one_object(project: Path) -> None:
    out = _dry(project, "--json", "--nodes", "2", "train.py")
    found = json.loads(out)
    assert found["dry_run"] is True and "#SBATCH --nodes=2" in found["script"]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["-p", "cpu\n#SBATCH --exclusive"], "-p"),
        (["--time", "1:2:3:4"], "--time '1:2:3:4'"),
        (["--sbatch-arg=--output=x"], "--sbatch-arg '--output=x'"),
        (["--account", "-x"], "--account"),
    ],
)
def test_bad_values_are_one_line_exit_64(
    project: Path, slurm: FakeSlurm, args: list[str], said: str
) -> None:
    done = cpuaccel("submit", *args, "--nodes", "1", "train.py", cwd=project, env=slurm.env())
    assert done.returncode == EXIT_USAGE, done.stderr
    assert said in done.stderr and "Traceback" not in done.stderr
    assert slurm.calls() == [] and not (project / "runs").exists()


def test_bad_project_file_names_its_line(project: Path, slurm: FakeSlurm) -> None:
    (project / "cpuaccel.yaml").write_text("ppn: 1\nslurm:\n  time: '1:2:3:4'\n")
    done = cpuaccel("submit", "--nodes", "1", "train.py", cwd=project, env=slurm.env())
    assert done.returncode == EXIT_USAGE
    assert "cpuaccel.yaml:3" in done.stderr and slurm.calls() == []


def test_a_project_folder_with_a_backslash_is_refused(tmp_path: Path, slurm: FakeSlurm) -> None:
    folder = tmp_path / "a\\b"
    folder.mkdir()
    (folder / "train.py").write_text("print('hi')\n")
    done = cpuaccel("submit", "--nodes", "1", "train.py", cwd=folder, env=slurm.env())
    assert done.returncode == EXIT_USAGE and "backslash" in done.stderr
    assert slurm.calls() == [] and not (folder / "runs").exists()


def test_missing_script_is_refused(project: Path, slurm: FakeSlurm) -> None:
    done = cpuaccel("submit", "--nodes", "1", "nope.py", cwd=project, env=slurm.env())
    assert done.returncode == EXIT_USAGE and "nope.py" in done.stderr


# --- sbatch's answers --------------------------------------------------------------------


def test_submit_queues_held_records_then_releases(project: Path, slurm: FakeSlurm) -> None:
    slurm.answer("sbatch", "4242\n")
    done = cpuaccel("submit", "--nodes", "2", "--json", "train.py", cwd=project, env=slurm.env())
    assert done.returncode == EXIT_OK, done.stderr
    found = json.loads(done.stdout)
    assert found["job_id"] == "4242"
    folder = project / "runs" / found["run_id"]
    record = json.loads((folder / "run.json").read_text())
    assert record["slurm"]["job_id"] == "4242" and record["world"] == 2
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    calls = slurm.calls()
    assert calls[0].startswith("sbatch [--parsable] [--hold]")
    assert calls[1] == "scontrol [release] [4242]"


def test_submit_prints_both_ids(project: Path, slurm: FakeSlurm) -> None:
    slurm.answer("sbatch", "77;cluster1\n")
    done = cpuaccel("submit", "--nodes", "1", "train.py", cwd=project, env=slurm.env())
    assert done.returncode == EXIT_OK, done.stderr
    assert done.stdout.startswith("Slurm job 77, run ")


def test_a_job_id_that_is_no_number_is_refused_and_nothing_kept(
    project: Path, slurm: FakeSlurm
) -> None:
    slurm.answer("sbatch", "Submitted batch job x; rm -rf /\n")
    done = cpuaccel("submit", "--nodes", "1", "train.py", cwd=project, env=slurm.env())
    assert done.returncode == EXIT_NODE_FAILED
    assert "not a job id" in done.stderr and "Traceback" not in done.stderr
    assert list((project / "runs").iterdir()) == []
    assert not any(c.startswith("scontrol") for c in slurm.calls())


def test_sbatch_failing_leaves_nothing(project: Path, slurm: FakeSlurm) -> None:
    slurm.answer("sbatch", "", rc=1, err="sbatch: error: invalid partition specified: nope\n")
    done = cpuaccel(
        "submit", "-p", "nope", "--nodes", "1", "train.py", cwd=project, env=slurm.env()
    )
    assert done.returncode == EXIT_NODE_FAILED
    assert "invalid partition specified: nope" in done.stderr
    assert list((project / "runs").iterdir()) == []


def test_sbatch_without_a_configuration_names_slurm_conf(project: Path, slurm: FakeSlurm) -> None:
    said = "sbatch: fatal: Could not establish a configuration source\n"
    slurm.answer("sbatch", "", rc=1, err=said)
    env = {k: v for k, v in slurm.env().items() if k != "SLURM_CONF"}
    done = cpuaccel("submit", "--nodes", "1", "train.py", cwd=project, env=env)
    assert done.returncode == EXIT_NODE_FAILED
    lines = done.stderr.strip().splitlines()
    assert lines == [
        "error: sbatch --parsable failed: sbatch: fatal: Could not establish a configuration "
        "source",
        "  fix: Slurm's client finds no configuration here (SLURM_CONF is not set): set "
        "SLURM_CONF to the cluster's slurm.conf, or run cpuaccel where Slurm's client is "
        "configured (a login node)",
    ]
    assert list((project / "runs").iterdir()) == []


def test_release_failing_cancels_the_held_job(project: Path, slurm: FakeSlurm) -> None:
    slurm.answer("sbatch", "9\n")
    slurm.answer("scontrol", "", rc=1, err="slurm_release error\n")
    done = cpuaccel("submit", "--nodes", "1", "train.py", cwd=project, env=slurm.env())
    assert done.returncode == EXIT_NODE_FAILED
    assert "scancel [9]" in slurm.calls()
    assert list((project / "runs").iterdir()) == []


# --- Slurm's states --------------------------------------------------------------------


def test_parse_squeue_sacct_scontrol() -> None:
    queue = jobs.parse_squeue("12|PENDING|Resources\n13|RUNNING|None\n14_2|RUNNING|None\n\n")
    assert queue["12"].run_state() == "queued" and queue["12"].describe() == "PENDING (Resources)"
    assert queue["13"].run_state() == "running" and "14_2" not in queue
    acct = jobs.parse_sacct("20|COMPLETED|0:0\n21|FAILED|3:0\n22|CANCELLED by 0|0:15\nx|y|z\n")
    assert (acct["20"].run_state(), acct["20"].exit_code) == ("succeeded", 0)
    assert (acct["21"].run_state(), acct["21"].exit_code) == ("failed", 3)
    assert (acct["22"].state, acct["22"].run_state(), acct["22"].exit_code) == (
        "CANCELLED",
        "stopped",
        143,
    )
    shown = jobs.parse_scontrol("JobId=30 JobName=x JobState=TIMEOUT Reason=TimeLimit ExitCode=0:1")
    assert shown is not None and shown.run_state() == "timeout"
    assert jobs.parse_scontrol("slurm_load_jobs error: Invalid job id") is None


def test_states_asks_squeue_then_sacct_then_scontrol() -> None:
    asked: list[list[str]] = []

    def run(argv: list[str]) -> str:
        asked.append(argv)
        if argv[0] == "squeue":
            return "1|RUNNING|None\n"
        if argv[0] == "sacct":
            raise SlurmError("sacct failed: Slurm accounting storage is disabled")
        return "JobId=2 JobState=COMPLETED ExitCode=0:0\n" if argv[3] == "2" else ""

    found = jobs.states(["1", "2", "3", "1; rm"], run)
    assert {k: v.state for k, v in found.items()} == {"1": "RUNNING", "2": "COMPLETED"}
    assert [a[0] for a in asked] == ["squeue", "sacct", "scontrol", "scontrol"]
    assert asked[1][-1] == "2,3"


def test_a_completing_job_is_not_ended_whatever_sacct_says() -> None:
    def run(argv: list[str]) -> str:
        if argv[0] == "squeue":
            return "7|COMPLETING|None\n"
        return "7|CANCELLED by 0|0:15\n"  # sacct's word while processes remain

    found = jobs.states(["7"], run)
    assert found["7"].state == "COMPLETING" and not found["7"].ended


def _submitted(project: Path, status: dict[str, object] | None = None) -> Path:
    folder = project / "runs" / "20261130-120000-abcdef"
    folder.mkdir(parents=True)
    record = {"run_id": folder.name, "hosts": [], "ppn": 1, "world": 3, "nodes": 3}
    record.update(script=["train.py"], detached=True, slurm={"job_id": "5", "partition": None})
    (folder / "run.json").write_text(json.dumps(record))
    if status is not None:
        (folder / "status.json").write_text(json.dumps(status))
    return folder


RUNNING = {"state": "running", "supervisor": {"host": "elsewhere", "pid": 1}}


@pytest.mark.parametrize(
    ("status", "slurm_state", "state", "code"),
    [
        (None, None, "submitted", None),
        (None, "PENDING", "queued", None),
        (None, "CANCELLED", "stopped", 143),
        (RUNNING, "RUNNING", "running", None),
        (RUNNING, "CANCELLED", "stopped", 143),
        ({"state": "failed", "exit_code": 3}, "FAILED", "failed", 3),
    ],
)  # fmt: skip
def test_a_submitted_runs_state(
    project: Path,
    status: dict[str, object] | None,
    slurm_state: str | None,
    state: str,
    code: int | None,
) -> None:
    run = load(_submitted(project, status))
    code_of = {"CANCELLED": "0:15", "FAILED": "3:0"}.get(slurm_state or "", "0:0")
    answer = f"5|{slurm_state}|{code_of}\n" if slurm_state else ""
    if slurm_state:
        run = with_slurm([run], lambda ids: jobs.parse_sacct(answer))[0]
    assert run.state() == state
    assert run.exit_code() == code
    found = row(run, 0.0)
    assert found["script"] == "train.py" and found["nodes"] == 3
    assert found["slurm"]["job_id"] == "5"


def test_ps_shows_the_slurm_column(project: Path, slurm: FakeSlurm) -> None:
    _submitted(project)
    slurm.answer("squeue", "5|PENDING|Priority\n")
    done = cpuaccel("ps", cwd=project, env=slurm.env())
    assert done.returncode == EXIT_OK, done.stderr
    assert "queued" in done.stdout and "5 PENDING (Priority)" in done.stdout
    done = cpuaccel("ps", "--json", cwd=project, env=slurm.env())
    assert json.loads(done.stdout)[0]["slurm"]["state"] == "PENDING"


def test_ps_without_slurm_warns_and_lists(project: Path, slurm: FakeSlurm) -> None:
    _submitted(project)
    slurm.answer(
        "squeue", "", rc=1, err="slurm_load_jobs error: Unable to contact slurm controller\n"
    )
    done = cpuaccel("ps", cwd=project, env=slurm.env())
    assert done.returncode == EXIT_OK
    assert "Unable to contact slurm controller" in done.stderr and "submitted" in done.stdout


def test_stop_of_an_ended_job_signals_nothing(project: Path, slurm: FakeSlurm) -> None:
    _submitted(project, {"state": "succeeded", "exit_code": 0})
    slurm.answer("sacct", "5|COMPLETED|0:0\n")
    done = cpuaccel("stop", "last", cwd=project, env=slurm.env())
    assert done.returncode == EXIT_OK, done.stderr
    assert "had already ended (succeeded; Slurm job 5 COMPLETED)" in done.stdout
    assert not any(c.startswith("scancel") for c in slurm.calls())


def test_stop_of_a_queued_job_cancels_and_verifies(project: Path, slurm: FakeSlurm) -> None:
    folder = _submitted(project)
    # The stand-in's squeue lists the job until scancel has run, sacct then says so.
    slurm.answer("squeue", "5|PENDING|Priority\n")
    (slurm.bin / "scancel").write_text(FAKE.replace("exit", f"rm -f {slurm.bin}/squeue.out\nexit"))
    slurm.answer("sacct", "5|CANCELLED by 0|0:0\n")
    done = cpuaccel("stop", "last", cwd=project, env=slurm.env())
    assert done.returncode == EXIT_OK, done.stderr
    assert "stopped (Slurm job 5 CANCELLED)" in done.stdout
    assert "scancel [5]" in slurm.calls()
    assert load(folder).status is None  # it never started: nothing of its own to mark


def test_stop_says_when_slurm_does_not_end_the_job(
    project: Path, slurm: FakeSlurm, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cpuaccel.jobs import teardown as stop

    folder = _submitted(project)
    slurm.answer("squeue", "5|COMPLETING|None\n")
    monkeypatch.setattr(stop, "SLURM_WAIT", 0.5)
    done = stop.stop_submitted(folder, json.loads((folder / "run.json").read_text()), "5")
    assert done.left == {"Slurm job 5": "COMPLETING"}


# --- run's own options, handed to the run inside the job ---------------------------------


def test_runs_options_reach_the_inner_run_as_single_words(project: Path, slurm: FakeSlurm) -> None:
    done = cpuaccel(
        "submit", "--nodes", "2", "--dry-run", "--max-restarts", "2",
        "--mixed-precision", "FP32", "--hang-timeout", "60", "--env", "A=x y $(touch M)",
        "--launcher-args", "-genv X 1", "train.py", "--lr", "0.1",
        cwd=project, env=slurm.env(),
    )  # fmt: skip
    assert done.returncode == EXIT_OK, done.stderr
    exec_line = next(line for line in done.stdout.splitlines() if line.startswith("exec "))
    words = shlex.split(exec_line)
    run_at = words.index("run")
    assert words[run_at + 1 :] == [
        "--nodes", "2", "--ppn", "1", "--mixed-precision=fp32", "--max-restarts=2",
        "--hang-timeout=60.0", "--launcher-args=-genv X 1", "--env=A=x y $(touch M)",
        "train.py", "--lr", "0.1",
    ]  # fmt: skip
    assert slurm.calls() == [] and not (project / "M").exists()


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--env", "HF_TOKEN=hunter2"], "a secret's value would be written"),
        (["--env", "X;touch /tmp/p;Y=1"], "KEY a variable name"),
        (["--env", "CPUACCEL_NOT_SET_ANYWHERE"], "is not set here"),
        (["--launcher-args", "'open"], "No closing quotation"),
        (["--max-restarts", "99999"], "--max-restarts"),
        (["--mixed-precision", "fp16"], "--mixed-precision"),
    ],
)
def test_a_bad_run_option_is_refused_before_anything_is_queued(
    project: Path, slurm: FakeSlurm, flags: list[str], said: str
) -> None:
    done = cpuaccel("submit", "--nodes", "1", *flags, "train.py", cwd=project, env=slurm.env())
    assert done.returncode == EXIT_USAGE and said in done.stderr, done.stderr
    assert "hunter2" not in done.stderr + done.stdout and "Traceback" not in done.stderr
    assert slurm.calls() == [] and not (project / "runs").exists()


def test_a_secret_passed_by_name_stays_out_of_the_batch_script(
    project: Path, slurm: FakeSlurm
) -> None:
    env = {**slurm.env(), "HF_TOKEN": "hunter2"}
    slurm.answer("sbatch", "5\n")
    done = cpuaccel("submit", "--nodes", "1", "--env", "HF_TOKEN", "train.py", cwd=project, env=env)
    assert done.returncode == EXIT_OK, done.stderr
    texts = [p.read_text() for p in (project / "runs").rglob("*") if p.is_file()]
    assert any("--env=HF_TOKEN" in t for t in texts)
    assert not any("hunter2" in t for t in texts) and "hunter2" not in "".join(slurm.calls())


def test_following_a_job_slurm_no_longer_lists_ends_with_a_line(
    project: Path, slurm: FakeSlurm
) -> None:
    slurm.answer("sbatch", "4242\n")
    done = cpuaccel("submit", "--nodes", "1", "train.py", cwd=project, env=slurm.env())
    assert done.returncode == EXIT_OK, done.stderr
    run = load(find_run("last", project / "runs"))
    now = time.monotonic()
    assert _check_known(run, now - 5) == now - 5  # not listed for 5 s: still waiting
    with pytest.raises(SlurmError, match="has not listed job 4242 for"):
        _check_known(run, now - 500)
    # Listed (queued) again: the clock starts over; a queued job is followed as long as
    # Slurm queues it.
    listed = replace(run, slurm=jobs.JobState("4242", "PENDING", reason="Priority"))
    assert _check_known(listed, now - 500) >= now
