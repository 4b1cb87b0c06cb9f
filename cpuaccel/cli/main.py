"""The ``cpuaccel`` command: verbs, and one place that turns errors into exit codes."""

from __future__ import annotations

import sys

import click
from rich.markup import escape

from cpuaccel import __version__
from cpuaccel.cli.check import check
from cpuaccel.cli.config import config_command
from cpuaccel.cli.provision import provision_command
from cpuaccel.cli.report import report_command
from cpuaccel.cli.run import run_command
from cpuaccel.cli.sync import sync_command
from cpuaccel.errors import EXIT_USAGE, CpuaccelError

EPILOG = """\b
Examples:
  cpuaccel check                       # localhost only, no inventory needed
  cpuaccel check -i inventory.yaml     # every node: reachable, alike, ready?
  cpuaccel check -i inventory.yaml --limit 'workers:!node3' --json
  cpuaccel provision inventory.yaml            # make every node ready (idempotent)
  cpuaccel sync -i inventory.yaml              # push ./ to every node, verified
  cpuaccel run --nodes 1 --ppn 2 train.py      # this machine, 2 ranks
  cpuaccel run -i inventory.yaml --nodes 4 --ppn 4 train.py --epochs 3
  cpuaccel report runs/20250101-120000-abc123  # loss and samples/s: PNG + summary
  cpuaccel config                              # questions -> inventory.yaml, cpuaccel.yaml

\b
Exit codes: 0 all well; 1 problems found; 2 bad input or an unreachable host.
"""


@click.group(epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="cpuaccel")
def cli() -> None:
    """Provision Intel Xeon nodes, sync code to them, and launch PyTorch training with MPI."""


cli.add_command(check)
cli.add_command(provision_command, name="provision")
cli.add_command(sync_command, name="sync")
cli.add_command(run_command, name="run")
cli.add_command(report_command, name="report")
cli.add_command(config_command, name="config")


def main() -> None:
    try:
        cli.main(standalone_mode=False)
    except CpuaccelError as exc:
        from cpuaccel import ui

        ui.stderr().print(f"[bold red]error:[/] {escape(str(exc))}", markup=True, highlight=False)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(EXIT_USAGE if exc.exit_code == 2 else exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
