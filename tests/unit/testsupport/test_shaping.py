"""The test bed's link shaping (testsupport/shaping.py) without root: the tc argv
it builds for each side of each link, and that every qdisc it set is removed again when
the block raises."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from cpuaccel.testbed.cluster import Cluster
from testsupport.shaping import links, rate_bits, shaped


def test_each_side_of_each_link_gets_the_token_bucket() -> None:
    sides = links(61, [1, 2])
    assert [str(link) for link in sides] == [
        "cpxl61br", "cpxl61v1", "eth0 in cpxl61-node1", "cpxl61v2", "eth0 in cpxl61-node2",
    ]  # fmt: skip
    tbf = ["tbf", "rate", "200mbit", "burst", "256kb", "latency", "50ms"]
    bridge = ["tc", "qdisc", "replace", "dev", "cpxl61br", "root", *tbf]
    assert sides[0].shape_argv("200mbit") == bridge
    assert sides[2].shape_argv("200mbit") == [
        "tc", "-n", "cpxl61-node1", "qdisc", "replace", "dev", "eth0", "root", *tbf,
    ]  # fmt: skip
    unshape = ["tc", "-n", "cpxl61-node1", "qdisc", "del", "dev", "eth0", "root"]
    assert sides[2].unshape_argv() == unshape


def test_rate_is_one_of_tcs_units() -> None:
    assert rate_bits("200mbit") == 200e6
    assert rate_bits("25mbps") == 200e6
    for bad in ("200", "200mb", "fast", "0mbit"):
        with pytest.raises(ValueError):
            rate_bits(bad)


def test_qdiscs_are_removed_when_the_block_raises(tmp_path: Path) -> None:
    cluster = Cluster(2, cluster_id=61, state_root=tmp_path)  # never brought up
    calls: list[list[str]] = []

    def run(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        calls.append(list(argv))
        return subprocess.CompletedProcess(list(argv), 0, "", "")

    with pytest.raises(KeyboardInterrupt), shaped(cluster, "200mbit", run=run):
        raise KeyboardInterrupt

    def where(argv: list[str]) -> tuple[str | None, str]:
        return (argv[2] if argv[1] == "-n" else None, argv[argv.index("dev") + 1])

    verbs = [argv[argv.index("qdisc") + 1] for argv in calls]
    assert verbs == ["replace"] * 5 + ["del"] * 5
    assert [where(argv) for argv in calls[:5]] == [where(argv) for argv in calls[5:]]
