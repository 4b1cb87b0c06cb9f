"""``cpuaccel check``: are all nodes reachable, alike and ready?"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import click

from cpuaccel import ui
from cpuaccel.cli import gc_pause
from cpuaccel.cli.check_slurm import held_back, slurm_json, with_refusal
from cpuaccel.cli.options import Target, host_options
from cpuaccel.config.effective import resolve
from cpuaccel.config.settings import LaunchSettings
from cpuaccel.connectors.base import Connector
from cpuaccel.errors import EXIT_NODE_FAILED, EXIT_OK, EXIT_PROBLEMS, CpuaccelError
from cpuaccel.executor import ConnectionPool, HostResult, Status, run_on_hosts
from cpuaccel.facts.gather import Facts, gather, names_to_resolve
from cpuaccel.facts.problems import ERROR, WARNING, Problem, find_problems, same_account
from cpuaccel.inventory.host import Host
from cpuaccel.jobs.launcher_reach import LauncherReach
from cpuaccel.jobs.plan import RunPlan, Script, build_plan, new_run_id
from cpuaccel.jobs.preflight import head_problems, readiness
from cpuaccel.ui import escape

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


def gather_all(target: Target) -> tuple[list[HostResult[Facts]], list[Problem]]:
    """Facts from every selected host in parallel, with a progress bar on a terminal
    (a node Slurm has down or drained is not contacted: its result says why); and, in
    the same pass, what run's preflight checks from the settings a run would use: the
    head node's launcher ssh to every other node (jobs/launcher_reach.LauncherReach, its
    problems named head -> node) and the launcher on the head."""
    view = run_view(target)
    if isinstance(view, Problem):
        return _gather(target, None), [view]
    with ConnectionPool(replace(target.connect, keep=True)) as pool:
        # One host, or only this machine: no other node to reach, and nothing is tried.
        reach = LauncherReach(view.draft, target.connect, pool)
        results = _gather(target, reach, pool, keep=view.draft.head.name)
        problems = reach.problems()  # bounded: the reach's own timeout
    facts = {r.host.name: r.value for r in results if r.value is not None}
    launcher = view.settings.launcher.value
    head = view.draft.head.name
    # The master port is not probed: a job holding it now may be gone when the run starts.
    port = view.settings.master_port.value
    problems += head_problems(facts, head, port, None if launcher == "auto" else launcher)
    return results, problems


def _gather(
    target: Target,
    reach: LauncherReach | None,
    pool: ConnectionPool | None = None,
    keep: str | None = None,
) -> list[HostResult[Facts]]:
    """Facts of every host; with ``keep`` (the head, which the launcher-reach pass uses
    afterwards), every other host's connection is closed as soon as its facts are in, so
    that open connections (a socket and a paramiko thread each) stay bounded by --forks,
    not one per node for the whole command."""
    hosts = target.hosts
    contact, held = held_back(hosts)
    for result in held.values():  # never connected: the reach leaves them out
        if reach is not None:
            reach.finished(result)

    def probe(conn: Connector) -> Facts:
        # Its key goes into the run's known_hosts once ssh verified it: at connect,
        # or with the first command where connect opens nothing (an OpenSSH master).
        if reach is not None and not conn.opens_lazily:
            reach.connected(conn)
        facts = gather(conn, names_to_resolve(conn.host, hosts))
        if reach is not None and conn.opens_lazily:
            reach.connected(conn)
        if pool is not None and keep is not None and conn.host.name != keep:
            pool.discard(conn.host)  # done with it: nothing later in check uses it
        return facts

    with ui.progress("gathering facts", len(contact)) as bar:

        def on_result(result: HostResult[Facts]) -> None:
            if reach is not None:
                reach.finished(result)
            bar.advance(result.host.name)

        gathered = run_on_hosts(
            contact,
            probe,
            forks=target.forks,
            options=target.connect,
            pool=pool,
            on_result=on_result,
            one_inline=True,  # one node: no thread pool to start (its start-up, issue 17)
        )
    by_name = {r.host.name: r for r in gathered} | held
    return [by_name[host.name] for host in hosts]


@dataclass(frozen=True)
class RunView:
    """What a run with no flags would use on these hosts: its settings, and its draft
    plan on every selected host (what the launcher's ssh files are made from)."""

    settings: LaunchSettings
    draft: RunPlan


def run_view(target: Target) -> RunView | Problem:
    """The run's view of the selected hosts, head first (the project file's head, else
    the first). When a run would refuse these settings (its own error says why), a
    warning that its checks were not tried: check's verdict stays about the nodes."""
    hosts = target.hosts
    try:
        # --nodes all of them: check tries every selected host, not the first N.
        flags = {"nodes": len(hosts)}
        settings = resolve(flags, target.project, target.inventory, hosts, target.cli_vars)
        return RunView(settings, build_plan(settings, Script("check"), None, new_run_id()))
    except CpuaccelError as exc:
        message = f"a run would refuse these settings, so its checks were not tried: {exc.message}"
        return Problem(WARNING, None, message, hint=exc.hint)


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
    cannot resolve, clock skew and missing bf16 hardware, and a node that the head node's
    MPI launcher cannot ssh to (the pair, head -> node), as run's preflight does; a node
    without cpuaccel or its cpuaccel_setvars, and a head without the chosen launcher,
    before any job can hang on them.
    """
    # The table's modules (rich, ~30 ms) load while the probes are out: at one node,
    # where check is mostly its own start-up, this thread overlaps them with the wait.
    table = threading.Thread(target=_import_table, name="import-table", daemon=True)
    if not as_json:
        table.start()
    results, reach = gather_all(target)
    problems = with_refusal(results, find_problems(results))
    # What run's preflight refuses on each node, then the pairs the launcher cannot reach.
    problems += [p for r in results if r.value is not None for p in readiness(r.host, r.value)]
    problems += reach
    notes = same_account(results)  # said, never counted: exit codes stay the problems'
    if as_json:
        ui.print_json({**to_json(results, problems), "notes": [n.to_json() for n in notes]})
    else:
        from cpuaccel.cli.check_table import print_report  # loaded by now, or here

        print_report(results, problems, ui.stdout())
        for note in notes:
            ui.stdout().print(f"[cyan]note[/]    {escape(note.message)}")
            ui.stdout().print(f"         [dim]{escape(note.hint or '')}[/]")
    sys.exit(exit_code(results, problems))


def _import_table() -> None:
    """Imports the table's modules; any failure (a concurrent import's lock cycle) is
    left to the import where the table is printed, which raises it as usual."""
    with contextlib.suppress(Exception), gc_pause.paused():
        import cpuaccel.cli.check_table  # noqa: F401


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
