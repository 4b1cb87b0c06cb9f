"""ps and check on a narrow terminal: whole columns are left out, the run id is never
cut; check says what CORES and SOCK/NUMA count."""

from __future__ import annotations

import json
import os
import select
import time
from pathlib import Path

import pytest
from rich.console import Console

from cpuaccel.cli.check import print_report
from cpuaccel.executor import HostResult, Status
from cpuaccel.inventory.host import Host
from testsupport.command import inherited_env, start_cpuaccel

RUN_ID = "20261202-005924-050865"


def on_terminal(args: list[str], cwd: Path, columns: int) -> tuple[int, str]:
    """`cpuaccel ARGS` on a pty COLUMNS wide: its exit code and what it showed."""
    master, slave = os.openpty()
    env = inherited_env(COLUMNS=str(columns), LINES="40", TERM="dumb")
    proc = start_cpuaccel(*args, cwd=cwd, env=env, stdin=slave, stdout=slave, stderr=slave)
    os.close(slave)
    seen = b""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                chunk = b""
            if not chunk:
                break
            seen += chunk
        elif proc.poll() is not None:
            break
    os.close(master)
    return proc.wait(timeout=30), seen.decode(errors="replace").replace("\r\n", "\n")


@pytest.fixture
def project(tmp_path: Path) -> Path:
    folder = tmp_path / "runs" / RUN_ID
    folder.mkdir(parents=True)
    record = {
        "run_id": RUN_ID,
        "script": "examples/a_rather_long_training_script_name.py",
        "hosts": ["localhost"],
        "ppn": 2,
        "world": 2,
        "exit_code": 0,
        "reason": "completed",
        "started": 1764636000,
        "ended": 1764636100,
    }
    (folder / "run.json").write_text(json.dumps(record))
    (folder / "metrics.jsonl").write_text('{"step": 200, "loss": 2.3456}\n')
    return tmp_path


@pytest.mark.parametrize("columns", [40, 60, 80, 200])
def test_ps_never_cuts_the_run_id(project: Path, columns: int) -> None:
    code, shown = on_terminal(["ps"], project, columns)
    assert code == 0, shown
    lines = shown.splitlines()
    assert lines[0].split()[0] == "ID"
    assert lines[1].split()[0] == RUN_ID, shown
    assert "…" not in shown
    assert all(len(line) <= columns for line in lines[:2]), shown  # the note wraps
    if columns < 100:
        assert lines[2].startswith("(STARTED"), shown
        assert lines[2].endswith(
            f"left out at {columns} columns; a wider terminal or --json shows them)"
        )
    else:
        assert "left out" not in shown


def test_ps_keeps_the_state_at_the_narrowest(project: Path) -> None:
    code, shown = on_terminal(["ps"], project, 40)
    assert code == 0
    header, first = shown.splitlines()[:2]
    assert header.split() == ["ID", "STATE"], shown
    assert first.split() == [RUN_ID, "succeeded"]


def _facts(name: str) -> HostResult:
    cpu = {"physical_cores": 2, "logical_cpus": 4, "sockets": 1, "numa_nodes": 1, "isa": {}}
    facts = {"hostname": name, "python": {"version": "3.12.3"}, "cpu": cpu, "memory": {}}
    return HostResult(Host(name), Status.OK, facts)


def test_check_says_what_cores_counts() -> None:
    console = Console(width=120, record=True, color_system=None)
    print_report([_facts("node1")], [], console)
    lines = console.export_text().splitlines()
    assert "CORES" in lines[0] and "2/4" in lines[1]
    assert lines[2] == "CORES: physical cores/logical CPUs; SOCK/NUMA: sockets/NUMA nodes"


def test_check_leaves_the_legend_out_with_its_columns() -> None:
    console = Console(width=50, record=True, color_system=None)
    print_report([_facts("node1")], [], console)
    text = console.export_text()
    assert "CORES:" not in text and "SOCK/NUMA:" not in text
    assert "(MEM, SOCK/NUMA, CORES" in text
