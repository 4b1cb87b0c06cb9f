"""net.json read and checked (cpuaccel.netbench.results): the rates computed from the
ranks' seconds, as nccl-tests and the Intel MPI Benchmarks compute them, and a file
that is not the job's refused with one line naming what is wrong."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from cpuaccel.netbench.results import NetbenchError, algbw, busbw, link_share, parse


def net(world: int = 3) -> dict[str, Any]:
    """A net.json of ``world`` ranks as the job writes it."""
    later = [[2e-4, 2e-4, 0.002]] * (world - 2)  # the third rank's medians on
    return {
        "version": 1,
        "world": world,
        "nodes": [
            {
                "host": f"node{r + 1}",
                "address": f"192.0.2.{r + 1}",
                "interface": "eth0",
                "speed_mbit": 10000 if r else 25000,
            }
            for r in range(world)
        ],
        "latency_bytes": 8,
        "pair_bytes": 16 * 1024 * 1024,
        # [a, b, half round trip of 8 B, half round trip of 16 MiB]
        "pairs": [
            [a, b, 50e-6 + a * 1e-6, 0.016777216 * (1 + b)]
            for a in range(world)
            for b in range(a + 1, world)
        ],
        "sizes": [8, 32, 1048576],
        "allreduce": {
            "gloo": {"seconds": [[1e-4, 2e-4, 0.001], [3e-4, 2e-4, 0.003], *later]},
            "mpi": {"skipped": "node2: mpi4py does not import"},
        },
    }


def test_busbw_is_algbw_times_2_n_minus_1_over_n() -> None:
    # 64 MiB in 10 ms: 6.71 GB/s algorithm bandwidth
    assert algbw(64 * 2**20, 0.01) == pytest.approx(6.7108864)
    assert busbw(64 * 2**20, 0.01, 2) == pytest.approx(6.7108864)  # 2(n-1)/n = 1
    assert busbw(64 * 2**20, 0.01, 4) == pytest.approx(6.7108864 * 1.5)
    assert busbw(64 * 2**20, 0.01, 16) == pytest.approx(6.7108864 * 1.875)


def test_link_share_compares_bytes_with_the_interfaces_megabits() -> None:
    assert link_share(1.25, 10000) == pytest.approx(1.0)  # 1.25 GB/s is 10 Gbit/s
    assert link_share(0.1, 1000) == pytest.approx(0.8)
    assert link_share(1.0, None) is None


def test_pairs_give_latency_and_bandwidth_as_pingpong_does() -> None:
    report = parse(net(3))
    assert [p.label() for p in report.pairs] == [
        "node1 - node2", "node1 - node3", "node2 - node3",
    ]  # fmt: skip
    first = report.pairs[0]
    assert first.latency_s == pytest.approx(50e-6)
    # 16 MiB in 0.0336 s one way: 0.5 GB/s, against the slower end's 10 Gbit/s
    assert first.bandwidth == pytest.approx(16 * 2**20 / 0.033554432 / 1e9)
    assert first.bandwidth == pytest.approx(0.5)
    assert first.speed_mbit == 10000
    assert first.share == pytest.approx(0.4)
    assert report.slowest is not None and report.slowest.label() == "node1 - node3"


def test_an_unknown_speed_at_either_end_leaves_the_share_unknown() -> None:
    data = net(2)
    data["nodes"][1]["speed_mbit"] = None
    (pair,) = parse(data).pairs
    assert pair.speed_mbit is None and pair.share is None


def test_the_sweep_averages_the_ranks_medians() -> None:
    report = parse(net(3))
    gloo, mpi = report.sweeps
    assert mpi.backend == "mpi" and mpi.skipped == "node2: mpi4py does not import"
    assert [p.size for p in gloo.points] == [8, 32, 1048576]
    assert gloo.points[0].seconds == pytest.approx(2e-4)  # (1 + 3 + 2) / 3 x 1e-4
    last = gloo.points[2]
    assert last.seconds == pytest.approx(0.002)
    assert last.algbw == pytest.approx(1048576 / 0.002 / 1e9)  # 0.524 GB/s
    assert last.busbw == pytest.approx(0.524288 * 4 / 3)


def test_to_json_holds_the_rates() -> None:
    out = parse(net(2)).to_json()
    assert out["slowest"]["a"] == "node1" and out["slowest"]["gbit_s"] == pytest.approx(4.0)
    point = out["allreduce"][0]["points"][0]
    assert point == {
        "bytes": 8, "time_us": pytest.approx(200.0), "algbw_gbs": pytest.approx(4e-5),
        "busbw_gbs": pytest.approx(4e-5),
    }  # fmt: skip


def _broken(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    data = copy.deepcopy(net(2))
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return data


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        (("world",), 1, "world"),
        (("world",), True, "world"),
        (("nodes", 0, "host"), "node\x1b[2J", "nodes[0].host"),
        (("nodes", 1, "speed_mbit"), -1, "nodes[1].speed_mbit"),
        (("pairs", 0, 2), float("nan"), "pairs[0]'s latency"),
        (("pairs", 0, 3), 0, "pairs[0]'s bandwidth time"),
        (("pairs", 0, 1), 0, "pairs[0]'s second rank"),
        (("pairs",), [], "the pairs measured"),
        (("sizes",), [32, 8, 1048576], "sizes"),
        (("allreduce", "gloo", "seconds", 1), [1e-4, 2e-4], "allreduce.gloo.seconds[1]"),
        (("allreduce", "gloo", "seconds", 0, 2), "fast", "allreduce.gloo.seconds[0][2]"),
        (("allreduce", "ccl"), {"skipped": "x"}, "allreduce"),
    ],
)
def test_a_bad_value_is_one_line_naming_it(path: tuple[Any, ...], value: Any, named: str) -> None:
    with pytest.raises(NetbenchError) as caught:
        parse(_broken(path, value))
    message = caught.value.message
    assert message.startswith(f"net.json: {named} is "), message
    assert "\n" not in message


def test_another_version_asks_for_the_same_cpuaccel() -> None:
    with pytest.raises(NetbenchError, match="version 2, not 1") as caught:
        parse(_broken(("version",), 2))
    assert "same version" in str(caught.value.hint)


def test_a_pair_measured_twice_is_refused() -> None:
    data = net(2)
    data["pairs"].append(list(data["pairs"][0]))
    with pytest.raises(NetbenchError, match="a second measure of ranks 0 and 1"):
        parse(data)
