"""bench net's tables (cpuaccel.netbench.table) and sizes (cpuaccel.netbench.sizes):
real numbers through the report, as the command prints them."""

from __future__ import annotations

import pytest

from cpuaccel.netbench.results import parse
from cpuaccel.netbench.sizes import parse_size, size_text
from cpuaccel.netbench.table import rate_text, report_lines, slowest_line
from tests.unit.netbench.test_results import net


@pytest.mark.parametrize(
    ("text", "size"),
    [("8", 8), ("512B", 512), ("2k", 2048), ("16KiB", 16384), ("64M", 67108864),
     ("64 MB", 67108864), ("1G", 2**30), ("1GiB", 2**30)],
)  # fmt: skip
def test_sizes_read_in_binary_units(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "M", "1.5M", "-8", "8T", "8 bytes", "1" * 13])
def test_a_size_that_is_none_is_none(text: str) -> None:
    assert parse_size(text) is None


def test_sizes_print_in_whole_units() -> None:
    assert [size_text(s) for s in (8, 1000, 2048, 3 * 2**20, 2**30, 2**20 + 4)] == [
        "8 B", "1000 B", "2 KiB", "3 MiB", "1 GiB", "1048580 B",
    ]  # fmt: skip


def test_rates_keep_three_digits_below_one() -> None:
    assert [rate_text(v) for v in (12.345, 1.0, 0.5243, 0.0000242, 0.0)] == [
        "12.35", "1.00", "0.524", "0.0000242", "0.00",
    ]  # fmt: skip


def test_the_report_prints_nodes_pairs_sweep_and_slowest_link() -> None:
    lines = report_lines(parse(net(3)))
    text = "\n".join(lines)
    assert lines[0].split() == ["rank", "node", "address", "interface", "speed"]
    assert lines[1].split() == ["0", "node1", "192.0.2.1", "eth0", "25", "Gbit/s"]
    pair_header = lines.index(next(line for line in lines if line.startswith("pair")))
    assert lines[pair_header + 1].split() == ["node1", "-", "node2", "50.0", "0.500", "4.00", "40%"]
    rows = [line.split() for line in lines if line.startswith("gloo")]
    assert rows == [
        ["gloo", "8", "B", "200.0", "0.0000400", "0.0000533"],  # 8 B in 200 us; x 4/3
        ["gloo", "32", "B", "200.0", "0.000160", "0.000213"],
        ["gloo", "1", "MiB", "2000.0", "0.524", "0.699"],
    ]
    assert "mpi: not measured: node2: mpi4py does not import" in text
    assert lines[-1] == (
        "slowest link: node1 - node3, 0.333 GB/s (2.67 Gbit/s, 27% of its 10 Gbit/s interface), "
        "latency 50.0 us"
    )


def test_the_slowest_link_says_when_the_interface_speed_is_unknown() -> None:
    data = net(2)
    data["nodes"][0]["speed_mbit"] = None
    line = slowest_line(parse(data).slowest)
    assert "0.500 GB/s (4.00 Gbit/s, the interface's speed unknown)" in line
