"""`cpuaccel run` without nodes: --dry-run, the launchers' command shapes, the rendered
files, the worker's environment and exit reports, the output router, and the CLI's
answers to bad input."""

from __future__ import annotations

import io
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from rich.console import Console

from cpuaccel import _labels
from cpuaccel.cli.main import cli
from cpuaccel.config.effective import resolve
from cpuaccel.config.settings import LaunchSettings
from cpuaccel.connectors.connect_options import ConnectOptions
from cpuaccel.errors import EXIT_USAGE, UsageError
from cpuaccel.inventory.host import Host
from cpuaccel.inventory.inventory import Inventory
from cpuaccel.jobs import launchers
from cpuaccel.jobs.foreground import terminal
from cpuaccel.jobs.plan import RunPlan, Script, build_plan
from cpuaccel.jobs.rundir import PRIVATE, RunDir, render_job_files
from cpuaccel.node import supervisor
from cpuaccel.node.progress import CAUSE_LIMIT, CAUSE_MARKER
from cpuaccel.node.supervisor import (
    EXIT_INTERRUPTED,
    EXIT_LOST,
    EXIT_TIMEOUT,
    Outcome,
    Output,
    cause,
    srun_task_exits,
)
from cpuaccel.worker import EXIT_MARKER, derive_env
from testsupport.command import cpuaccel
from testsupport.command import output_section as section

REPO = Path(__file__).resolve().parents[3]
EXAMPLE_INVENTORY = REPO / "inventory.example.yaml"
RUN_ID = "20260101-000000-abcdef"
PYTHON = "/opt/venv/bin/python"
WORKDIR = "/srv/work"
RUN_DIR = f"{WORKDIR}/runs/{RUN_ID}"
# Running anything against the example inventory's 192.0.2.x hosts would wait for the
# connect timeout (10 s): finishing well inside it shows no node was contacted.
NO_CONTACT_SECONDS = 8.0


def timed_cpuaccel(*args: str, cwd: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    proc = cpuaccel(*args, cwd=cwd)
    return proc, time.monotonic() - started


def project(tmp_path: Path, name: str = "proj") -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "train.py").write_text("print('hello')\n")
    return folder


# ---------------------------------------------------------------- --dry-run


def test_dry_run_prints_hostfile_env_and_command_quickly(tmp_path: Path) -> None:
    proj = project(tmp_path)
    proc, elapsed = timed_cpuaccel(
        "run", "-i", str(EXAMPLE_INVENTORY), "--nodes", "4", "--ppn", "4", "--dry-run",
        "train.py", "--epochs", "3", "a b", "$(touch x)", "--nodes", "9",
        cwd=proj,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert elapsed < NO_CONTACT_SECONDS
    assert "Traceback" not in proc.stderr
    out = proc.stdout
    assert "no node was contacted" in out.splitlines()[0]
    run_id = out.splitlines()[0].split()[2]
    assert section(out, "hostfile") == ["node0", "node1", "node2", "node3"]
    env = section(out, "env.sh")
    assert f"export CPUACCEL_RUN_ID={run_id}" in env
    assert "export MASTER_ADDR=node0" in env
    assert "export MASTER_PORT=29500" in env
    assert f"export CPUACCEL_RUN_DIR=/opt/cpuaccel/work/runs/{run_id}" in env
    command = section(out, "command")
    assert len(command) == 1
    argv = shlex.split(command[0])
    run_dir = f"/opt/cpuaccel/work/runs/{run_id}"
    assert argv == [
        "/opt/cpuaccel/venv/bin/mpirun",
        "-f", f"{run_dir}/hostfile",
        "-n", "16",
        "-ppn", "4",
        "/bin/sh", f"{run_dir}/rank.sh",
        # Everything after SCRIPT is the script's, options of `cpuaccel run` included.
        "train.py", "--epochs", "3", "a b", "$(touch x)", "--nodes", "9",
    ]  # fmt: skip
    assert "on node0" in next(line for line in out.splitlines() if line.startswith("## command"))
    # A dry run writes nothing.
    assert not (proj / "runs").exists()


def test_the_reproducibility_settings_reach_every_rank_only_when_given(tmp_path: Path) -> None:
    proj = project(tmp_path)
    (proj / "cpuaccel.yaml").write_text("grad_reduce: library\n")
    common = ("run", "-i", str(EXAMPLE_INVENTORY), "--ppn", "1", "--dry-run")
    given = cpuaccel(*common, "train.py", cwd=proj)
    assert given.returncode == 0, given.stderr
    assert "export CPUACCEL_GRAD_REDUCE=library" in section(given.stdout, "env.sh")
    assert not any("DETERMINISTIC" in line for line in section(given.stdout, "env.sh"))
    (proj / "cpuaccel.yaml").unlink()
    fixed = cpuaccel(*common, "--deterministic", "train.py", cwd=proj)
    env = section(fixed.stdout, "env.sh")
    assert "export CPUACCEL_DETERMINISTIC=1" in env, fixed.stderr
    assert not any("GRAD_REDUCE" in line for line in env)  # the runtime's default: ordered


def test_the_weights_setting_reaches_every_rank_only_when_given(tmp_path: Path) -> None:
    proj = project(tmp_path)
    common = ("run", "-i", str(EXAMPLE_INVENTORY), "--ppn", "1", "--dry-run")
    plain = cpuaccel(*common, "train.py", cwd=proj)
    assert not any("CPUACCEL_WEIGHTS" in line for line in section(plain.stdout, "env.sh"))
    (proj / "cpuaccel.yaml").write_text("weights: bf16\n")
    given = cpuaccel(*common, "train.py", cwd=proj)
    assert given.returncode == 0, given.stderr
    assert "export CPUACCEL_WEIGHTS=bf16" in section(given.stdout, "env.sh")
    (proj / "cpuaccel.yaml").write_text("weights: bf17\n")
    wrong = cpuaccel(*common, "train.py", cwd=proj)
    assert wrong.returncode == 64 and "Traceback" not in wrong.stderr
    assert "cpuaccel.yaml:1" in wrong.stderr and "fp32" in wrong.stderr, wrong.stderr


def test_dry_run_without_ppn_shows_placeholders(tmp_path: Path) -> None:
    proc, elapsed = timed_cpuaccel(
        "run", "-i", str(EXAMPLE_INVENTORY), "--nodes", "2", "--dry-run", "train.py",
        cwd=project(tmp_path),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert elapsed < NO_CONTACT_SECONDS
    assert "ppn and threads come from the nodes' facts" in proc.stdout
    argv = shlex.split(section(proc.stdout, "command")[0])
    assert argv[argv.index("-n") + 1] == "<2 x ppn>"
    assert argv[argv.index("-ppn") + 1].startswith("<ppn")
    assert section(proc.stdout, "hostfile") == ["node0", "node1"]


def test_dry_run_opens_no_connection_and_starts_no_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In-process, with every way out of this process made to fail loudly."""
    opened: list[str] = []

    def refuse(*args: Any, **kwargs: Any) -> Any:
        opened.append(repr(args)[:200])
        raise AssertionError(f"a dry run opened a connection or a process: {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    monkeypatch.chdir(project(tmp_path))
    monkeypatch.delenv("CPUACCEL_INVENTORY", raising=False)
    monkeypatch.setenv("NO_COLOR", "1")
    result = CliRunner().invoke(
        cli,
        ["run", "-i", str(EXAMPLE_INVENTORY), "--nodes", "4", "--ppn", "4", "--dry-run",
         "train.py"],
    )  # fmt: skip
    assert opened == []
    assert result.exit_code == 0, result.output
    assert "-n 16 -ppn 4" in result.output


def test_dry_run_loads_no_ssh_library(tmp_path: Path) -> None:
    """paramiko and Fabric cost ~0.3 s to import; a dry run connects nowhere, so it must
    not pay for them (the A/B bench caught ssh.sh's argv being taken from a connector)."""
    report = (
        "import atexit, sys\n"
        "atexit.register(lambda: print('LOADED', [m for m in ('paramiko', 'fabric')"
        " if m in sys.modules]))"
    )
    proc = cpuaccel(
        "run", "-i", str(EXAMPLE_INVENTORY), "--ppn", "2", "--dry-run", "train.py",
        cwd=project(tmp_path), prelude=report,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "LOADED []" in proc.stdout


def test_dry_run_hides_secret_values(tmp_path: Path) -> None:
    inventory = tmp_path / "inv.yaml"
    inventory.write_text(
        "all:\n  vars:\n    cpuaccel_secret_env: {API_TOKEN: dry-s3cr3t}\n"
        "  hosts:\n    n1: {ansible_host: 192.0.2.1}\n"
    )
    proc, elapsed = timed_cpuaccel(
        "run", "-i", str(inventory), "--ppn", "1", "--dry-run", "train.py",
        cwd=project(tmp_path),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert elapsed < NO_CONTACT_SECONDS
    assert "dry-s3cr3t" not in proc.stdout + proc.stderr
    assert "## secret.env (mode 0600): API_TOKEN (values hidden)" in proc.stdout
    assert not any("API_TOKEN" in line for line in section(proc.stdout, "env.sh"))


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing.py"], "missing.py: no such script"),
        (["sub"], "sub: no such script"),  # a folder is no script
        (["../outside.py"], "is outside the project folder"),
        (["--nodes", "5", "train.py"], "--nodes 5, but 4 host(s) are selected"),
        # NAME alone is the controller's value (mpirun -x NAME): unset here, it has none.
        (["--env", "NOEQUALS", "train.py"], "--env NOEQUALS: NOEQUALS is not set here"),
        (["--env", "1BAD=x", "train.py"], "--env '1BAD=x': expected KEY=VALUE"),
        (["--env", "=x", "train.py"], "--env '=x': expected KEY=VALUE"),
        (["--env", "A-B=x", "train.py"], "--env 'A-B=x': expected KEY=VALUE"),
        # A CPUACCEL_* value every rank would refuse: refused here, before the job starts.
        (
            ["--env", "CPUACCEL_ATTENTION=fastest", "train.py"],
            "--env CPUACCEL_ATTENTION: 'fastest' is not a choice (attention's precision",
        ),
        (
            ["--env", "CPUACCEL_TRACKERS=tensorboard,wandb", "train.py"],
            "--env CPUACCEL_TRACKERS: 'wandb' is not a choice (where ctx.log also writes)",
        ),
    ],
)
def test_bad_input_is_one_clear_error_before_any_node(
    tmp_path: Path, args: list[str], message: str
) -> None:
    proj = project(tmp_path)
    (proj / "sub").mkdir()
    (tmp_path / "outside.py").write_text("print('not synced')\n")
    # Not a dry run: the error must come before anything is contacted.
    proc, elapsed = timed_cpuaccel("run", "-i", str(EXAMPLE_INVENTORY), *args, cwd=proj)
    assert proc.returncode == EXIT_USAGE, proc.stdout + proc.stderr
    assert elapsed < NO_CONTACT_SECONDS
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[0].startswith("error: ") and message in lines[0], proc.stderr
    # One line, and at most the fix under it.
    assert len(lines) <= 2 and all(line.strip().startswith("fix:") for line in lines[1:])
    assert proc.stdout == ""
    assert not (proj / "runs").exists()


def test_script_outside_the_project_by_absolute_path(tmp_path: Path) -> None:
    proj = project(tmp_path)
    outside = tmp_path / "elsewhere.py"
    outside.write_text("")
    proc, _ = timed_cpuaccel("run", "-i", str(EXAMPLE_INVENTORY), str(outside), cwd=proj)
    assert proc.returncode == EXIT_USAGE
    assert f"is outside the project folder {proj}" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["--nodes", "0", "train.py"], id="nodes-0"),
        pytest.param(["--launcher", "lam", "train.py"], id="unknown-launcher"),
        pytest.param([], id="no-script"),
    ],
)
def test_usage_errors_of_click_exit_64_without_traceback(tmp_path: Path, args: list[str]) -> None:
    proj = project(tmp_path)
    proc, _ = timed_cpuaccel("run", "-i", str(EXAMPLE_INVENTORY), *args, cwd=proj)
    assert proc.returncode == EXIT_USAGE, args
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: ")  # one error line, then its fix


# ---------------------------------------------------------------- plans and launchers


def hosts(count: int = 2, **group_vars: Any) -> list[Host]:
    base = {"cpuaccel_python": PYTHON, "cpuaccel_workdir": WORKDIR, **group_vars}
    return [Host(f"n{i}", dict(base)) for i in range(1, count + 1)]


def facts(
    flavours: Sequence[str],
    *,
    sockets: int = 2,
    cores: int = 16,
    packages: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    return {
        "cpu": {"sockets": sockets, "physical_cores": cores},
        "mpi": {"launchers": [{"flavour": f, "path": f"/usr/bin/mpirun.{f}"} for f in flavours]},
        "packages": dict(packages or {}),
        "setvars": {"path": None},
    }


def settings_for(chosen: Sequence[Host], **flags: Any) -> LaunchSettings:
    """The settings `cpuaccel run` would resolve for these hosts and flags."""
    inventory = Inventory(None, {h.name: h for h in chosen}, {})
    return resolve(flags, None, inventory, chosen)


def plan_for(
    flavours: Sequence[str],
    *,
    launcher: str = "auto",
    ppn: int | None = 4,
    env: Mapping[str, str] | None = None,
    chosen: Sequence[Host] | None = None,
    args: tuple[str, ...] = ("--lr", "0.1"),
    **fact_kw: Any,
) -> RunPlan:
    chosen = list(chosen or hosts())
    settings = settings_for(chosen, ppn=ppn, launcher=launcher, env=dict(env or {}))
    found = {h.name: facts(flavours, **fact_kw) for h in chosen}
    return build_plan(settings, Script("train.py", args, "proj"), found, RUN_ID)


RANK_ARGV = ["/bin/sh", f"{RUN_DIR}/rank.sh", "train.py", "--lr", "0.1"]


def test_intel_mpi_command_and_launcher_environment() -> None:
    plan = plan_for(["impi", "mpich", "openmpi"])
    assert plan.launcher.name == "impi"
    assert plan.command() == [
        "/usr/bin/mpirun.impi", "-f", f"{RUN_DIR}/hostfile", "-n", "8", "-ppn", "4",
        *RANK_ARGV,
    ]  # fmt: skip
    files = render_job_files(plan, ConnectOptions())
    launch = files["launch.sh"][1]
    assert f"export I_MPI_HYDRA_BOOTSTRAP_EXEC={RUN_DIR}/ssh.sh" in launch
    assert "export I_MPI_PIN_DOMAIN=omp" in launch
    assert "export PATH=/usr/bin:" in launch  # mpiexec.hydra beside mpirun
    assert files["hostfile"][1] == "n1\nn2\n"


def test_mpich_command_shape() -> None:
    plan = plan_for(["mpich", "openmpi"])
    assert plan.launcher.name == "mpich"
    assert plan.command() == [
        "/usr/bin/mpirun.mpich",
        "-f", f"{RUN_DIR}/hostfile",
        "-n", "8",
        "-ppn", "4",
        "-launcher", "ssh",
        "-launcher-exec", f"{RUN_DIR}/ssh.sh",
        "-bind-to", "core:4",  # 16 physical cores / 4 ranks
        *RANK_ARGV,
    ]  # fmt: skip
    assert render_job_files(plan, ConnectOptions())["hostfile"][1] == "n1\nn2\n"


def test_own_templates_come_from_the_settings_not_the_hosts(tmp_path: Path) -> None:
    own = tmp_path / "mine"
    own.mkdir()
    (own / "hostfile.j2").write_text(
        "# mine\n{% for node in nodes %}{{ node.name | quote }}\n{% endfor %}"
    )
    plan = plan_for(["impi"], chosen=hosts(cpuaccel_templates=str(own)))
    assert plan.templates == str(own)
    files = render_job_files(plan, ConnectOptions())
    assert files["hostfile"][1] == "# mine\nn1\nn2\n"
    assert "#!/bin/sh" in files["launch.sh"][1]  # the others are still cpuaccel's own


def test_own_templates_must_be_a_folder(tmp_path: Path) -> None:
    plan = plan_for(["impi"], chosen=hosts(cpuaccel_templates=str(tmp_path / "missing")))
    with pytest.raises(UsageError, match=r"cpuaccel_templates is .*missing, which is not a folder"):
        render_job_files(plan, ConnectOptions())


def test_open_mpi_command_shape_forwards_every_variable() -> None:
    plan = plan_for(["openmpi"], env={"FI_PROVIDER": "tcp"}, cores=24, ppn=3)
    assert plan.launcher.name == "openmpi"
    argv = plan.command()
    assert argv[:12] == [
        "/usr/bin/mpirun.openmpi",
        "--hostfile", f"{RUN_DIR}/hostfile",
        "-n", "6",
        "--map-by", "ppr:3:node:PE=8",
        "--bind-to", "core",
        "--mca", "plm_rsh_agent", f"{RUN_DIR}/ssh.sh",
    ]  # fmt: skip
    exports = argv[12 : argv.index("/bin/sh")]
    assert exports[0::2] == ["-x"] * len(plan.env)
    assert exports[1::2] == list(plan.env)
    assert {"MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS", "CPUACCEL_RUN_ID"} <= set(plan.env)
    assert "FI_PROVIDER" in exports
    assert argv[argv.index("/bin/sh") :] == [
        "/bin/sh", f"{RUN_DIR}/rank.sh", "train.py", "--lr", "0.1"
    ]  # fmt: skip
    files = render_job_files(plan, ConnectOptions())
    assert files["hostfile"][1] == "n1 slots=3\nn2 slots=3\n"
    assert "export OMPI_ALLOW_RUN_AS_ROOT=1" in files["launch.sh"][1]


def test_launcher_choice() -> None:
    assert launchers.pick(["openmpi", "mpich"]).name == "mpich"
    assert launchers.pick(["openmpi", "impi"]).name == "impi"
    with pytest.raises(UsageError, match="no MPI launcher found"):
        launchers.pick([])
    with pytest.raises(UsageError, match="unknown launcher"):
        launchers.get("lam")
    # The flag beats the facts; an inventory setting beats auto; cpuaccel_mpirun beats both.
    assert plan_for(["impi", "openmpi"], launcher="openmpi").launcher.name == "openmpi"
    chosen = hosts(cpuaccel_launcher="mpich", cpuaccel_mpirun="/opt/mpich/bin/mpiexec")
    plan = plan_for(["impi", "mpich"], chosen=chosen)
    assert plan.launcher.name == "mpich"
    assert plan.command()[0] == "/opt/mpich/bin/mpiexec"
    # Without facts (a dry run): Intel MPI beside the nodes' Python, as impi-rt installs it.
    settings = settings_for(hosts(), ppn=2)
    assert (
        build_plan(settings, Script("train.py"), None, RUN_ID).command()[0]
        == "/opt/venv/bin/mpirun"
    )


def test_threads_ccl_and_environment_precedence() -> None:
    chosen = hosts(cpuaccel_env={"A": "inventory", "B": "inventory"}, cpuaccel_fi_provider="tcp")
    plan = plan_for(
        ["impi"],
        chosen=chosen,
        env={"B": "flag"},
        packages={"oneccl_bindings_for_pytorch": "2.5"},
        cores=16,
        ppn=4,
    )
    assert plan.env["CPUACCEL_BACKEND"] == "ccl"
    assert plan.env["CCL_WORKER_COUNT"] == "1"
    assert plan.env["CCL_ATL_TRANSPORT"] == "ofi"
    assert plan.env["OMP_NUM_THREADS"] == "3"  # 16 cores / 4 ranks, minus a CCL worker
    assert plan.env["FI_PROVIDER"] == "tcp"
    assert (plan.env["A"], plan.env["B"]) == ("inventory", "flag")
    assert plan.env["MASTER_ADDR"] == "n1" and plan.env["CPUACCEL_RUN_ID"] == RUN_ID
    # Without oneCCL: no CCL variables, all cores per rank; ppn defaults to the sockets.
    plain = plan_for(["impi"], ppn=None, sockets=2, cores=16)
    assert plain.ppn == 2 and plain.env["OMP_NUM_THREADS"] == "8"
    assert not any(k.startswith("CCL_") for k in plain.env)


def test_nodes_flag_picks_the_first_hosts_and_bad_count_is_refused() -> None:
    settings = settings_for(hosts(3), nodes=2, ppn=1)
    plan = build_plan(settings, Script("train.py"), None, RUN_ID)
    assert [h.name for h in plan.hosts] == ["n1", "n2"] and plan.world == 2
    with pytest.raises(UsageError, match="--nodes 4, but 3 host"):
        build_plan(settings_for(hosts(3), nodes=4), Script("t.py"), None, RUN_ID)
    mixed = [*hosts(1), Host("n2", {"cpuaccel_python": "/other/python"})]
    with pytest.raises(UsageError, match="cpuaccel_python differs"):
        build_plan(settings_for(mixed), Script("t.py"), None, RUN_ID)


# ---------------------------------------------------------------- rendered files


def test_rendered_files_carry_values_and_arguments_literally(tmp_path: Path) -> None:
    weird = "$(touch {m}) `touch {m}` 'q' \"d\" $HOME ; \\ *".format(m=tmp_path / "marker")
    args = ("--name", "a b", f"$(touch {tmp_path / 'marker'})", "it's", "", "l1\nl2", "*")
    plan = plan_for(["impi"], env={"WEIRD": weird}, args=args)
    files = render_job_files(plan, ConnectOptions())
    (tmp_path / "env.sh").write_text(files["env.sh"][1])
    shown = subprocess.run(
        ["/bin/sh", "-c", '. ./env.sh && printf %s "$WEIRD"'],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert shown.stdout == weird
    assert not (tmp_path / "marker").exists()
    # The last line of launch.sh execs exactly the planned command.
    launch = files["launch.sh"][1]
    last = launch[launch.rindex("\nexec ") + 1 :]
    assert shlex.split(last) == ["exec", *plan.command()]
    assert plan.command()[-len(args) :] == list(args)
    for name in ("hostfile", "env.sh", "rank.sh", "ssh.sh", "launch.sh"):
        syntax = subprocess.run(["/bin/sh", "-n", "-c", files[name][1]], capture_output=True)
        assert name == "hostfile" or syntax.returncode == 0, (name, syntax.stderr)


def test_secrets_go_to_a_private_file_only(tmp_path: Path) -> None:
    chosen = hosts(cpuaccel_secret_env={"API_TOKEN": "unit-s3cr3t"}, cpuaccel_env={"X": "1"})
    plan = plan_for(["impi"], chosen=chosen)
    assert "API_TOKEN" not in plan.env and plan.secret_env == {"API_TOKEN": "unit-s3cr3t"}
    files = render_job_files(plan, ConnectOptions())
    mode, text = files["secret.env"]
    assert mode == PRIVATE == 0o600
    assert text == "export API_TOKEN=unit-s3cr3t\n"
    assert all("unit-s3cr3t" not in t for name, (_, t) in files.items() if name != "secret.env")
    run_dir = RunDir.create(tmp_path / "runs", plan, files)
    run_dir.record(secret_names=sorted(plan.secret_env), env_names=sorted(plan.env))
    written = sorted(p.name for p in run_dir.path.iterdir())
    assert "secret.env" not in written and "run.json" in written
    for path in run_dir.path.iterdir():
        assert b"unit-s3cr3t" not in path.read_bytes(), path.name
    # rank.sh sources the node's copy when there is one.
    assert f". {RUN_DIR}/secret.env" in files["rank.sh"][1]


# ---------------------------------------------------------------- worker environment


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        pytest.param(
            {"PMI_RANK": "5", "PMI_SIZE": "8", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "4"},
            ("5", "8", "1", "4"),
            id="intel-mpi-and-mpich",
        ),
        pytest.param(
            {
                "OMPI_COMM_WORLD_RANK": "3",
                "OMPI_COMM_WORLD_SIZE": "6",
                "OMPI_COMM_WORLD_LOCAL_RANK": "0",
                "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
            },
            ("3", "6", "0", "2"),
            id="open-mpi",
        ),
        pytest.param(
            {"PMIX_RANK": "2", "PMIX_SIZE": "4", "PMIX_LOCAL_RANK": "0", "PMIX_LOCAL_SIZE": "2"},
            ("2", "4", "0", "2"),
            id="pmix",
        ),
        pytest.param(
            {
                "SLURM_PROCID": "7",
                "SLURM_NTASKS": "8",
                "SLURM_LOCALID": "3",
                "SLURM_NTASKS_PER_NODE": "4",
            },
            ("7", "8", "3", "4"),
            id="slurm-ntasks-per-node",
        ),
        pytest.param(
            # Without --ntasks-per-node Slurm sets only SLURM_TASKS_PER_NODE, per node.
            {
                "SLURM_PROCID": "5",
                "SLURM_NTASKS": "8",
                "SLURM_LOCALID": "1",
                "SLURM_NODEID": "1",
                "SLURM_TASKS_PER_NODE": "4(x2)",
            },
            ("5", "8", "1", "4"),
            id="slurm-4(x2)",
        ),
        pytest.param(
            {
                "SLURM_PROCID": "4",
                "SLURM_NTASKS": "7",
                "SLURM_LOCALID": "1",
                "SLURM_NODEID": "1",
                "SLURM_TASKS_PER_NODE": "3(x2),1",
            },
            ("4", "7", "1", "3"),
            id="slurm-uneven",
        ),
        pytest.param(
            # torchrun's own variables win over the launcher's underneath.
            {
                "RANK": "1",
                "WORLD_SIZE": "2",
                "LOCAL_RANK": "1",
                "LOCAL_WORLD_SIZE": "2",
                "PMI_RANK": "0",
                "PMI_SIZE": "1",
            },
            ("1", "2", "1", "2"),
            id="torchrun-wins",
        ),
        pytest.param({}, ("0", "1", "0", "1"), id="defaults"),
        pytest.param({"PMI_RANK": "4"}, ("4", "1", "0", "1"), id="rank-only"),
    ],
)
def test_worker_derives_the_distributed_environment(
    env: dict[str, str], expected: tuple[str, str, str, str]
) -> None:
    derived = derive_env(env)
    got = (
        derived["RANK"],
        derived["WORLD_SIZE"],
        derived["LOCAL_RANK"],
        derived["LOCAL_WORLD_SIZE"],
    )
    assert got == expected


def test_worker_master_address_defaults_and_passes_through() -> None:
    assert derive_env({})["MASTER_ADDR"] == "127.0.0.1"
    assert derive_env({})["MASTER_PORT"] == "29500"
    given = derive_env({"MASTER_ADDR": "node1", "MASTER_PORT": "1234"})
    assert (given["MASTER_ADDR"], given["MASTER_PORT"]) == ("node1", "1234")


# ---------------------------------------------------------------- worker process


def worker(tmp_path: Path, source: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "script.py"
    script.write_text(source)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "SLURM_"))}
    return subprocess.run(
        [sys.executable, "-m", "cpuaccel.worker", str(script), *args],
        capture_output=True,
        text=True,
        env={**base, "CPUACCEL_LABEL_OUTPUT": "1", "PMI_RANK": "2", "PMI_SIZE": "4", **env},
        cwd=tmp_path,
        timeout=60,
    )


def test_worker_labels_output_and_passes_arguments(tmp_path: Path) -> None:
    source = (
        "import atexit, json, os, sys\n"
        "atexit.register(print, 'at exit')\n"
        "print(json.dumps([sys.argv[1:], os.environ['RANK'], os.environ['WORLD_SIZE']]))\n"
        "print('to stderr', file=sys.stderr)\n"
    )
    args = ("--name", "a b", "$(x)", "")
    proc = worker(tmp_path, source, *args)
    assert proc.returncode == 0, proc.stderr
    label = f"[rank 2 {socket.gethostname()}] "
    out = proc.stdout.splitlines()
    assert out[0] == label + json.dumps([list(args), "2", "4"])
    # atexit handlers run, as in a plain `python SCRIPT`, still labelled.
    assert out[1:] == [label + "at exit"]
    assert proc.stderr.splitlines() == [label + "to stderr"]


def test_worker_reports_a_failing_exit_code(tmp_path: Path) -> None:
    proc = worker(tmp_path, "import sys\nprint('bye')\nsys.exit(3)\n")
    assert proc.returncode == 3
    label = f"[rank 2 {socket.gethostname()}] "
    assert proc.stderr.splitlines()[-1] == f"{label}{EXIT_MARKER} 3"
    crashed = worker(tmp_path, "raise ValueError('boom')\n")
    assert crashed.returncode == 1
    assert "ValueError: boom" in crashed.stderr
    assert crashed.stderr.splitlines()[-1].endswith(f"{EXIT_MARKER} 1")


def test_worker_reports_a_code_the_script_left_without_reporting(tmp_path: Path) -> None:
    """os._exit skips the script's own report: the rank's own process reports it, once."""
    proc = worker(tmp_path, "import os\nprint('bye', flush=True)\nos._exit(5)\n")
    assert proc.returncode == 5
    label = f"[rank 2 {socket.gethostname()}] "
    assert [line for line in proc.stderr.splitlines() if EXIT_MARKER in line] == [
        f"{label}{EXIT_MARKER} 5"
    ]
    reported = worker(tmp_path, "import sys\nsys.exit(4)\n")  # reported by the script
    assert [line for line in reported.stderr.splitlines() if EXIT_MARKER in line] == [
        f"{label}{EXIT_MARKER} 4"
    ]


# A native thread left running past the script, held by a static C++ object: at exit()
# its destructor meets a joinable std::thread and the C++ runtime calls std::terminate,
# as gloo's threads left after destroy_process_group can.
LEFTOVER_CPP = """\
#include <chrono>
#include <thread>
static std::thread left;
extern "C" void start_thread() {
    left = std::thread([] { for (;;) std::this_thread::sleep_for(std::chrono::seconds(1)); });
}
"""
LEFTOVER_SCRIPT = """\
import ctypes, os
ctypes.CDLL(os.path.join(os.getcwd(), "libleftover.so")).start_thread()
print("trained", flush=True)
"""


def test_a_native_thread_left_at_exit_does_not_turn_success_into_abort(tmp_path: Path) -> None:
    (tmp_path / "leftover.cpp").write_text(LEFTOVER_CPP)
    built = subprocess.run(
        ["g++", "-shared", "-fPIC", "-pthread", "-o", "libleftover.so", "leftover.cpp"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    (tmp_path / "script.py").write_text(LEFTOVER_SCRIPT)
    # The abort is real: a plain `python script.py` dies by SIGABRT after its work.
    plain = subprocess.run(
        [sys.executable, "script.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert plain.returncode == -signal.SIGABRT, plain
    assert plain.stdout == "trained\n" and "terminate called" in plain.stderr
    # As a rank: the script's own code, 0, reported and exited with.
    proc = worker(tmp_path, LEFTOVER_SCRIPT, CPUACCEL_RUN_ID="r")
    assert proc.returncode == 0, proc.stderr
    assert "terminate called" not in proc.stderr and "killed by" not in proc.stderr
    label = f"[rank 2 {socket.gethostname()}] "
    assert proc.stderr.splitlines() == [f"{label}{EXIT_MARKER} 0"]
    # And as a run records it.
    env = {k: v for k, v in os.environ.items() if k != "CPUACCEL_INVENTORY"}
    run = cpuaccel("run", "--nodes", "1", "--ppn", "1", "--json", "script.py", cwd=tmp_path,
                   env=env, timeout=120)  # fmt: skip
    said = json.loads(run.stdout)
    assert (run.returncode, said["ended_by"], said["ranks"]) == (0, "completed", {"0": 0}), run
    status = json.loads((tmp_path / "runs" / said["run_id"] / "status.json").read_text())
    assert (status["state"], status["ranks"]) == ("succeeded", {"0": 0})


def test_worker_says_a_bad_runtime_setting_in_one_line(tmp_path: Path) -> None:
    """A CPUACCEL_* variable the runtime refuses ends the rank with EXIT_USAGE and one
    line naming the variable and the choices, not a traceback."""
    proc = worker(tmp_path, "import cpuaccel\ncpuaccel.init()\n", CPUACCEL_ATTENTION="fastest")
    assert proc.returncode == 64, proc.stderr
    label = f"[rank 2 {socket.gethostname()}] "
    assert proc.stderr.splitlines() == [
        f"{label}cpuaccel: $CPUACCEL_ATTENTION: 'fastest' is not a choice (attention's "
        "precision under bf16); use auto, autocast or fp32",
        f"{label}{EXIT_MARKER} 64",
    ]
    restart = worker(tmp_path, "import cpuaccel\ncpuaccel.init()\n", CPUACCEL_RESTART="-1")
    assert restart.returncode == 64 and "Traceback" not in restart.stderr
    assert f"{label}cpuaccel: CPUACCEL_RESTART='-1': not a whole number" in restart.stderr


def test_worker_reports_a_death_by_signal(tmp_path: Path) -> None:
    """A rank killed by a signal (OOM killer, segfault) is reported like a failing one."""
    proc = worker(tmp_path, "import os, signal\nprint('x', flush=True)\nos.kill(os.getpid(), 9)\n")
    assert proc.returncode == 128 + signal.SIGKILL
    label = f"[rank 2 {socket.gethostname()}] "
    assert proc.stderr.splitlines()[-2:] == [
        f"{label}[cpuaccel] killed by SIGKILL",
        f"{label}{EXIT_MARKER} 137",
    ]


def gone(pid: int) -> bool:
    """Whether ``pid`` has ended (a zombie its new parent has not reaped yet counts)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_worker_ends_when_the_script_exits_though_a_copy_of_stderr_is_open(
    tmp_path: Path,
) -> None:
    """As DeepSpeed's op builder does: the script keeps a duplicate of stderr open. The
    rank ends with the script's process, as `python SCRIPT` does, without a word."""
    started = time.monotonic()
    proc = worker(tmp_path, "import os, sys\nos.dup(sys.stderr.fileno())\n")
    assert proc.returncode == 0, proc.stderr
    assert time.monotonic() - started < 10
    assert proc.stdout == proc.stderr == ""


def test_worker_ends_what_the_script_left_holding_its_output(tmp_path: Path) -> None:
    """A background helper that inherited stdout outlives the script: after a short
    drain it is ended and named, and the rank's exit code is still the script's."""
    source = (
        "import os, subprocess, sys\n"
        "os.dup(sys.stderr.fileno())\n"
        "helper = subprocess.Popen(['sleep', '600'])\n"
        "print('helper', helper.pid, flush=True)\n"
        "sys.exit(3)\n"
    )
    started = time.monotonic()
    proc = worker(tmp_path, source)
    seconds = time.monotonic() - started
    assert proc.returncode == 3, proc.stderr
    assert seconds < _labels.DRAIN_SECONDS + _labels.TERM_GRACE_SECONDS + 10
    label = f"[rank 2 {socket.gethostname()}] "
    pid = int(proc.stdout.split()[-1])
    assert gone(pid)
    assert proc.stderr.splitlines() == [
        f"{label}{EXIT_MARKER} 3",
        f"{label}[cpuaccel] a process of the script (pid {pid}, sleep 600) still held its "
        "output at exit: ended it",
    ]


def test_worker_ends_what_a_program_left_holding_its_output(tmp_path: Path) -> None:
    """--no-python: a shell that leaves a background job behind ends the rank all the
    same, with the shell's own exit code."""
    proc = subprocess.run(
        [sys.executable, "-m", "cpuaccel.worker", "--no-python", "sh", "-c",
         "sleep 600 & echo $!; exit 5"],
        capture_output=True,
        text=True,
        env={**os.environ, "CPUACCEL_LABEL_OUTPUT": "1", "PMI_RANK": "2"},
        timeout=60,
    )  # fmt: skip
    assert proc.returncode == 5, proc.stderr
    label = f"[rank 2 {socket.gethostname()}] "
    pid = int(proc.stdout.split()[-1])
    assert gone(pid)
    assert proc.stderr.splitlines()[-1] == (
        f"{label}[cpuaccel] a process of the script (pid {pid}, sleep 600) still held its "
        "output at exit: ended it"
    )


SIGNALLED_SCRIPT = (
    "import signal, sys, time\n"
    "def bye(signum, frame):\n"
    "    print('got', signal.Signals(signum).name, flush=True)\n"
    "    sys.exit(0)\n"
    "signal.signal(signal.SIGTERM, bye)\n"
    "print('ready', flush=True)\n"
    "time.sleep(30)\n"
)
# The worker, its own process slowed down after the fork (as a busy machine may):
# the script is ready before the worker forwards signals.
SLOW_WORKER = (
    "import sys, time\n"
    "from cpuaccel import worker\n"
    "wait = worker._wait_for_script\n"
    "def slow(*args, **kwargs):\n"
    "    time.sleep(1)\n"
    "    return wait(*args, **kwargs)\n"
    "worker._wait_for_script = slow\n"
    "worker.main()\n"
)


@pytest.mark.parametrize("worker", ["-m cpuaccel.worker", "slowed"])
def test_worker_passes_signals_to_the_script(tmp_path: Path, worker: str) -> None:
    script = tmp_path / "script.py"
    script.write_text(SIGNALLED_SCRIPT)
    start = ["-m", "cpuaccel.worker"] if worker != "slowed" else ["-c", SLOW_WORKER]
    proc = subprocess.Popen(
        [sys.executable, *start, str(script)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PMI_RANK": "0"},
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)  # to the rank's own process, as MPI sends it
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0
    assert out.strip() == "got SIGTERM"


# ---------------------------------------------------------------- output router


class Terminal:
    def __init__(self) -> None:
        self.out = io.StringIO()
        self.err = io.StringIO()
        self.consoles = (
            Console(file=self.out, color_system=None, highlight=False, width=250),
            Console(file=self.err, color_system=None, highlight=False, width=250),
        )


def router(tmp_path: Path) -> tuple[Output, Terminal, RunDir]:
    """The supervisor's output as a foreground run shows it (jobs/foreground.terminal)."""
    run_dir = RunDir(tmp_path / "run")
    run_dir.path.mkdir()
    term = Terminal()
    return Output(str(run_dir.path), terminal(*term.consoles)), term, run_dir


def test_router_sends_each_rank_to_its_log_and_the_terminal(tmp_path: Path) -> None:
    r, term, run_dir = router(tmp_path)
    r.feed("out", "[rank 0 node1] hello")
    r.feed("out", "[rank 1 node1]   indented [bold]not markup[/bold]")
    r.feed("err", "[rank 1 node1] warning")
    r.feed("out", "[rank 10 node3] ten")
    r.feed("err", "some words of mpirun")
    r.close()
    assert term.out.getvalue().splitlines() == [
        "[rank 0 node1] hello",
        "[rank 1 node1]   indented [bold]not markup[/bold]",
        "[rank 10 node3] ten",
    ]
    assert term.err.getvalue().splitlines() == [
        "[rank 1 node1] warning",
        "[mpirun] some words of mpirun",
    ]
    assert (run_dir.path / "rank-0.log").read_text() == "hello\n"
    assert (run_dir.path / "rank-1.log").read_text() == (
        "  indented [bold]not markup[/bold]\nwarning\n"
    )
    assert (run_dir.path / "rank-10.log").read_text() == "ten\n"
    assert (run_dir.path / "launcher.log").read_text() == "some words of mpirun\n"
    assert r.failures == [] and not r.failed.is_set()


def test_router_reads_the_exit_marker(tmp_path: Path) -> None:
    r, term, run_dir = router(tmp_path)
    r.feed("err", f"[rank 3 node2] {EXIT_MARKER} 3")
    r.feed("err", f"[rank 5 node3] {EXIT_MARKER} 7")
    r.close()
    assert r.failed.is_set()
    assert [(f.rank, f.host, f.code) for f in r.failures] == [(3, "node2", 3), (5, "node3", 7)]
    assert term.err.getvalue() == ""  # the summary reports it, not the stream
    assert (run_dir.path / "rank-3.log").read_text() == f"{EXIT_MARKER} 3\n"


def test_router_keeps_a_rank_s_root_cause_with_its_failure(tmp_path: Path) -> None:
    r, term, run_dir = router(tmp_path)
    r.feed("err", f"[rank 3 node2] {CAUSE_MARKER} ValueError: {'x' * 900}")
    r.feed("err", f"[rank 3 node2] {EXIT_MARKER} 1")
    r.feed("err", f"[rank 1 node1] {EXIT_MARKER} 143")
    r.close()
    assert [(f.rank, f.code, f.cause) for f in r.failures] == [
        (3, 1, f"ValueError: {'x' * (CAUSE_LIMIT - 12)}"),
        (1, 143, None),
    ]
    assert term.err.getvalue() == ""  # the summary says it
    assert (run_dir.path / "rank-3.log").read_text().startswith(f"{CAUSE_MARKER} ValueError")


def test_router_takes_srun_task_exit_when_the_rank_marker_was_lost(tmp_path: Path) -> None:
    # srun ends the step at the first bad exit and may drop that task's last lines (its
    # exit marker): seen in CI, where the SIGTERM'd victims' reports came first and the
    # job was blamed on rank 0's 143. srun's own line names the rank and its code.
    r, _, _ = router(tmp_path)
    r.feed("err", "[rank 0 node1] [cpuaccel] killed by SIGTERM")
    r.feed("err", f"[rank 0 node1] {EXIT_MARKER} 143")
    r.feed("err", "srun: error: node2: task 1: Exited with exit code 3")
    r.feed("err", "srun: error: node1: task 0: Exited with exit code 143")
    r.feed("err", "srun: error: node3: tasks 4-5: Exited with exit code 9")
    r.close()
    found = cause(r.failures)
    assert found is not None and (found.rank, found.host, found.code) == (1, "node2", 3)
    assert r.codes == {0: 143, 1: 3, 4: 9, 5: 9}  # rank 0's own marker kept
    assert [f.rank for f in r.failures] == [0, 1, 4, 5]
    # Words that only look alike are not srun's report.
    assert srun_task_exits("srun: error: node2: task x: Exited with exit code 3") == []
    assert srun_task_exits("[rank 1 n] srun: error: n: task 1: Exited with exit code 3") == []


def test_router_bad_termination_and_quiet_ending(tmp_path: Path) -> None:
    r, term, run_dir = router(tmp_path)
    r.feed("out", "=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES")
    assert r.failed.is_set() and r.failures == []
    r.quiet = True  # cpuaccel is ending the job: what the ending causes is no news
    r.feed("out", "=   KILLED BY SIGNAL: 15 (Terminated)")
    r.feed("err", "[rank 2 node2] [cpuaccel] killed by SIGTERM")
    r.feed("err", f"[rank 2 node2] {EXIT_MARKER} 143")
    r.close()
    assert r.failures == []
    assert "KILLED BY SIGNAL" not in term.err.getvalue()
    assert "killed by SIGTERM" not in term.err.getvalue()
    assert "KILLED BY SIGNAL" in (run_dir.path / "launcher.log").read_text()
    assert f"{EXIT_MARKER} 143" in (run_dir.path / "rank-2.log").read_text()


# ---------------------------------------------------------------- exit codes


def ending(
    tmp_path: Path,
    stop: str | None,
    markers: list[tuple[int, int]],
    launcher_exit: int | None,
    lost: list[str] | None = None,
) -> Outcome:
    """How a job ends, given why it was stopped, the ranks' exit markers and the
    launcher's own exit code (and the nodes it lost)."""
    r, _, _ = router(tmp_path)
    for rank, rc in markers:
        r.feed("err", f"[rank {rank} n1] {EXIT_MARKER} {rc}")
    return supervisor._outcome(stop, launcher_exit, 1.0, r, supervisor.Watched(list(lost or [])))


@pytest.mark.parametrize(
    ("stop", "markers", "launcher_exit", "code", "reason"),
    [
        (None, [], 0, 0, "completed"),
        (None, [(3, 3), (1, 9)], 1, 3, "failed"),  # the first failing rank's code
        ("failed", [], 255, 255, "failed"),  # a rank died unreported: mpirun's code
        (None, [], 7, 7, "failed"),
        ("timeout", [(0, 143)], 143, EXIT_TIMEOUT, "timeout"),
        ("interrupted", [(0, 130)], 130, EXIT_INTERRUPTED, "interrupted"),
        ("terminated", [], 143, 143, "terminated"),
    ],
)
def test_job_exit_code(
    tmp_path: Path,
    stop: str | None,
    markers: list[tuple[int, int]],
    launcher_exit: int,
    code: int,
    reason: str,
) -> None:
    outcome = ending(tmp_path, stop, markers, launcher_exit)
    assert (outcome.exit_code, outcome.reason) == (code, reason)


@pytest.mark.parametrize(
    ("stop", "markers", "launcher_exit", "code", "reason"),
    [
        ("lost", [], None, EXIT_LOST, "lost"),  # noticed by cpuaccel; the head gave no status
        (None, [(2, 1)], 1, EXIT_LOST, "lost"),  # MPI noticed first: its failures follow from it
        (None, [], 0, 0, "completed"),  # lost only in the sweep after a clean end
        ("interrupted", [], 130, EXIT_INTERRUPTED, "interrupted"),
    ],
)
def test_a_lost_node_is_the_reason_of_the_ending(
    tmp_path: Path,
    stop: str | None,
    markers: list[tuple[int, int]],
    launcher_exit: int | None,
    code: int,
    reason: str,
) -> None:
    outcome = ending(tmp_path, stop, markers, launcher_exit, lost=["n2"])
    assert (outcome.exit_code, outcome.reason, outcome.lost) == (code, reason, ["n2"])


def test_a_default_workdir_is_expanded_by_the_head_node() -> None:
    chosen = [Host(f"n{i}", {"cpuaccel_python": PYTHON}) for i in (1, 2)]
    settings = settings_for(chosen, ppn=1)
    found = {h.name: {**facts(["impi"]), "workdir": "/home/u/cpuaccel"} for h in chosen}
    plan = build_plan(settings, Script("train.py", (), "proj"), found, RUN_ID)
    assert plan.run_dir == f"/home/u/cpuaccel/runs/{RUN_ID}"
    assert "~" not in render_job_files(plan, ConnectOptions())["launch.sh"][1]


@pytest.mark.parametrize(
    ("boots", "threads", "waits"), [(("a", "b"), 4, False), (("a", "a"), 2, True)]
)
def test_nodes_of_one_machine_split_its_cores_and_do_not_spin(
    boots: tuple[str, str], threads: int, waits: bool
) -> None:
    chosen = hosts(2)
    settings = settings_for(chosen, ppn=2)
    found = {
        h.name: {**facts(["impi"], cores=8), "boot_id": boot}
        for h, boot in zip(chosen, boots, strict=True)
    }
    plan = build_plan(settings, Script("train.py", (), "proj"), found, RUN_ID)
    assert plan.threads == threads and plan.env["OMP_NUM_THREADS"] == str(threads)
    launch = render_job_files(plan, ConnectOptions())["launch.sh"][1]
    assert ("export I_MPI_WAIT_MODE=1" in launch) is waits
