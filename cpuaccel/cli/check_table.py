"""``cpuaccel check``'s table: every host's facts, sized to the terminal.

What drift is about (the host's name, the Python, torch and cpuaccel versions) is never
cut: at a narrow width the less important columns are left out first, the node's own
hostname last (and which ones is said), and whatever is still too wide wraps onto a
second line rather than ending in an ellipsis: a value is shown whole or not at all.
An unreachable or failed host's error goes under the table (it is one of the
problems), where it has the whole width, not into a column.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from cpuaccel.cli.check_slurm import was_held
from cpuaccel.executor import HostResult, Status
from cpuaccel.facts.gather import Facts
from cpuaccel.facts.problems import ERROR, Problem, mpi_flavour
from cpuaccel.ui import escape

COLUMNS: tuple[str, ...] = ("HOST", "STATUS", "HOSTNAME", "PYTHON", "TORCH", "CPUACCEL")
COLUMNS += ("MPI", "CORES", "SOCK/NUMA", "BF16", "MEM")
# Left out in this order when the table is wider than the terminal: first what only
# matters for sizing a job (memory, topology), then the MPI and bf16 summaries (their
# problems are reported under the table anyway), then the node's own hostname (its
# resolution problems too; --json has it). The host and the versions always stay.
DROP_ORDER = ("MEM", "SOCK/NUMA", "CORES", "BF16", "MPI", "HOSTNAME")
# Slurm nodes (-i slurm:, --slurm) get SLURM, their state in Slurm, after STATUS: short,
# and never left out (it says why a node was not contacted).
SLURM_COLUMNS = (*COLUMNS[:2], "SLURM", *COLUMNS[2:])
RIGHT = frozenset({"CORES", "SOCK/NUMA", "BF16", "MEM"})
# The space between two columns: two, or one when that saves the host and versions from
# wrapping (rich's padding (0, 1), collapsed or not; pad_edge=False: none at the edges).
GAPS = (2, 1)


def _gib(value: Any) -> str:
    return f"{value / 2**30:.0f}G" if isinstance(value, (int, float)) else "-"


def row(r: HostResult[Facts]) -> dict[str, str]:
    """The cells of one host (rich markup, user text escaped)."""
    name = escape(r.host.name)
    slurm = r.host.vars.get("slurm_state")
    state = {"SLURM": escape(str(slurm).lower())} if slurm else {}
    if r.value is None:
        colour = "red" if r.status is Status.UNREACHABLE else "yellow"
        status = "not contacted" if was_held(r) else r.status.value
        return {"HOST": name, "STATUS": f"[{colour}]{status}[/]", **state}
    f = r.value
    packages = f.get("packages", {})
    cpu = f.get("cpu", {})
    isa = cpu.get("isa", {})
    bf16 = "amx" if isa.get("amx_bf16") else ("avx512" if isa.get("avx512_bf16") else "no")
    cells = {
        "HOST": r.host.name,
        "STATUS": "ok",
        # "=": the same as HOST, the common case, which keeps the column narrow.
        "HOSTNAME": "=" if f.get("hostname") == r.host.name else str(f.get("hostname")),
        "PYTHON": str(f.get("python", {}).get("version")),
        "TORCH": str(packages.get("torch") or "-"),
        "CPUACCEL": str(packages.get("cpuaccel") or "-"),
        "MPI": str(mpi_flavour(f) or "-"),
        "CORES": f"{cpu.get('physical_cores')}/{cpu.get('logical_cpus')}",
        "SOCK/NUMA": f"{cpu.get('sockets')}/{cpu.get('numa_nodes')}",
        "BF16": bf16,
        "MEM": _gib(f.get("memory", {}).get("total")),
    }
    return {k: escape(v) for k, v in cells.items()} | {"STATUS": "[green]ok[/]", **state}


def _width(columns: Sequence[str], rows: Sequence[dict[str, str]], gap: int) -> int:
    """The table's width in cells when nothing wraps."""
    # emoji=False, as ui's consoles print: `:smile:` in a name is 7 cells, not a picture's
    # 2, and rich's 140 kB emoji table stays unloaded (2 ms after the probes, issue 17).
    widths = [
        max([len(c)] + [Text.from_markup(r.get(c, "-"), emoji=False).cell_len for r in rows])
        for c in columns
    ]
    return sum(widths) + gap * (len(columns) - 1)


def fitting_columns(rows: Sequence[dict[str, str]], width: int) -> tuple[list[str], list[str], int]:
    """The columns shown at this terminal width, the ones left out, and the gap."""
    slurm = any("SLURM" in r for r in rows)
    for gap in GAPS:
        shown, dropped = list(SLURM_COLUMNS if slurm else COLUMNS), []
        for column in DROP_ORDER:
            if _width(shown, rows, gap) <= width:
                break
            shown.remove(column)
            dropped.append(column)
        if _width(shown, rows, gap) <= width:
            break
    return shown, dropped, gap


def table(results: Sequence[HostResult[Facts]], width: int) -> tuple[Table, list[str]]:
    rows = [row(r) for r in results]
    shown, dropped, gap = fitting_columns(rows, width)
    out = Table(
        box=None, pad_edge=False, header_style="bold", padding=(0, 1), collapse_padding=gap == 1
    )
    for column in shown:
        # fold: a name wider than the whole terminal wraps; no ellipsis ever hides it.
        out.add_column(column, justify="right" if column in RIGHT else "left", overflow="fold")
    for cells in rows:
        out.add_row(*(cells.get(c, "[dim]-[/]") for c in shown))
    return out, dropped


def print_report(
    results: Sequence[HostResult[Facts]], problems: Sequence[Problem], out: Console
) -> None:
    grid, dropped = table(results, out.width)
    out.print(grid)
    if dropped:
        out.print(
            f"[dim]({', '.join(dropped)} left out at {out.width} columns; "
            "a wider terminal or --json shows them)[/]"
        )
    # An unreachable host's error is the first of the problems (facts/problems.py).
    if problems:
        out.print()
    for p in problems:
        colour = "red" if p.severity == ERROR else "yellow"
        out.print(f"[{colour}]{p.severity:<7}[/] {escape(p.host or '-')}: {escape(p.message)}")
        if p.hint:
            out.print(f"         [dim]fix: {escape(p.hint)}[/]")
    held = sum(map(was_held, results))
    reachable = sum(r.status is not Status.UNREACHABLE for r in results) - held
    errors = sum(p.severity == ERROR for p in problems)
    out.print(
        f"\n{len(results)} host(s): {reachable} reachable, "
        f"{len(results) - reachable - held} unreachable"
        + (f", {held} not contacted (down or drained in Slurm)" if held else "")
        + f"; {errors} error(s), {len(problems) - errors} warning(s)"
    )
