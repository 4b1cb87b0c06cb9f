"""`cpuaccel run` inside a Slurm allocation, without a Slurm: the allocation as the
inventory (and its precedence), the srun connector's argv, the Slurm launcher's command,
and the ranks' variables under srun's pmi2. The real thing: tests/cluster/test_slurm_run.py."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import pytest

from cpuaccel.config.effective import resolve
from cpuaccel.config.inventory_choice import choose_inventory
from cpuaccel.connectors.base import CommandResult
from cpuaccel.connectors.choose import connector_for
from cpuaccel.connectors.connect_options import ConnectOptions
from cpuaccel.connectors.srun import SrunConnector, step_answers
from cpuaccel.errors import EXIT_OK, EXIT_USAGE, HostError, Unreachable, UsageError
from cpuaccel.executor import Status, failed, in_one_step
from cpuaccel.inventory.host import Host
from cpuaccel.jobs.plan import Script, build_plan
from cpuaccel.jobs.rundir import render_job_files
from cpuaccel.slurm import allocation
from cpuaccel.worker import derive_env
from testsupport.command import clean_env, cpuaccel

RUN_ID = "20261130-211500-a1b2c3"
SLURM = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "node[1-3]"}


@pytest.fixture
def in_job(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in SLURM.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("SLURMD_NODENAME", raising=False)


def test_detect_reads_the_job_and_expands_its_nodes() -> None:
    found = allocation.detect({**SLURM, "SLURMD_NODENAME": "node2"})
    assert found == allocation.Allocation("4242", ("node1", "node2", "node3"), "node2")
    assert allocation.detect({"SLURM_JOB_NODELIST": "node1"}) is None  # no job: none
    old = allocation.detect({"SLURM_JOB_ID": "7", "SLURM_NODELIST": "a,b"})
    assert old is not None and old.nodes == ("a", "b") and old.here is None


@pytest.mark.parametrize(
    ("environ", "said"),
    [
        ({"SLURM_JOB_ID": "12;x", "SLURM_JOB_NODELIST": "n1"}, "$SLURM_JOB_ID"),
        ({"SLURM_JOB_ID": "12"}, "$SLURM_JOB_NODELIST is not set"),
        ({"SLURM_JOB_ID": "12", "SLURM_JOB_NODELIST": "n[1-"}, "$SLURM_JOB_NODELIST"),
        ({"SLURM_JOB_ID": "12", "SLURM_JOB_NODELIST": "-oProxy=x"}, "$SLURM_JOB_NODELIST"),
    ],
)
def test_a_bad_slurm_environment_is_one_usage_error(environ: dict[str, str], said: str) -> None:
    with pytest.raises(UsageError) as caught:
        allocation.detect(environ)
    assert said in str(caught.value) and caught.value.exit_code == EXIT_USAGE


@pytest.mark.usefixtures("in_job")
def test_the_allocation_is_the_inventory_unless_i_is_given(tmp_path: Path) -> None:
    choice = choose_inventory(None, None)
    assert choice.slurm is not None and choice.setting.where == "$SLURM_JOB_ID"
    inventory = choice.load({"cpuaccel_workdir": "/w"})
    hosts = list(inventory.hosts.values())
    assert [h.name for h in hosts] == ["node1", "node2", "node3"]
    assert {h.slurm_job for h in hosts} == {"4242"}
    assert {h.vars["ansible_connection"] for h in hosts} == {"slurm"}
    assert hosts[0].python == sys.executable and hosts[0].workdir == "/w"  # -e on top
    assert isinstance(connector_for(hosts[0]), SrunConnector)
    flagged = choose_inventory("n1,n2,", None)  # an explicit -i wins
    assert flagged.slurm is None and flagged.path == "n1,n2,"


def test_the_batch_host_is_reached_locally(monkeypatch: pytest.MonkeyPatch) -> None:
    found = allocation.detect({**SLURM, "SLURMD_NODENAME": "node1"})
    assert found is not None
    hosts = allocation.inventory(found).hosts
    assert hosts["node1"].is_local and not hosts["node2"].is_local


def test_srun_connector_wraps_the_rendered_line() -> None:
    found = allocation.detect(SLURM)
    assert found is not None
    host = allocation.inventory(found).hosts["node2"]
    conn = SrunConnector(host, ConnectOptions())
    argv = conn.wrap("echo 'a b'")
    assert argv[:1] == ["srun"] and "--jobid=4242" in argv and "--nodelist=node2" in argv
    assert "--overlap" in argv and "--ntasks=1" in argv and "--nodes=1" in argv
    assert argv[-3:] == ["/bin/sh", "-c", "echo 'a b'"]
    with pytest.raises(UsageError, match="no ssh"):
        conn.ssh_argv()
    assert not conn.rsync_ok  # the sync sends a tar: rsync hangs in srun's stdin
    assert not conn.rsync(["-a"], "/src/", "/dest/").ok


@pytest.mark.usefixtures("in_job")
def test_nodes_above_the_allocation_name_both_numbers() -> None:
    choice = choose_inventory(None, None)
    inventory = choice.load()
    with pytest.raises(UsageError) as caught:
        resolve({"nodes": 4}, None, inventory, list(inventory.hosts.values()))
    message = str(caught.value)
    assert "--nodes 4" in message and "Slurm job 4242 has 3 node(s)" in message


@pytest.mark.usefixtures("in_job")
def test_the_slurm_launcher_is_chosen_and_renders_srun() -> None:
    inventory = choose_inventory(None, None).load({"cpuaccel_workdir": "/w"})
    hosts = list(inventory.hosts.values())
    settings = resolve({"nodes": 2, "ppn": 2}, None, inventory, hosts)
    script = Script("train.py", ("a b", "$x"), "proj")
    plan = build_plan(settings, script, None, RUN_ID)
    assert plan.launcher.name == "slurm"
    command = plan.command()
    run_dir = f"/w/runs/{RUN_ID}"
    assert command[:6] == [
        "srun", "--mpi=pmi2", "--nodes=2", "--ntasks=4", "--ntasks-per-node=2",
        f"--nodelist={run_dir}/hostfile",
    ]  # fmt: skip
    assert f"--job-name=cpuaccel-{RUN_ID}" in command and "--kill-on-bad-exit=1" in command
    assert command[-4:] == [f"{run_dir}/rank.sh", "train.py", "a b", "$x"]
    files = render_job_files(plan, ConnectOptions())
    assert "ssh.sh" not in files and "ssh_config" not in files  # srun: no ssh files
    assert files["hostfile"][1] == "node1\nnode2\n"
    launch = files["launch.sh"][1]
    assert "export I_MPI_PMI_LIBRARY=/usr/lib/x86_64-linux-gnu/libpmi2.so.0" in launch
    assert "I_MPI_HYDRA_BOOTSTRAP" not in launch
    assert "export MASTER_ADDR=node1" in files["env.sh"][1]  # the head, never 127.0.0.1
    assert shlex.split(launch.strip().splitlines()[-1])[1:] == command


def test_ranks_under_srun_pmi2_take_slurms_local_rank() -> None:
    """srun --mpi=pmi2 gives PMI_RANK but no MPI_LOCALRANKID: LOCAL_RANK must come
    from SLURM_LOCALID, not default to 0 on every rank."""
    env = {
        "PMI_RANK": "3",
        "PMI_SIZE": "4",
        "SLURM_PROCID": "3",
        "SLURM_NTASKS": "4",
        "SLURM_LOCALID": "1",
        "SLURM_TASKS_PER_NODE": "2(x2)",
        "SLURM_NODEID": "1",
        "MASTER_ADDR": "node1",
    }
    got = derive_env(env)
    assert (got["RANK"], got["WORLD_SIZE"], got["LOCAL_RANK"]) == ("3", "4", "1")
    assert got["LOCAL_WORLD_SIZE"] == "2" and got["MASTER_ADDR"] == "node1"
    hydra = {**env, "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2", "PMI_RANK": "2"}
    assert derive_env(hydra)["RANK"] == "2"  # mpirun inside a job: hydra's own variables


def test_in_a_job_a_dry_run_says_where_the_hosts_came_from(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print(1)\n")
    env = clean_env(**SLURM, PATH=os.environ["PATH"])
    args = ("run", "--nodes", "2", "--ppn", "2", "--dry-run", "train.py")
    proc = cpuaccel(*args, cwd=tmp_path, env=env)
    assert proc.returncode == EXIT_OK, proc.stderr
    assert "hosts: the nodes of Slurm job 4242 (node1, node2, node3)" in proc.stderr
    assert "srun --mpi=pmi2" in proc.stdout
    too_many = cpuaccel("run", "--nodes", "5", "--dry-run", "train.py", cwd=tmp_path, env=env)
    assert too_many.returncode == EXIT_USAGE and "Slurm job 4242 has 3 node(s)" in too_many.stderr
    detached = cpuaccel("run", "--detach", "train.py", cwd=tmp_path, env=env)
    assert detached.returncode == EXIT_USAGE and "cpuaccel submit" in detached.stderr


def test_one_step_answers_are_told_apart_by_task_and_node() -> None:
    """srun --label output of call_everywhere's step: a long answer cut into pieces,
    tasks in any order, a failing program, and a node that never answered."""
    found = allocation.detect(SLURM)
    assert found is not None
    hosts = list(allocation.inventory(found).hosts.values())
    stdout = "\n".join(
        [
            "1: cpuaccel-node node2",
            "0: cpuaccel-node node1",
            '0: {"a": "x',
            "1: ",
            '0: y", "n": 1}',
            "1: cpuaccel-exit 1",
            "0: ",
            "0: cpuaccel-exit 0",
        ]
    )
    stderr = "1: Traceback\n1: OSError: disk full\nsrun: error: node3: unreachable"
    ran = CommandResult("node1", "", 1, stdout, stderr, 0.5)
    answers = step_answers(hosts, ran, "the fact probe")
    assert answers["node1"] == {"a": "xy", "n": 1}
    assert isinstance(answers["node2"], HostError) and "disk full" in str(answers["node2"])
    assert isinstance(answers["node3"], Unreachable) and "node3: unreachable" in str(
        answers["node3"]
    )


def test_one_step_only_for_the_nodes_of_one_allocation() -> None:
    found = allocation.detect(SLURM)
    assert found is not None
    hosts = list(allocation.inventory(found).hosts.values())
    assert in_one_step(hosts)
    assert not in_one_step([*hosts, Host("other")])  # an SSH host among them
    assert not in_one_step([])
    result = failed(hosts[1], Unreachable("node2", "no answer through srun"), 0.5)
    assert result.status is Status.UNREACHABLE and result.error == "no answer through srun"
