"""`cpuaccel bench net` on 2 namespace nodes, for real: a job of one rank a node plays
ping-pong between the nodes and sweeps allreduce over sizes with gloo and with MPI
(Intel MPI through mpi4py, as the nodes' venv has it); the tables name the pair and
every size with positive rates, and --json holds the same."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from cpuaccel.testbed.cluster import Cluster
from tests.cluster.fixtures import TREE, master_port
from testsupport.command import cpuaccel as cpuaccel_command
from testsupport.runs import ENV, make_project

pytestmark = pytest.mark.cluster

SIZES = ["8 B", "32 B", "128 B", "512 B", "1000 B"]  # --max-size 1000: 8 x 4^k, then 1000


def _rows(lines: list[str], first: str) -> list[list[str]]:
    """The table under the header line that starts with ``first``, split on 2+ spaces."""
    import re

    start = next(i for i, line in enumerate(lines) if line.startswith(first))
    rows = []
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        rows.append(re.split(r"\s{2,}", line.strip()))
    return rows


def test_bench_net_measures_each_pair_and_each_size(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    project = make_project(tmp_path, {"README": "a project\n"})
    started = time.monotonic()
    result = cpuaccel_command(
        "bench", "net", "-i", inventory, "--nodes", "2", "--master-port", master_port(),
        *TREE, "--max-size", "1000", "--pair-size", "64K", "--iters", "5", "--timeout", "120",
        cwd=project, env=ENV, timeout=180,
    )  # fmt: skip
    seconds = time.monotonic() - started
    assert result.returncode == 0, result
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stdout.splitlines()
    (pair,) = _rows(lines, "pair")
    assert pair[0] == "node1 - node2", lines
    latency, bandwidth, gbit = float(pair[1]), float(pair[2]), float(pair[3])
    assert latency > 0 and bandwidth > 0 and gbit == pytest.approx(bandwidth * 8, abs=0.011)
    sweep = _rows(lines, "backend")
    backends = sorted({row[0] for row in sweep})
    assert backends == ["gloo", "mpi"], sweep
    for backend in backends:
        rows = [row for row in sweep if row[0] == backend]
        assert [row[1] for row in rows] == SIZES, rows
        for row in rows:
            time_us, algbw, busbw = (float(v) for v in row[2:5])
            assert time_us > 0 and algbw >= 0 and busbw == pytest.approx(algbw, abs=0.011), row
    assert any(line.startswith("slowest link: node1 - node2, ") for line in lines), lines
    (run_dir,) = (project / "runs").iterdir()
    kept = json.loads((run_dir / "net.json").read_text())
    assert kept["world"] == 2 and [n["host"] for n in kept["nodes"]] == ["node1", "node2"]
    print(f"bench net on 2 nodes: {seconds:.1f} s\n{result.stdout}")


def test_bench_net_json_gives_the_rates(cluster: Cluster, inventory: str, tmp_path: Path) -> None:
    project = make_project(tmp_path, {"README": "a project\n"})
    result = cpuaccel_command(
        "bench", "net", "-i", inventory, "--nodes", "2", "--master-port", master_port(),
        *TREE, "--max-size", "32", "--pair-size", "1K", "--iters", "3", "--backend", "gloo",
        "--json", cwd=project, env=ENV, timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result
    report = json.loads(result.stdout)
    (pair,) = report["pairs"]
    assert (pair["a"], pair["b"]) == ("node1", "node2")
    assert pair["latency_us"] > 0 and pair["bandwidth_gbs"] > 0
    (sweep,) = report["allreduce"]
    assert sweep["backend"] == "gloo" and sweep["skipped"] is None
    points = sweep["points"]
    assert [p["bytes"] for p in points] == [8, 32]
    for p in points:  # 2 ranks: busbw = algbw x 2(2-1)/2 = algbw
        assert p["time_us"] > 0 and p["busbw_gbs"] == pytest.approx(p["algbw_gbs"])
        assert p["algbw_gbs"] == pytest.approx(p["bytes"] / (p["time_us"] * 1e-6) / 1e9)
    assert report["slowest"]["a"] == "node1"


def test_bench_net_refuses_one_node(cluster: Cluster, inventory: str, tmp_path: Path) -> None:
    project = make_project(tmp_path, {"README": "a project\n"})
    result = cpuaccel_command(
        "bench", "net", "-i", inventory, "--nodes", "1", cwd=project, env=ENV, timeout=60
    )
    assert result.returncode == 64, result
    assert "choose 2 nodes or more" in result.stderr
    assert not (project / "runs").exists()
