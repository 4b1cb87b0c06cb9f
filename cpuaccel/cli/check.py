"""``cpuaccel check``: are all nodes reachable, alike and ready?"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from cpuaccel import ui
from cpuaccel.cli.options import Target, host_options
from cpuaccel.errors import EXIT_NODE_FAILED, EXIT_OK, EXIT_PROBLEMS
from cpuaccel.executor import HostResult, Status, run_on_hosts
from cpuaccel.facts.gather import Facts, gather, names_to_resolve
from cpuaccel.facts.problems import ERROR, Problem, find_problems, mpi_flavour, same_account

EPILOG = """\b
Examples:
  cpuaccel check
  cpuaccel check -i inventory.yaml
  cpuaccel check -i inventory.yaml --limit node1,node2 --json | jq .problems
  cpuaccel check -i inventory.yaml -u ubuntu --private-key ~/.ssh/id_ed25519 -v
  cpuaccel check -i inventory.yaml --limit 'workers:!node3' --list-hosts

\b
Exit codes: 0 consistent (warnings allowed); 1 problems of error severity;
69 a host was unreachable; 64 the inventory or arguments were bad.
"""


def gather_all(target: Target) -> list[HostResult[Facts]]:
    """Facts from every selected host in parallel, with a progress bar on a terminal."""
    hosts = target.hosts
    with ui.progress("gathering facts", len(hosts)) as tracker:
        return run_on_hosts(
            hosts,
            lambda conn: gather(conn, names_to_resolve(conn.host, hosts)),
            forks=target.forks,
            options=target.connect,
            on_result=lambda r: tracker.advance(r.host.name),
        )


def exit_code(results: Sequence[HostResult[Facts]], problems: Sequence[Problem]) -> int:
    if any(r.status is Status.UNREACHABLE for r in results):
        return EXIT_NODE_FAILED
    if any(p.severity == ERROR for p in problems):
        return EXIT_PROBLEMS
    return EXIT_OK


@click.command(epilog=EPILOG)
@host_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
def check_command(
    target: Target,
    as_json: bool,
) -> None:
    """Gather facts from every node in parallel and report what differs.

    Reports unreachable nodes, version drift (Python, torch, cpuaccel, MPI), names a node
    cannot resolve, clock skew and missing bf16 hardware, before any job can hang on them.
    """
    results = gather_all(target)
    problems = find_problems(results)
    notes = same_account(results)  # said, never counted: exit codes stay the problems'
    if as_json:
        ui.print_json({**to_json(results, problems), "notes": [n.to_json() for n in notes]})
    else:
        print_report(results, problems)
        for note in notes:
            ui.stdout().print(f"[cyan]note[/]    {escape(note.message)}")
            ui.stdout().print(f"         [dim]{escape(note.hint or '')}[/]")
    sys.exit(exit_code(results, problems))


def to_json(results: Sequence[HostResult[Facts]], problems: Sequence[Problem]) -> dict[str, Any]:
    return {
        "hosts": {
            r.host.name: {
                "reachable": r.status is not Status.UNREACHABLE,
                "status": r.status.value,
                "facts": r.value,
                "error": r.error,
            }
            for r in results
        },
        "problems": [p.to_json() for p in problems],
    }


def _gib(value: Any) -> str:
    return f"{value / 2**30:.0f}G" if isinstance(value, (int, float)) else "-"


def _row(r: HostResult[Facts]) -> list[str]:
    if r.value is None:
        colour = "red" if r.status is Status.UNREACHABLE else "yellow"
        reason = escape(r.error or "")
        name = escape(r.host.name)
        return [name, f"[{colour}]{r.status.value}[/]", f"[dim]{reason}[/]"] + [""] * 8
    f = r.value
    packages = f.get("packages", {})
    cpu = f.get("cpu", {})
    isa = cpu.get("isa", {})
    bf16 = "amx" if isa.get("amx_bf16") else ("avx512" if isa.get("avx512_bf16") else "no")
    # Every cell from a node or the inventory is escaped: a version or a name with
    # "[...]" in it is text, not console markup.
    return [
        escape(r.host.name),
        "[green]ok[/]",
        escape(str(f.get("hostname"))),
        escape(str(f.get("python", {}).get("version"))),
        escape(str(packages.get("torch") or "-")),
        escape(str(packages.get("cpuaccel") or "-")),
        escape(str(mpi_flavour(f) or "-")),
        f"{cpu.get('physical_cores')}/{cpu.get('logical_cpus')}",
        f"{cpu.get('sockets')}/{cpu.get('numa_nodes')}",
        bf16,
        _gib(f.get("memory", {}).get("total")),
    ]


def print_report(results: Sequence[HostResult[Facts]], problems: Sequence[Problem]) -> None:
    out = ui.stdout()
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("HOST", "STATUS", "HOSTNAME", "PYTHON", "TORCH", "CPUACCEL", "MPI"):
        table.add_column(column)
    for column in ("CORES", "SOCK/NUMA", "BF16", "MEM"):
        table.add_column(column, justify="right")
    for r in results:
        table.add_row(*_row(r))
    out.print(table)
    if problems:
        out.print()
    for p in problems:
        colour = "red" if p.severity == ERROR else "yellow"
        out.print(f"[{colour}]{p.severity:<7}[/] {escape(p.host or '-')}: {escape(p.message)}")
        if p.hint:
            out.print(f"         [dim]fix: {escape(p.hint)}[/]")
    reachable = sum(r.status is not Status.UNREACHABLE for r in results)
    errors = sum(p.severity == ERROR for p in problems)
    out.print(
        f"\n{len(results)} host(s): {reachable} reachable, {len(results) - reachable} "
        f"unreachable; {errors} error(s), {len(problems) - errors} warning(s)"
    )
