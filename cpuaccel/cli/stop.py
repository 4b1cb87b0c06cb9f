"""``cpuaccel stop RUN``: end a running job on every node (jobs/teardown.py), and print."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from cpuaccel import ui
from cpuaccel.api import run_handle
from cpuaccel.api.target import Target
from cpuaccel.cli.options import host_options
from cpuaccel.config.settings import FLAG, INVENTORY_VARIABLES
from cpuaccel.errors import EXIT_OK, EXIT_PROBLEMS
from cpuaccel.history.records import load
from cpuaccel.inventory.host import Host
from cpuaccel.inventory.inventory import Inventory
from cpuaccel.jobs import teardown as engine
from cpuaccel.ui import escape

EPILOG = """\b
Examples:
  cpuaccel stop last                        # the newest run in ./runs
  cpuaccel stop 20250101-120000             # an id, or a prefix of one
  cpuaccel stop -i inventory.yaml 2025010   # reach the nodes through this inventory
  cpuaccel stop 20250101-120000-ab12cd      # a submitted run: scancel, verified

\b
RUN is `last`, a run id, a prefix only one run has (looked up in ./runs: run from
the project folder), or a run folder. A detached run's head is
reached through the inventory it was started with (run.json), unless -i is given.
The job ends as Ctrl-C ends a foreground run: SIGTERM, then SIGKILL, then every node
swept for its processes; status.json then says stopped. A run that had ended is swept
all the same: a node lost mid-run may still hold its ranks.

\b
A run queued by cpuaccel submit is cancelled with scancel; stop then waits until
Slurm says the job ended (CANCELLED, every process of it gone on every node).

\b
Exit codes: 0 stopped (or it had ended already); 1 processes of the job are left on a
node; 64 no such run; 69 the head node unreachable.
"""


@click.command(epilog=EPILOG)
@host_options
@click.argument("run", metavar="RUN")
def stop_command(target: Target, run: str) -> None:
    """End the job RUN on every node and verify that nothing of it is left."""
    folder = engine.find_run(Path.cwd() / "runs", run)
    record = engine.read_record(folder)
    job = load(folder).job_id
    if job is not None:  # queued by cpuaccel submit: Slurm ends it (scancel)
        _print_submitted(engine.stop_submitted(folder, record, job), job, record)
    hosts = run_hosts(target, record)
    done = engine.stop(folder, record, hosts, target.connect, target.forks)
    err = ui.stderr()
    run_id = escape(done.run_id)
    for host, procs in done.swept.items():
        pids = " ".join(str(pid) for pid, _ in procs)
        err.print(f"ended leftover processes on {escape(host)}: pids {escape(pids)}")
    for host, procs in done.left.items():
        err.print(f"[red]still running on {escape(host)}[/]: {escape(str(procs))}")
    if done.already:
        ui.stdout().print(f"{run_id}: had already ended ({escape(done.state)})", highlight=False)
        # Processes that would not end are a failure; a node not reached is said above.
        stuck = any(isinstance(procs, list) for procs in done.left.values())
        sys.exit(EXIT_PROBLEMS if stuck else EXIT_OK)
    nodes = escape(", ".join(h.name for h in hosts))
    if done.left:
        left = f"{run_id}: {escape(done.state)}, but processes are left"
        ui.stdout().print(left, highlight=False)
        sys.exit(EXIT_PROBLEMS)
    ui.stdout().print(
        f"{run_id}: {escape(done.state)}; nothing of it is left on {nodes}", highlight=False
    )
    sys.exit(EXIT_OK)


def _print_submitted(done: engine.Stopped, job: str, record: dict[str, Any]) -> None:
    run_id, said = escape(done.run_id), escape(done.slurm.state if done.slurm else "?")
    if done.already:
        ui.stdout().print(
            f"{run_id}: had already ended ({escape(done.state)}; Slurm job {escape(job)} {said})",
            highlight=False,
        )
        sys.exit(EXIT_OK)
    if done.left:
        left = escape(", ".join(f"{k} is {v}" for k, v in done.left.items()))
        ui.stdout().print(f"{run_id}: scancel sent, but {left}", highlight=False)
        sys.exit(EXIT_PROBLEMS)
    nodes = escape(", ".join(str(h) for h in record.get("hosts") or []) or "its nodes")
    ui.stdout().print(
        f"{run_id}: {escape(done.state)} (Slurm job {escape(job)} {said}); Slurm saw every "
        f"process of it end on {nodes}",
        highlight=False,
    )
    sys.exit(EXIT_OK)


def run_hosts(target: Target, record: dict[str, Any]) -> list[Host]:
    """The run's nodes (head first) from -i, else the inventory it was started with."""
    inventory = target.inventory
    given = target.inventory_setting is not None and target.inventory_setting.source == FLAG
    if not given and record.get("inventory"):
        inventory = Inventory.load(str(record["inventory"]), target.cli_vars)
        inventory = inventory.check_declared(INVENTORY_VARIABLES)
    return run_handle.run_hosts(inventory.hosts, record, inventory.source or "")
