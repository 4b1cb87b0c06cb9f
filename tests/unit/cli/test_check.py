"""`cpuaccel check`'s table: at 80 and 120 columns host names and versions are never cut.
The gathering and its connections: tests/unit/api/test_checking.py."""

from __future__ import annotations

from typing import Any

import pytest
from rich.console import Console

from cpuaccel.cli.check import COLUMNS, DROP_ORDER, _width, print_report
from cpuaccel.executor import HostResult, Status
from cpuaccel.facts.problems import find_problems
from cpuaccel.inventory.host import Host

LONG = "node-with-a-long-name-01.cluster.example"
TORCH = "2.13.0+cpu"
CPUACCEL = "0.1.0"


def facts(hostname: str) -> dict[str, Any]:
    return {
        "hostname": hostname,
        "python": {"version": "3.11.2"},
        "packages": {"torch": TORCH, "cpuaccel": CPUACCEL},
        "mpi": {"launchers": [{"flavour": "mpich"}]},
        "cpu": {
            "physical_cores": 64,
            "logical_cpus": 128,
            "sockets": 2,
            "numa_nodes": 8,
            "isa": {"avx512_bf16": True},
        },
        "memory": {"total": 512 * 2**30},
    }


def results() -> list[HostResult[dict[str, Any]]]:
    return [
        HostResult(Host(LONG), Status.OK, facts(LONG)),
        HostResult(Host("node02"), Status.OK, facts("node02.cluster.example")),
        HostResult(
            Host("node-unreachable-03.cluster.example"),
            Status.UNREACHABLE,
            error="connection refused on port 22 (is sshd running?)",
            hint="start sshd on the node",
        ),
    ]


def render(width: int) -> str:
    console = Console(width=width, record=True, color_system=None, highlight=False)
    rows = results()
    print_report(rows, find_problems(rows), console)
    return console.export_text()


@pytest.mark.parametrize("width", [80, 120])
def test_host_names_and_versions_are_whole(width: int) -> None:
    text = render(width)
    assert "…" not in text
    assert all(len(line) <= width for line in text.splitlines())
    for whole in (LONG, TORCH, CPUACCEL, "3.11.2"):
        assert whole in text, f"{whole!r} cut at {width} columns:\n{text}"
    header = text.splitlines()[0].split()
    assert [c for c in header if c not in DROP_ORDER] == [
        "HOST",
        "STATUS",
        "PYTHON",
        "TORCH",
        "CPUACCEL",
    ]
    # One line a host: nothing of the host or its versions wrapped onto a second line.
    assert any(
        line.startswith(LONG) and TORCH in line and CPUACCEL in line for line in text.splitlines()
    )


def test_at_80_columns_less_important_columns_go_first_and_are_named() -> None:
    text = render(80)
    header = text.splitlines()[0].split()
    dropped = [c for c in DROP_ORDER if c not in header]
    assert dropped and dropped == list(DROP_ORDER[: len(dropped)])
    assert f"({', '.join(dropped)} left out at 80 columns" in text


def test_at_120_columns_the_hostname_stays_whole() -> None:
    text = render(120)
    assert "HOSTNAME" in text.splitlines()[0]
    node02 = next(line for line in text.splitlines() if line.startswith("node02 "))
    assert node02.split()[:3] == ["node02", "ok", "node02.cluster.example"]
    # A node whose hostname is its inventory name shows "=".
    assert next(line for line in text.splitlines() if line.startswith(LONG)).split()[2] == "="


def test_at_a_wide_terminal_every_column_is_shown() -> None:
    assert COLUMNS[-5:] == ("MPI", "CORES", "SOCK/NUMA", "BF16", "MEM")
    text = render(250)
    header = text.splitlines()[0].split()
    assert tuple(header) == COLUMNS
    assert "left out" not in text
    assert "512G" in text and "64/128" in text


@pytest.mark.parametrize("width", [80, 120])
def test_unreachable_host_error_is_under_the_table(width: int) -> None:
    lines = render(width).splitlines()
    row = next(line for line in lines if line.startswith("node-unreachable-03"))
    assert "unreachable" in row and "refused" not in row
    below = lines.index(row) + 1
    error = next(i for i, line in enumerate(lines) if "connection refused on port 22" in line)
    assert error > below
    assert (
        lines[error].startswith("error") and "node-unreachable-03.cluster.example" in lines[error]
    )
    assert "fix: start sshd on the node" in "".join(lines[error:])


def test_a_name_wider_than_the_terminal_wraps_whole() -> None:
    name = "n" * 70 + ".example"
    console = Console(width=80, record=True, color_system=None)
    rows = [HostResult(Host(name), Status.OK, facts(name))]
    print_report(rows, [], console)
    text = console.export_text()
    assert "…" not in text
    lines = text.splitlines()
    assert lines[1].split()[0] + lines[2].strip() == name


def test_markup_in_a_host_name_is_shown_as_typed() -> None:
    name = "node[01]"
    console = Console(width=120, record=True, color_system=None)
    print_report([HostResult(Host(name), Status.OK, facts("[bold]x"))], [], console)
    text = console.export_text()
    assert "node[01]" in text and "[bold]x" in text


def test_an_emoji_code_in_a_name_is_measured_as_printed() -> None:
    """ui's consoles print `:smile:` as typed (emoji=False): the table measures it so."""
    assert _width(["HOST"], [{"HOST": ":smile::smile:"}], 1) == len(":smile::smile:")
