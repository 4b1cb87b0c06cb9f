"""``cpuaccel check``: are all nodes reachable, alike and ready?

The work is the API's (api/checking.py); this verb prints what it found. The table holds
every host's facts, sized to the terminal. What drift is about (the host's name, the
Python, torch and cpuaccel versions) is never cut: at a narrow width the less important
columns are left out first, the node's own hostname last (and which ones is said), and
whatever is still too wide wraps onto a second line rather than ending in an ellipsis: a
value is shown whole or not at all. An unreachable or failed host's error goes under the
table (it is one of the problems), where it has the whole width, not into a column.

On Slurm's nodes (``--slurm``, ``-i slurm:PARTITION``), a node Slurm has down or drained
shows Slurm's state and is counted as not contacted.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import click

from cpuaccel import ui
from cpuaccel.api.checking import check_target, was_held
from cpuaccel.api.target import Target
from cpuaccel.cli import columns as fitted
from cpuaccel.cli.main import paused
from cpuaccel.cli.options import host_options
from cpuaccel.executor import HostResult, Status
from cpuaccel.facts.gather import Facts
from cpuaccel.facts.problems import ERROR, Problem, mpi_flavour
from cpuaccel.ui import escape

if TYPE_CHECKING:  # rich loads while the probes are out, for the table only
    from rich.console import Console
    from rich.table import Table

EPILOG = """\b
Examples:
  cpuaccel check
  cpuaccel check -i inventory.yaml
  cpuaccel check -i hosts.ini           # Ansible's INI format, group_vars/ beside it
  cpuaccel check -i node1,node2,        # hosts as a comma list, as Ansible's -i
  cpuaccel check -i inventory.yaml --limit node1,node2 --json | jq .problems
  cpuaccel check -i inventory.yaml -u ubuntu --private-key ~/.ssh/id_ed25519 -v
  cpuaccel check -i inventory.yaml --limit 'workers:!node3' --list-hosts
  cpuaccel check --slurm                # the default Slurm partition's nodes
  cpuaccel check --slurm batch -u train # partition batch; the same as -i slurm:batch

\b
Exit codes: 0 consistent (warnings allowed); 1 problems of error severity;
69 a host was unreachable; 64 the inventory or arguments were bad.
"""


@click.command(epilog=EPILOG)
@host_options
@click.option(
    "--slurm",
    "slurm_partition",
    is_flag=False,
    flag_value="",
    default=None,
    metavar="[PARTITION]",
    help="Check a Slurm partition's nodes (the default partition without a name), with "
    "their Slurm state; the same as -i slurm:PARTITION.",
)
@click.option(
    "--network",
    "every_pair",
    is_flag=True,
    help="Try every ordered pair of nodes (by default: each node to the head's master port "
    "and to the next node).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
def check_command(
    target: Target,
    every_pair: bool,
    as_json: bool,
) -> None:
    """Gather facts from every node in parallel and report what differs.

    Reports unreachable nodes, version drift (Python, torch, cpuaccel, MPI), clock skew
    and missing bf16 hardware, and a node that the head node's MPI launcher cannot ssh
    to (the pair, head -> node), as run's preflight does; a node without cpuaccel or its
    cpuaccel_setvars, and a head without the chosen launcher; and the job's network: the
    address and interface each node's ranks would use, a node with no route to the head,
    a name that resolves to loopback, an address several nodes share.
    """
    # The table's modules (rich, slow to import) load while the probes are out: at one node,
    # where check is mostly its own start-up, this thread overlaps them with the wait.
    table = threading.Thread(target=_import_table, name="import-table", daemon=True)
    if not as_json:
        table.start()
    found = check_target(target, every_pair=every_pair)
    if as_json:
        ui.print_json(found.to_json())
    else:
        print_report(found.results, found.problems, ui.stdout())
        for note in found.notes:  # said, never counted: exit codes stay the problems'
            where = f"{note.host}: " if note.host else ""
            ui.stdout().print(f"[cyan]note[/]    {escape(where + note.message)}")
            if note.hint:
                ui.stdout().print(f"         [dim]{escape(note.hint)}[/]")
    sys.exit(found.exit_code)


def _import_table() -> None:
    """Imports the table's modules; any failure (a concurrent import's lock cycle) is
    left to the import where the table is printed, which raises it as usual."""
    with contextlib.suppress(Exception), paused():
        import rich.console
        import rich.table
        import rich.text  # noqa: F401


# ---------------------------------------------------------------- the table
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
# The line under the table that says what a shown column's pair of numbers counts.
LEGEND = {
    "CORES": "CORES: physical cores/logical CPUs",
    "SOCK/NUMA": "SOCK/NUMA: sockets/NUMA nodes",
}


def grid_columns(grid: Table) -> list[str]:
    return [str(column.header) for column in grid.columns]


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
    return fitted.width(columns, rows, gap)


def fitting_columns(rows: Sequence[dict[str, str]], width: int) -> tuple[list[str], list[str], int]:
    """The columns shown at this terminal width, the ones left out, and the gap."""
    slurm = any("SLURM" in r for r in rows)
    return fitted.fit(SLURM_COLUMNS if slurm else COLUMNS, DROP_ORDER, rows, width)


def table(results: Sequence[HostResult[Facts]], width: int) -> tuple[Table, list[str]]:
    from rich.table import Table

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
    legend = [text for column, text in LEGEND.items() if column in grid_columns(grid)]
    if legend:
        out.print(f"[dim]{escape('; '.join(legend))}[/]")
    if dropped:
        out.print(fitted.left_out(dropped, out.width))
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
