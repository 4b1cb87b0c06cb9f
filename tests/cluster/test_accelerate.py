"""Unmodified Hugging Face Accelerate scripts under `cpuaccel run`, across two real nodes.

The script (examples/accelerate_train.py) never imports cpuaccel: everything Accelerate
needs to see a 4-process MULTI_CPU job must come from the environment `cpuaccel run`
and its worker give every rank. Run as a user runs it: a subprocess in a project folder
of its own holding a copy of the script, on the session's namespace cluster. A variant
with a plain ``Accelerator()`` (no ``cpu=True``) shows what else a launcher must export.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from cpuaccel.testbed.cluster import Cluster
from tests.cluster.fixtures import REPO
from testsupport.runs import LABELLED, Run, cpuaccel_run

pytestmark = pytest.mark.cluster

EXAMPLE = REPO / "examples" / "accelerate_train.py"


def json_lines(run: Run) -> dict[int, tuple[str, dict[str, Any]]]:
    """rank -> (host of its label, the JSON it printed), from the labelled stdout."""
    found: dict[int, tuple[str, dict[str, Any]]] = {}
    for line in run.stdout.splitlines():
        match = LABELLED.match(line)
        assert match, f"unlabelled line {line!r}\n{run}"
        text = match[3]
        if text.startswith("{"):
            found[int(match[1])] = (match[2], json.loads(text))
    return found


def make_project(tmp_path: Path, script: str) -> Path:
    project = tmp_path / f"accel-{uuid.uuid4().hex[:10]}"
    project.mkdir()
    (project / "accelerate_train.py").write_text(script)
    return project


def run_on_two_nodes(cluster: Cluster, project: Path, port: int, *env: str) -> Run:
    """2 nodes x 2 ranks. Each test its own master port: the TCPStore of a job just ended
    leaves connections to it in TIME_WAIT for a minute, and `cpuaccel run`'s preflight
    (which binds without SO_REUSEADDR) reports the port as in use meanwhile."""
    options = [arg for item in env for arg in ("--env", item)]
    return cpuaccel_run(
        project, "-i", str(cluster.inventory_path), "--nodes", "2", "--ppn", "2",
        "--master-port", str(port), *options, "accelerate_train.py",
    )  # fmt: skip


def ran_on_four_ranks(proc: Run) -> dict[int, dict[str, Any]]:
    """What each rank printed, after checking the job ended well (a plain failure if not)."""
    report = repr(proc)
    if proc.code != 0:
        pytest.fail(f"the job failed: {report}")
    ranks = json_lines(proc)
    if sorted(ranks) != [0, 1, 2, 3]:
        pytest.fail(f"expected JSON from ranks 0..3: {report}")
    if "completed: 4 rank(s) on 2 node(s)" not in proc.stderr:
        pytest.fail(f"not completed on 2 nodes: {report}")
    for rank, (label_host, seen) in ranks.items():
        expected_host = ("node1", "node2")[rank // 2]  # --ppn 2: ranks 0,1 on node1
        if not label_host == seen["hostname"] == expected_host:
            pytest.fail(f"rank {rank} ran on {label_host}/{seen['hostname']}: {report}")
    return {rank: seen for rank, (_, seen) in ranks.items()}


def assert_one_multi_cpu_job(ranks: dict[int, dict[str, Any]]) -> None:
    """Accelerate saw one job of 4 processes, 2 per node, and trained it as one."""
    for rank, seen in ranks.items():
        assert seen["distributed_type"] == "MULTI_CPU", ranks
        assert seen["num_processes"] == 4, ranks
        assert seen["process_index"] == rank, ranks
        assert seen["local_process_index"] == rank % 2, ranks
        assert seen["mixed_precision"] == "bf16", ranks
    for node in ("node1", "node2"):
        local = {seen["local_process_index"] for seen in ranks.values() if seen["hostname"] == node}
        assert local == {0, 1}, (node, ranks)
    # Gradients averaged over all four: the same parameters, and the same loss, everywhere.
    assert len({seen["checksum"] for seen in ranks.values()}) == 1, ranks
    assert len({seen["last_loss"] for seen in ranks.values()}) == 1, ranks


def test_accelerate_example_sees_multi_cpu_on_two_nodes(cluster: Cluster, tmp_path: Path) -> None:
    """Accelerator(cpu=True, ...): RANK/WORLD_SIZE/... from the worker are all it needs."""
    project = make_project(tmp_path, EXAMPLE.read_text())
    assert_one_multi_cpu_job(ran_on_four_ranks(run_on_two_nodes(cluster, project, 29611)))


# A script written for `accelerate launch --cpu` (or `accelerate config` with use_cpu)
# creates a plain Accelerator(): that launcher tells it to use the CPU by exporting
# ACCELERATE_USE_CPU=True. Without it, on a node with no accelerator, Accelerate
# decides DistributedType.NO, and every rank silently trains alone as process 0 of 1.
WITH_CPU_FLAG = 'Accelerator(cpu=True, mixed_precision="bf16")'
PLAIN = 'Accelerator(mixed_precision="bf16")'


def _plain_accelerator_script() -> str:
    script = EXAMPLE.read_text()
    assert WITH_CPU_FLAG in script
    return script.replace(WITH_CPU_FLAG, PLAIN)


@pytest.mark.parametrize(
    ("port", "env"),
    [
        pytest.param(29612, ["ACCELERATE_USE_CPU=true"], id="with-accelerate-use-cpu"),
        # cpuaccel run exports ACCELERATE_USE_CPU=true, as `accelerate launch --cpu` does.
        pytest.param(29613, [], id="under-cpuaccel-run"),
    ],
)
def test_plain_accelerator_is_multi_cpu(
    cluster: Cluster, tmp_path: Path, port: int, env: list[str]
) -> None:
    project = make_project(tmp_path, _plain_accelerator_script())
    assert_one_multi_cpu_job(ran_on_four_ranks(run_on_two_nodes(cluster, project, port, *env)))
