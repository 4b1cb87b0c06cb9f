"""``cpuaccel check``: are all nodes reachable, alike and ready?

The table holds every host's facts, sized to the terminal. What drift is about (the
host's name, the Python, torch and cpuaccel versions) is never cut: at a narrow width
the less important columns are left out first, the node's own hostname last (and which
ones is said), and whatever is still too wide wraps onto a second line rather than
ending in an ellipsis: a value is shown whole or not at all. An unreachable or failed
host's error goes under the table (it is one of the problems), where it has the whole
width, not into a column.

On Slurm's nodes (``--slurm``, ``-i slurm:PARTITION``), Slurm already knows which nodes
are down or drained, and why: such a node is reported with Slurm's state and reason and
never contacted (connecting would only time out, or reach a node an admin is working
on). Where the site lets nobody SSH to a node outside a job (pam_slurm_adopt, or no sshd
at all), every node refuses: that is said as what it is, with the way that works there,
not as a list of unreachable hosts.
"""

from __future__ import annotations

import contextlib
import re
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import click

from cpuaccel import ui
from cpuaccel.api.target import Target
from cpuaccel.cli import columns as fitted
from cpuaccel.cli.main import paused
from cpuaccel.cli.options import host_options
from cpuaccel.config.settings import LaunchSettings
from cpuaccel.connectors.base import Connector
from cpuaccel.errors import EXIT_NODE_FAILED, EXIT_OK, EXIT_PROBLEMS, CpuaccelError
from cpuaccel.executor import ConnectionPool, HostResult, Status, run_on_hosts
from cpuaccel.facts.gather import Facts, gather, names_to_resolve
from cpuaccel.facts.problems import (
    ERROR,
    WARNING,
    Problem,
    find_problems,
    mpi_flavour,
    same_account,
)
from cpuaccel.inventory.host import Host
from cpuaccel.inventory.slurm_source import CPUS_VAR, REASON_VAR, STATE_VAR
from cpuaccel.jobs.launcher_reach import LauncherReach
from cpuaccel.jobs.plan import RunPlan, Script, build_plan, new_run_id
from cpuaccel.jobs.preflight import head_problems, readiness
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
            one_inline=True,  # one node: no thread pool to start, off check's start-up
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
        settings = target.settings(flags, hosts)
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
    # The table's modules (rich, slow to import) load while the probes are out: at one node,
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
        print_report(results, problems, ui.stdout())
        for note in notes:
            ui.stdout().print(f"[cyan]note[/]    {escape(note.message)}")
            ui.stdout().print(f"         [dim]{escape(note.hint or '')}[/]")
    sys.exit(exit_code(results, problems))


def _import_table() -> None:
    """Imports the table's modules; any failure (a concurrent import's lock cycle) is
    left to the import where the table is printed, which raises it as usual."""
    with contextlib.suppress(Exception), paused():
        import rich.console
        import rich.table
        import rich.text  # noqa: F401


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


# ---------------------------------------------------------------- Slurm's nodes
NOT_ALLOWED = "SSH to Slurm nodes is not allowed here: use cpuaccel run inside salloc/sbatch"
# What a refusal looks like from paramiko and sshd: no sshd listening, the key or the
# account refused (pam_slurm_adopt's "Access denied ... you have no active jobs"). A
# pattern compiled by re on first use: only an unreachable node's error is read.
_REFUSED = (
    r"connection refused|authentication failed|access denied|permission denied|"
    r"pam_slurm|no active jobs"
)


def unavailable(state: str) -> bool:
    """Slurm's verdict on a node state (slurm.partition); imported on first use, as
    inventory_choice does, so that a check of a file inventory, whose hosts have no
    Slurm state, does not load the Slurm modules before its probe goes out."""
    from cpuaccel.slurm.partition import unavailable as slurm_unavailable

    return slurm_unavailable(state)


def slurm_state(host: Host) -> str | None:
    value = host.vars.get(STATE_VAR)
    return str(value) if value else None


def held_back(hosts: Sequence[Host]) -> tuple[list[Host], dict[str, HostResult[Facts]]]:
    """The hosts to contact, and a result for each one Slurm says takes no work."""
    contact: list[Host] = []
    held: dict[str, HostResult[Facts]] = {}
    for host in hosts:
        state = slurm_state(host)
        if state is None or not unavailable(state):
            contact.append(host)
            continue
        from cpuaccel.slurm.partition import describe  # a Slurm node: loaded above

        reason = host.vars.get(REASON_VAR)
        held[host.name] = HostResult(
            host,
            Status.FAILED,
            error=f"Slurm has it {describe(state)} ({state})"
            + (f", reason: {reason}" if reason else ", no reason given")
            + "; not contacted",
            hint=f"once it is fixed, an admin resumes it (scontrol update nodename={host.name} "
            f"state=resume); leave it out meanwhile with --limit '!{host.name}'",
        )
    return contact, held


def was_held(result: HostResult[Any]) -> bool:
    """True for a node :func:`held_back` left alone (Slurm has it down or drained)."""
    state = slurm_state(result.host)
    return result.value is None and state is not None and unavailable(state)


def refusal(results: Sequence[HostResult[Any]]) -> list[str]:
    """The Slurm nodes that refused SSH, when every Slurm node contacted refused it."""
    contacted = [
        r
        for r in results
        if slurm_state(r.host) is not None and not unavailable(r.host.vars[STATE_VAR])
    ]
    refused = [
        r.host.name
        for r in contacted
        if r.status is Status.UNREACHABLE and re.search(_REFUSED, r.error or "", re.IGNORECASE)
    ]
    return refused if contacted and len(refused) == len(contacted) else []


def with_refusal(results: Sequence[HostResult[Any]], problems: list[Problem]) -> list[Problem]:
    """``problems`` with the refused nodes' unreachable errors made one clear line."""
    refused = refusal(results)
    if not refused:
        return problems
    first = next(r for r in results if r.host.name == refused[0])
    names = ", ".join(refused[:5]) + (f" and {len(refused) - 5} more" if len(refused) > 5 else "")
    line = Problem(
        ERROR,
        names,
        NOT_ALLOWED,
        f"every node refused SSH ({refused[0]}: {first.error}); where SSH to nodes is "
        "allowed, give the user and key with -u/--private-key or group_vars/",
    )
    kept = [p for p in problems if p.host not in refused]
    return [line, *kept]


def slurm_json(host: Host) -> dict[str, Any] | None:
    """A host's Slurm state for ``check --json`` (None: not a Slurm node)."""
    state = slurm_state(host)
    if state is None:
        return None
    return {
        "state": state,
        "available": not unavailable(state),
        "cpus": host.vars.get(CPUS_VAR),
        "reason": host.vars.get(REASON_VAR),
    }
