"""``cpuaccel fetch RUN``: a run's results from its head node into ./runs/<id>/."""

from __future__ import annotations

import click

from cpuaccel import ui
from cpuaccel.api.heads import HeadOptions
from cpuaccel.api.run_handle import Run
from cpuaccel.cli.options import head_options
from cpuaccel.ui import escape

EPILOG = """\b
Examples:
  cpuaccel fetch last                  # metrics, logs, status, checkpoint listing
  cpuaccel fetch 20250101 --checkpoints
  cpuaccel report runs/$(cpuaccel ps -n 1 --json | jq -r '.[0].id')

\b
RUN is `last`, a run id, a prefix only one run has, or a run folder. Only what changed since the
last fetch is copied; checkpoints are written to a temporary file, checked against
their size on the head, then renamed into place.
"""


@click.command(
    epilog=EPILOG,
    short_help="Copy a run's metrics, logs and checkpoints from its head node into ./runs/<id>/.",
)
@click.argument("run_spec", metavar="RUN")
@click.option(
    "--checkpoints", is_flag=True, help="Also copy the checkpoint files (.pt, .safetensors ...)."
)
@head_options
def fetch_command(
    run_spec: str,
    checkpoints: bool,
    inventory_path: str | None,
    connect_timeout: float,
    no_host_key_checking: bool,
) -> None:
    """Copy a run's results from its head node into ./runs/<id>/: metrics.jsonl,
    checkpoints.json (a listing), and for a detached run its status.json and every
    rank's log; with --checkpoints the checkpoint files too."""
    found = Run.find(
        run_spec, heads=HeadOptions(inventory_path, connect_timeout, no_host_key_checking)
    )
    fetched = found.fetch(checkpoints=checkpoints)
    run = found.record()
    if fetched is None:
        ui.stderr().print(
            f"run {escape(run.run_id)} ran on this machine: its files are in "
            f"{escape(str(run.path))} already"
        )
        return
    names = ", ".join(fetched.files) or "nothing new"
    ui.stderr().print(
        f"fetched from {escape(str(run.head))}: {escape(names)} ({fetched.bytes} bytes) "
        f"into {escape(str(run.path))}"
    )
