"""``cpuaccel ps``: the runs recorded in ./runs/, with their state and last step."""

from __future__ import annotations

import time
from typing import Any

import click
from rich.table import Table

from cpuaccel import ui
from cpuaccel.api import run_handle
from cpuaccel.api.heads import HeadOptions
from cpuaccel.cli import columns as fitted
from cpuaccel.cli.options import head_options
from cpuaccel.history.records import runs_folder
from cpuaccel.ui import escape

EPILOG = """\b
Examples:
  cpuaccel ps                      # every run of this project folder, newest first
  cpuaccel ps -n 5 --json | jq '.[] | select(.state == "running") | .id'
  cpuaccel ps -i inventory.yaml    # detached runs: their state asked of their heads

\b
States: running, succeeded, failed (with its exit code), stopped, timeout,
interrupted, lost (its supervisor is gone), unknown (a record from elsewhere);
a run queued by cpuaccel submit also: queued (Slurm has not started it), submitted
(Slurm could not be asked), and a SLURM column with its job id and Slurm's state
(squeue, else sacct).
"""


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _slurm_cell(r: dict[str, Any]) -> str:
    job = r.get("slurm")
    if not job:
        return "-"
    said = job["state"] or "?"
    if job.get("reason") and job["state"] == "PENDING":
        said += f" ({job['reason']})"
    return escape(f"{job['job_id']} {said}")


COLUMNS = ("ID", "SCRIPT", "NODES×PPN", "STATE", "STARTED", "DURATION", "STEP", "LOSS")
# Left out in this order when the table is wider than the terminal; ID, STATE and SLURM
# never are, and ID is never cut: an id is what the other verbs take.
DROP_ORDER = ("STARTED", "DURATION", "LOSS", "STEP", "NODES×PPN", "SCRIPT")
RIGHT = frozenset({"STEP", "LOSS"})
_COLOURS = {"running": "cyan", "succeeded": "green", "queued": "cyan", "submitted": "cyan"}


def _cells(r: dict[str, Any], slurm: bool) -> dict[str, str]:
    state = r["state"] + (f" ({r['exit_code']})" if r["state"] == "failed" else "")
    if r["restarts"]:
        state += f", restarts: {r['restarts']}"
    started = time.strftime("%Y-%m-%d %H:%M", time.localtime(r["started"])) if r["started"] else "-"
    cells = {
        "ID": escape(r["id"]),
        "SCRIPT": escape(r["script"]),
        "NODES×PPN": f"{r['nodes']}×{r['ppn'] if r['ppn'] is not None else '?'}",
        "STATE": f"[{_COLOURS.get(r['state'], 'red')}]{escape(state)}[/]",
        "STARTED": started,
        "DURATION": _duration(r["seconds"]),
        "STEP": escape(str(r["step"])) if r["step"] is not None else "-",
        "LOSS": f"{r['loss']:.4g}" if r["loss"] is not None else "-",
    }
    return cells | ({"SLURM": _slurm_cell(r)} if slurm else {})


def _table(rows: list[dict[str, Any]], room: int) -> tuple[Table, list[str]]:
    """The runs' table in ``room`` cells, and the columns left out to fit it."""
    slurm = any(r.get("slurm") for r in rows)
    cells = [_cells(r, slurm) for r in rows]
    shown, dropped, gap = fitted.fit(
        (*COLUMNS, "SLURM") if slurm else COLUMNS, DROP_ORDER, cells, room
    )
    table = Table(
        box=None, pad_edge=False, header_style="bold", padding=(0, 1), collapse_padding=gap == 1
    )
    longest = max(len(r["id"]) for r in rows)
    for name in shown:
        # fold, never an ellipsis; the id keeps its whole width while anything can shrink.
        table.add_column(
            name,
            justify="right" if name in RIGHT else "left",
            overflow="fold",
            min_width=longest if name == "ID" else None,
        )
    for row_cells in cells:
        table.add_row(*(row_cells[name] for name in shown))
    return table, dropped


@click.command(
    epilog=EPILOG, short_help="List the runs of ./runs, newest first: state, last step and loss."
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON list instead of a table.")
@click.option(
    "-n",
    "--last",
    "count",
    type=click.IntRange(1),
    metavar="COUNT",
    help="Only the newest COUNT runs.",
)
@head_options
def ps_command(
    as_json: bool,
    count: int | None,
    inventory_path: str | None,
    connect_timeout: float,
    no_host_key_checking: bool,
) -> None:
    """List the runs recorded in ./runs/ (newest first): id, script, nodes × ppn, state,
    start, duration, and the last step and loss of metrics.jsonl.

    A detached run that is not known to have ended is asked of its head node (-i, else
    the inventory it recorded), each within 10 s.
    """
    rows = run_handle.rows(
        count, HeadOptions(inventory_path, connect_timeout, no_host_key_checking)
    )
    for r in rows:  # a record left out: the run is shown from the rest, with the reason
        for problem in r["problems"]:
            ui.stderr().print(f"[yellow]warning:[/] run {escape(r['id'])}: {escape(problem)}")
    if as_json:
        ui.print_json(rows)
    elif not rows:
        ui.stderr().print(f"no runs recorded in {escape(str(runs_folder()))}")
    else:
        out = ui.stdout()
        table, dropped = _table(rows, out.width)
        out.print(table)
        if dropped:
            out.print(fitted.left_out(dropped, out.width))
