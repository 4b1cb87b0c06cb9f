"""The rank side's pure parts (cpuaccel.netbench.job): the rounds of pairs, the sweep's
sizes and iterations, and the interface's speed as /sys reports it. The measures
themselves run on the cluster (tests/cluster/test_bench_net.py)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from cpuaccel.netbench.job import (
    BUDGET,
    MIN_ITERS,
    interface_of,
    interface_speed,
    iterations,
    launched_by_mpi,
    rounds,
    sweep_sizes,
)


@pytest.mark.parametrize("count", [2, 3, 4, 5, 8, 16, 17])
def test_rounds_hold_every_pair_once_and_each_node_once_a_round(count: int) -> None:
    found = rounds(count)
    assert len(found) == (count - 1 if count % 2 == 0 else count)
    pairs = [pair for pairing in found for pair in pairing]
    assert sorted(pairs) == list(itertools.combinations(range(count), 2))
    for pairing in found:
        nodes = [n for pair in pairing for n in pair]
        assert len(nodes) == len(set(nodes))
        assert len(pairing) == count // 2


def test_rounds_of_four() -> None:
    assert rounds(4) == [[(0, 3), (1, 2)], [(0, 2), (1, 3)], [(0, 1), (2, 3)]]
    assert rounds(2) == [[(0, 1)]]


def test_sizes_go_by_powers_of_4_and_end_at_the_largest() -> None:
    assert sweep_sizes(64 * 2**20) == [8 * 4**k for k in range(12)] + [64 * 2**20]
    assert sweep_sizes(32 * 2**20) == [8 * 4**k for k in range(12)]  # 32 MiB is 8 x 4^11
    assert sweep_sizes(1000) == [8, 32, 128, 512, 1000]
    assert sweep_sizes(1001) == [8, 32, 128, 512, 1000]  # whole float32s
    assert sweep_sizes(8) == [8]


def test_iterations_shrink_for_large_messages() -> None:
    assert iterations(8, 20) == 20
    assert iterations(64 * 2**20, 20) == BUDGET // (64 * 2**20) == 8
    assert iterations(2**30, 20) == MIN_ITERS


def test_speed_is_read_from_sys_and_unknown_when_the_kernel_does_not_know(
    tmp_path: Path,
) -> None:
    for name, text in (("eth0", "25000\n"), ("veth1", "-1\n"), ("odd", "fast\n")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "speed").write_text(text)
    (tmp_path / "lo").mkdir()  # no speed file at all
    assert interface_speed("eth0", str(tmp_path)) == 25000
    assert interface_speed("veth1", str(tmp_path)) is None
    assert interface_speed("odd", str(tmp_path)) is None
    assert interface_speed("lo", str(tmp_path)) is None
    assert interface_speed(None, str(tmp_path)) is None


def test_loopbacks_address_is_on_lo() -> None:
    assert interface_of("127.0.0.1") == "lo"
    assert interface_of("192.0.2.250") is None  # nobody's address here
    assert interface_of("") is None


def test_mpi_launch_is_known_by_its_rank_variable() -> None:
    assert launched_by_mpi({"PMI_RANK": "0"})
    assert launched_by_mpi({"OMPI_COMM_WORLD_RANK": "1"})
    assert not launched_by_mpi({"RANK": "0", "SLURM_PROCID": "0"})
