"""``cpuaccel logs [RUN]``: a run's labelled output, merged or filtered, followed with -f."""

from __future__ import annotations

import sys

import click

from cpuaccel import ui
from cpuaccel.api.heads import Heads, node_failed
from cpuaccel.cli.options import head_options
from cpuaccel.errors import EXIT_OK, CpuaccelError, HostError
from cpuaccel.history.rank_logs import LogLine, Reader, chosen_ranks, files_of, lines
from cpuaccel.history.records import find_run, load
from cpuaccel.jobs.foreground import COLOURS
from cpuaccel.ui import escape

EPILOG = """\b
Examples:
  cpuaccel logs                        # the newest run's output, rank by rank
  cpuaccel logs 20250101 -f --rank 0   # follow rank 0 of that run until it ends
  cpuaccel logs last --host node2 --rank 4 --rank 5

\b
RUN is `last` (the default), a run id, a prefix only one run has, or a run folder.
A detached run's output is read from its head node while it runs (-i, else the
inventory it recorded).
Ctrl-C stops following (exit 0); the job goes on.
"""


class Printer:
    """Each line labelled [rank R node], coloured by rank on a terminal."""

    def __init__(self) -> None:
        self.out = ui.stdout()

    def show(self, line: LogLine) -> None:
        colour = COLOURS[line.rank % len(COLOURS)]
        label = f"[{colour}]\\[rank {line.rank} {escape(line.host)}][/]"
        self.out.print(f"{label} {escape(line.text)}", soft_wrap=True)


@click.command(epilog=EPILOG)
@click.argument("run_spec", metavar="[RUN]", default="last")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new output until the run ends.")
@click.option(
    "--rank", "ranks", type=click.IntRange(0), multiple=True, help="Only this rank (repeatable)."
)
@click.option(
    "--host",
    metavar="NODE",
    help="Only the ranks that ran on this node (its inventory name, or its hostname).",
)
@head_options
def logs_command(
    run_spec: str,
    follow: bool,
    ranks: tuple[int, ...],
    host: str | None,
    inventory_path: str | None,
    connect_timeout: float,
    no_host_key_checking: bool,
) -> None:
    """Print a run's output, each line labelled [rank R node], rank by rank (or as it
    arrives, with -f)."""
    run = load(find_run(run_spec))
    reader = Reader(run, chosen_ranks(run, ranks, host))
    heads = Heads(inventory_path, connect_timeout, no_host_key_checking)
    printer = Printer()
    try:
        files = files_of(run, next(iter(reader.offsets)), lambda: heads.files(run))
        for line in lines(reader, files, follow):
            printer.show(line)
    except KeyboardInterrupt:
        for line in reader.flush():
            printer.show(line)
        ui.stderr().print("[dim]stopped following; the job goes on[/]")
        sys.exit(EXIT_OK)
    except CpuaccelError as exc:
        for line in reader.flush():
            printer.show(line)
        raise node_failed(exc) if isinstance(exc, HostError) else exc from None
    finally:
        heads.close()
