"""``cpuaccel.notebook.launch`` from a real notebook in a real kernel (nbclient and
ipykernel) against two namespace nodes: a function defined in a cell runs on every
rank and its value comes back; rank 0's lines are the cell's output; a rank's exception
is the cell's error, naming the rank and its node, with the traceback there; a result
file swapped on its node is refused, never unpickled; an interrupt of the kernel ends
the job on every node; examples/notebook.ipynb runs top to bottom.

Every notebook runs in a project folder of its own (the kernel's working folder, synced
to the nodes), whose cpuaccel.yaml makes the ranks import cpuaccel from the tree under
test, as TREE does for `cpuaccel run`.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient

from cpuaccel.testbed.cluster import Cluster
from tests.cluster.fixtures import REPO, TREE, assert_nothing_left
from tests.hostile.test_notebook_results import swapped_on_rank_one
from testsupport.runs import ENV, job_processes, make_project

pytestmark = pytest.mark.cluster

CELL_TIMEOUT = 240  # seconds a cell may take: the example trains on 4 ranks
PROJECT_FILE = "env:\n  " + TREE[1].replace("=", ": ", 1) + "\n"


def kernel_specs(folder: Path) -> KernelSpecManager:
    """The python3 kernel of this Python (the venv's), whatever else is installed."""
    spec = folder / "python3"
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": "Python 3", "language": "python"})
    )
    return KernelSpecManager(kernel_dirs=[str(folder)])


def client_for(nb: Any, project: Path, tmp_path: Path) -> NotebookClient:
    km = AsyncKernelManager(kernel_name="python3", kernel_spec_manager=kernel_specs(tmp_path / "k"))
    return NotebookClient(
        nb, km=km, timeout=CELL_TIMEOUT, allow_errors=True,
        resources={"metadata": {"path": str(project)}},
    )  # fmt: skip


def kernel_env(inventory: str, **extra: str) -> dict[str, str]:
    return {**ENV, "CPUACCEL_INVENTORY": inventory, **extra}


def notebook_of(*sources: str) -> Any:
    return nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])


def run_notebook(
    nb: Any, tmp_path: Path, inventory: str, files: dict[str, str] | None = None
) -> Path:
    """Execute ``nb`` in a kernel whose working folder is a new project; the project."""
    project = make_project(tmp_path, {"cpuaccel.yaml": PROJECT_FILE, **(files or {})})
    client_for(nb, project, tmp_path).execute(env=kernel_env(inventory))
    return project


def streams(cell: Any, name: str) -> str:
    return "".join(o["text"] for o in cell.outputs if o.output_type == "stream" and o.name == name)


def errors(cell: Any) -> list[Any]:
    return [o for o in cell.outputs if o.output_type == "error"]


SETUP = """\
import socket
import cpuaccel.notebook

SCALE = 10  # a global of the notebook: travels with the function that uses it

def where():
    import os
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), socket.gethostname()
"""


def test_a_cells_function_runs_on_every_rank_and_returns(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    nb = notebook_of(
        SETUP,
        "def work(x):\n"
        "    rank, world, host = where()\n"
        "    for i in range(3):\n"
        "        print(f'line {i} of rank {rank}', flush=True)\n"
        "    return rank, world, host, x * SCALE\n"
        "cpuaccel.notebook.launch(work, 4, nodes=2, ppn=2)",
        "values = cpuaccel.notebook.launch(work, 5, nodes=2, ppn=2, gather=True)\nvalues",
    )
    started = time.monotonic()
    run_notebook(nb, tmp_path, inventory)
    seconds = time.monotonic() - started
    one, gathered = nb.cells[1], nb.cells[2]
    assert errors(one) == [] and errors(gathered) == [], (one.outputs, gathered.outputs)
    rank, world, host, value = eval(one.outputs[-1]["data"]["text/plain"])
    assert (rank, world, value) == (0, 4, 40)
    # Rank 0's lines, in order, and no other rank's; nothing of cpuaccel's own.
    assert streams(one, "stdout") == "line 0 of rank 0\nline 1 of rank 0\nline 2 of rank 0\n"
    assert streams(one, "stderr") == ""
    values = eval(gathered.outputs[-1]["data"]["text/plain"])
    assert [v[:2] for v in values] == [(r, 4) for r in range(4)]
    assert [v[3] for v in values] == [50] * 4
    hosts = [v[2] for v in values]
    assert hosts[0] == hosts[1] == host and hosts[2] == hosts[3] != host  # 2 ranks a node
    assert seconds < 90, seconds


def run_blob_call(
    tmp_path: Path, inventory: str, first_lines: str, settings: str
) -> tuple[Any, dict[str, Any]]:
    """A cell whose function captured 20 MiB (the pickled call, base64, is 27 MiB: worth
    one broadcast) and returns its sha256 from both nodes; the cell, once it returned
    the right digests, and the run's record."""
    nb = notebook_of(
        SETUP,
        "import hashlib, os\n"
        "BLOB = os.urandom(20 << 20)\n"
        "def digest():\n" + first_lines + "    return hashlib.sha256(BLOB).hexdigest()\n"
        f"values = cpuaccel.notebook.launch(digest, nodes=2, ppn=1, gather=True{settings})\n"
        "values == [hashlib.sha256(BLOB).hexdigest()] * 2",
    )
    project = run_notebook(nb, tmp_path, inventory)
    cell = nb.cells[1]
    assert errors(cell) == [], cell.outputs
    assert cell.outputs[-1]["data"]["text/plain"] == "True", cell.outputs
    (record,) = [json.loads(p.read_text()) for p in (project / "runs").glob("*/run.json")]
    return cell, record


def test_a_large_value_the_function_captured_reaches_the_ranks_by_one_broadcast(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    cell, record = run_blob_call(tmp_path, inventory, "", "")
    assert streams(cell, "stderr") == ""  # no node was cut out of the broadcast
    assert record["broadcast"] == ["node1", "node2"], record
    assert_nothing_left(cluster, record["run_id"])


def test_a_restart_finds_the_large_call_on_the_nodes_and_does_not_send_it_again(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    # the first attempt fails on every rank; the second finds the pickled call (27 MiB)
    # that the first one's broadcast left in the run folder, checked by sha256 there
    fails_first = (
        "    if os.environ['CPUACCEL_RESTART'] == '0':\n"
        "        raise RuntimeError('the first attempt fails')\n"
    )
    restarts = ", max_restarts=1, restart_delay=0"
    cell, record = run_blob_call(tmp_path, inventory, fails_first, restarts)
    assert record["broadcast"] == ["node1", "node2"], record  # the first attempt's
    assert record["large_files_held"] == ["node1", "node2"], record  # the second's
    assert "broadcast: " not in streams(cell, "stderr")  # no node was cut out
    assert_nothing_left(cluster, record["run_id"])


def test_a_rank_that_raises_is_the_cells_error_with_its_traceback(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    nb = notebook_of(
        SETUP,
        "def check(limit):\n"
        "    rank, _, _ = where()\n"
        "    if rank == 1:\n"
        "        raise ValueError(f'rank {rank} is over the limit {limit}')\n"
        "    return rank\n"
        "cpuaccel.notebook.launch(check, 7, nodes=2, ppn=1)",
    )
    run_notebook(nb, tmp_path, inventory)
    cell = nb.cells[1]
    [error] = errors(cell)
    assert error.ename == "RankError"
    assert "rank 1 on node2" in error.evalue
    assert "Traceback (most recent call last):" in error.evalue
    assert ", in check" in error.evalue
    # The cell's own source line, which the node did not have, under its frame.
    assert "\n    raise ValueError(f'rank {rank} is over the limit {limit}')\n" in error.evalue
    assert error.evalue.endswith("ValueError: rank 1 is over the limit 7")
    # The rank's own lines were shown as they came, labelled.
    assert "[rank 1 node2] ValueError: rank 1 is over the limit 7" in streams(cell, "stderr")


# The hostile test's rank-1 swap, defined in the kernel as the user's cell would.
SWAPS = inspect.getsource(swapped_on_rank_one) + "\n"


def test_a_result_swapped_on_its_node_is_refused_never_unpickled(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    # rank 1's result file on node2 is replaced, after the rank wrote it, by a pickle
    # that would create the marker wherever it is loaded: the kernel refuses it unread
    marker = tmp_path / "unpickled"
    call = f"cpuaccel.notebook.launch(swapped_on_rank_one, {str(marker)!r}, nodes=2, ppn=1"
    nb = notebook_of(
        SETUP,
        SWAPS + call + ", gather=True)",
        call + ")",
    )
    run_notebook(nb, tmp_path, inventory)
    [error] = errors(nb.cells[1])
    assert error.ename == "ResultRefused", error
    assert error.evalue.startswith("the value of rank 1 on node2 (run "), error.evalue
    assert "refused, not unpickled" in error.evalue
    assert not marker.exists()
    assert errors(nb.cells[2]) == [], nb.cells[2].outputs  # rank 0's own value is good
    assert nb.cells[2].outputs[-1]["data"]["text/plain"] == "0"
    assert not marker.exists()


def test_an_interrupt_ends_the_job_on_every_node(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    flags = tmp_path / "flags"  # every node sees this folder
    flags.mkdir()
    nb = notebook_of(
        SETUP,
        "def sleeper(flags):\n"
        "    import os, pathlib, time\n"
        "    run_id = os.environ['CPUACCEL_RUN_ID']\n"
        "    pathlib.Path(flags, f\"started-{os.environ['RANK']}\").write_text(run_id)\n"
        "    time.sleep(120)\n"
        f"cpuaccel.notebook.launch(sleeper, {str(flags)!r}, nodes=2, ppn=2)",
        "'the kernel goes on'",
    )
    project = make_project(tmp_path, {"cpuaccel.yaml": PROJECT_FILE})
    client = client_for(nb, project, tmp_path)

    async def scenario() -> tuple[str, list[str], float]:
        async with client.async_setup_kernel(env=kernel_env(inventory)):
            await client.async_execute_cell(nb.cells[0], 0)
            cell = asyncio.ensure_future(client.async_execute_cell(nb.cells[1], 1))
            deadline = time.monotonic() + 90
            while len(list(flags.glob("started-*"))) < 4:
                assert not cell.done(), nb.cells[1].outputs
                assert time.monotonic() < deadline, nb.cells[1].outputs
                await asyncio.sleep(0.1)
            run_id = (flags / "started-0").read_text()
            running = [p for n in ("node1", "node2") for p in job_processes(cluster, n, run_id)]
            sent = time.monotonic()
            await client.km.interrupt_kernel()
            await asyncio.wait_for(cell, 60)
            ended = time.monotonic() - sent
            await client.async_execute_cell(nb.cells[2], 2)
            return run_id, running, ended

    run_id, running, ended = asyncio.run(scenario())
    assert running, "no process of the job was found before the interrupt"
    [error] = errors(nb.cells[1])
    assert error.ename == "KeyboardInterrupt"
    assert ended < 30, ended
    assert nb.cells[2].outputs[-1]["data"]["text/plain"] == "'the kernel goes on'"
    assert_nothing_left(cluster, run_id)
    record = json.loads((project / "runs" / run_id / "run.json").read_text())
    assert record["reason"] == "interrupted", record


def test_the_example_notebook_runs_top_to_bottom_across_two_nodes(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    project = make_project(tmp_path, {"cpuaccel.yaml": PROJECT_FILE})
    for name in ("notebook.ipynb", "train.py"):
        shutil.copy(REPO / "examples" / name, project / name)
    nb = nbformat.read(project / "notebook.ipynb", as_version=4)
    client = client_for(nb, project, tmp_path)
    client.allow_errors = False  # any error in any cell fails the run
    client.execute(env=kernel_env(inventory, NODES="2"))
    code = [c for c in nb.cells if c.cell_type == "code"]
    printed = "".join(streams(c, "stdout") for c in code)
    assert "40 steps on 4 ranks" in printed, printed
    losses = [float(line.split()[-1]) for line in printed.splitlines() if line.startswith("step")]
    assert len(losses) == 4 and losses[-1] < 5.0, printed  # 5.55: a uniform guess
    plots = [o for o in code[-1].outputs if "image/png" in o.get("data", {})]
    assert len(plots) == 1, code[-1].outputs
