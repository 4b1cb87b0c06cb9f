"""``cpuaccel check``: are all nodes reachable, alike and ready?"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import click
from rich.markup import escape

from cpuaccel import ui
from cpuaccel.cli.check_slurm import held_back, slurm_json, with_refusal
from cpuaccel.cli.check_table import print_report
from cpuaccel.cli.options import Target, host_options
from cpuaccel.errors import EXIT_NODE_FAILED, EXIT_OK, EXIT_PROBLEMS
from cpuaccel.executor import HostResult, Status, run_on_hosts
from cpuaccel.facts.gather import Facts, gather, names_to_resolve
from cpuaccel.facts.problems import ERROR, Problem, find_problems, same_account
from cpuaccel.inventory.host import Host

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


def gather_all(target: Target) -> list[HostResult[Facts]]:
    """Facts from every selected host in parallel, with a progress bar on a terminal;
    a node Slurm has down or drained is not contacted (its result says why)."""
    hosts = target.hosts
    contact, held = held_back(hosts)
    with ui.progress("gathering facts", len(contact)) as tracker:
        gathered = run_on_hosts(
            contact,
            lambda conn: gather(conn, names_to_resolve(conn.host, hosts)),
            forks=target.forks,
            options=target.connect,
            on_result=lambda r: tracker.advance(r.host.name),
        )
    by_name = {r.host.name: r for r in gathered} | held
    return [by_name[host.name] for host in hosts]


def exit_code(results: Sequence[HostResult[Facts]], problems: Sequence[Problem]) -> int:
    if any(r.status is Status.UNREACHABLE for r in results):
        return EXIT_NODE_FAILED
    if any(p.severity == ERROR for p in problems):
        return EXIT_PROBLEMS
    return EXIT_OK


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
    problems = with_refusal(results, find_problems(results))
    notes = same_account(results)  # said, never counted: exit codes stay the problems'
    if as_json:
        ui.print_json({**to_json(results, problems), "notes": [n.to_json() for n in notes]})
    else:
        print_report(results, problems, ui.stdout())
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
                **_slurm_part(r.host),
            }
            for r in results
        },
        "problems": [p.to_json() for p in problems],
    }


def _slurm_part(host: Host) -> dict[str, Any]:
    slurm = slurm_json(host)
    return {"slurm": slurm} if slurm is not None else {}
