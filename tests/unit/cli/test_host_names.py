"""One name for each node: the inventory's, in live output, logs and failures; the
node's own hostname is taken too where a node is asked for (logs --host, --limit, the
head), as earlier runs recorded it."""

from __future__ import annotations

import io
import json
import socket
from pathlib import Path

import pytest
from rich.console import Console

from cpuaccel.errors import EXIT_USAGE
from cpuaccel.jobs.foreground import terminal
from cpuaccel.node.supervisor import Output
from testsupport.command import cpuaccel

HOSTNAME = socket.gethostname()


def test_a_ranks_line_is_labelled_with_its_nodes_inventory_name(tmp_path: Path) -> None:
    out, err = io.StringIO(), io.StringIO()
    consoles = (Console(file=out, color_system=None), Console(file=err, color_system=None))
    output = Output(str(tmp_path), terminal(*consoles), None, {0: "node0", 1: "node0", 2: "n1"})
    output.feed("out", "[rank 0 vm-a] hello")
    output.feed("out", "[rank 2 vm-b] there")
    output.feed("out", "[rank 2 vm-b] [cpuaccel] exit code 3")
    output.close()
    assert out.getvalue().splitlines() == ["[rank 0 node0] hello", "[rank 2 n1] there"]
    assert [(f.rank, f.host, f.code) for f in output.failures] == [(2, "n1", 3)]


@pytest.fixture(scope="module")
def local_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    project = tmp_path_factory.mktemp("project")
    (project / "hello.py").write_text("import os\nprint('hi from', os.environ['RANK'])\n")
    proc = cpuaccel("run", "--nodes", "1", "--ppn", "2", "hello.py", cwd=project, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return project, proc.stdout


@pytest.mark.skipif(HOSTNAME == "localhost", reason="the hostname is the inventory name")
def test_live_output_and_logs_say_the_inventory_name(local_run: tuple[Path, str]) -> None:
    project, live = local_run
    assert "[rank 0 localhost] hi from 0" in live.splitlines()
    assert f"[rank 0 {HOSTNAME}]" not in live
    logs = cpuaccel("logs", cwd=project)
    assert logs.stdout.splitlines() == [
        "[rank 0 localhost] hi from 0",
        "[rank 1 localhost] hi from 1",
    ]
    record = json.loads(next((project / "runs").iterdir()).joinpath("run.json").read_text())
    assert record["hostnames"] == {"localhost": HOSTNAME}


@pytest.mark.parametrize("name", ["localhost", HOSTNAME])
def test_logs_host_takes_the_inventory_name_or_the_hostname(
    local_run: tuple[Path, str], name: str
) -> None:
    project, _ = local_run
    logs = cpuaccel("logs", "--host", name, "--rank", "1", cwd=project)
    assert logs.returncode == 0, logs.stderr
    assert logs.stdout == "[rank 1 localhost] hi from 1\n"


def test_logs_host_of_another_node_names_the_runs(local_run: tuple[Path, str]) -> None:
    project, _ = local_run
    logs = cpuaccel("logs", "--host", "node9", cwd=project)
    assert logs.returncode == EXIT_USAGE
    run_id = next((project / "runs").iterdir()).name
    assert logs.stderr.splitlines() == [
        f"error: --host node9: run {run_id} ran on localhost",
        "  fix: give one of its nodes, by its inventory name or its hostname",
    ]


INVENTORY = """\
all:
  hosts:
    node1: {ansible_host: 192.0.2.11}
    node2: {ansible_host: 192.0.2.12}
"""


def a_project_that_ran_on(tmp_path: Path, hostnames: dict[str, str]) -> Path:
    project = tmp_path / "project"
    (project / "runs" / "20261202-000000-abcdef").mkdir(parents=True)
    (project / "inventory.yaml").write_text(INVENTORY)
    (project / "train.py").write_text("print(1)\n")
    record = {"run_id": "20261202-000000-abcdef", "hosts": list(hostnames), "hostnames": hostnames}
    (project / "runs" / "20261202-000000-abcdef" / "run.json").write_text(json.dumps(record))
    return project


def test_limit_and_head_take_a_hostname_an_earlier_run_recorded(tmp_path: Path) -> None:
    project = a_project_that_ran_on(tmp_path, {"node1": "vm-a", "node2": "vm-b"})
    shown = cpuaccel("config", "show", "--json", "-l", "vm-b", cwd=project)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["hosts"]["value"] == ["node2"]
    headed = cpuaccel("run", "--dry-run", "--master_addr", "vm-b", "--ppn", "1", "train.py",
                      cwd=project)  # fmt: skip
    assert headed.returncode == 0, headed.stderr
    assert "export MASTER_ADDR=node2" in headed.stdout
    unknown = cpuaccel("config", "show", "-l", "vm-c", cwd=project)
    assert unknown.returncode == EXIT_USAGE
    assert "'vm-c' matches no host or group" in unknown.stderr
