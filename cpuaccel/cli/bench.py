"""``cpuaccel bench``: measurements of the nodes themselves; ``bench net`` measures the
network between them with a job of one rank a node (``cpuaccel/netbench/``) and prints
every pair's latency and bandwidth, each backend's allreduce sweep and the slowest
link."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import click

from cpuaccel import ui
from cpuaccel.api.keywords import FlagValues, Seconds
from cpuaccel.api.target import Target
from cpuaccel.cli.options import F, host_options, list_hosts_and_exit, setting_options, shown_option
from cpuaccel.config.settings import BENCH
from cpuaccel.errors import UsageError
from cpuaccel.netbench.launching import Options, report_of, run_bench
from cpuaccel.netbench.results import BACKENDS, NetbenchError
from cpuaccel.netbench.sizes import parse_size, size_text
from cpuaccel.netbench.table import report_lines
from cpuaccel.node.endings import PREFLIGHT, STOPPED
from cpuaccel.node.supervisor import EXIT_INTERRUPTED
from cpuaccel.ui import escape

MIN_SIZE = 8  # the sweep's first size: two float32s
MAX_SIZE = 1 << 30  # bytes: a larger message is a typo on CPU nodes' memory
NET_EPILOG = """\b
Examples:
  cpuaccel bench net -i inventory.yaml             # every node: pairs, then allreduce
  cpuaccel bench net -i inventory.yaml --max-size 1M --iters 10
  cpuaccel bench net --nodes 4 --backend gloo --json > net.json

\b
One rank on each node (a cpuaccel job: preflight, sync of ./, launch, teardown):
- every pair of nodes plays ping-pong over gloo (send/recv), in rounds where each node
  is in one pair: latency = the median half round trip of 8 B, bandwidth = --pair-size
  over its median half round trip (the Intel MPI Benchmarks' PingPong);
- an allreduce (float32 sum) at 8 B x 4^k up to --max-size, with gloo and with MPI
  through mpi4py when the nodes have it: time = the mean over the ranks of each rank's
  median iteration, algbw = size / time, busbw = algbw x 2(n-1)/n (nccl-tests').
GB/s are 10^9 bytes a second. A link's rate is compared with the slower end's
interface speed where the kernel knows it (/sys/class/net/IF/speed).
The result is kept in runs/<id>/net.json.

\b
Exit codes: 0 measured; 64 bad input; 69 a node failed or the job did; 130 interrupted.
"""


class Size(click.ParamType):  # type: ignore[type-arg]
    """A message size in bytes: 64M, 16KiB, 512."""

    name = "size"

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> int:
        if isinstance(value, int):
            return value
        size = parse_size(str(value))
        if size is None:
            self.fail(f"{value!r} is not a size (e.g. 64M, 16KiB, 512)", param, ctx)
        if not MIN_SIZE <= size <= MAX_SIZE:
            self.fail(f"{value} is not {MIN_SIZE} B to {size_text(MAX_SIZE)}", param, ctx)
        return size


def _size_option(flag: str, default: str, help_text: str) -> Callable[[F], F]:
    """An option taking a message size (:class:`Size`), its default shown in --help."""
    return shown_option(flag, type=Size(), default=default, help=help_text)


@click.group()
def bench_command() -> None:
    """Measure the nodes: bench net measures the network between them."""


@bench_command.command("net", epilog=NET_EPILOG)
@setting_options(BENCH)
@host_options(settles_hosts=True)
@_size_option("--max-size", "64M", "The allreduce sweep's largest message (bytes; K, M, G: 1024s).")
@_size_option("--pair-size", "16M", "The message of each pair's bandwidth.")
@shown_option(
    "--iters",
    type=click.IntRange(3, 10_000),
    default=20,
    help="Timed iterations a size (fewer for large messages: 512 MiB moved at most).",
)
@click.option(
    "--backend",
    "backends",
    type=click.Choice(BACKENDS),
    multiple=True,
    help="The allreduce's backends (default: gloo, and mpi where mpi4py is).",
)
@shown_option(
    "--timeout",
    "job_timeout",  # apart from the host options' connect timeout
    type=Seconds(1, 86400),
    default=600.0,
    metavar="SECONDS",
    help="End the job after this long.",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout.")
def net_command(
    target: Target,
    flags: FlagValues,
    max_size: int,
    pair_size: int,
    iters: int,
    backends: tuple[str, ...],
    job_timeout: float,
    as_json: bool,
) -> None:
    """Measure the network: each pair's latency and bandwidth, allreduce by size."""
    if flags.get("min_nodes") is not None:
        raise UsageError(
            "--nodes MIN:MAX: not for bench net",
            hint="it measures the nodes it has: give --nodes N",
        )
    settings = target.settings(flags)
    list_hosts_and_exit(target, settings.hosts.value)
    if len(settings.chosen) < 2:
        raise UsageError(
            f"bench net measures between nodes: {len(settings.chosen)} chosen",
            hint="choose 2 nodes or more (-i INVENTORY, --nodes N)",
        )
    chosen = tuple(b for b in BACKENDS if b in backends) if backends else BACKENDS
    options = Options(max_size, pair_size, iters, chosen, job_timeout)
    ui.stderr().print(
        f"bench net: {len(settings.chosen)} nodes, 1 rank each; allreduce "
        f"{size_text(MIN_SIZE)} to {size_text(max_size)} with {', '.join(chosen)}"
    )
    outcome = run_bench(
        settings, Path.cwd().resolve(), options, connect=target.connect, forks=target.forks
    )
    if outcome.job.ended_by in STOPPED:
        sys.exit(EXIT_INTERRUPTED)
    if outcome.job.ended_by == PREFLIGHT.word:
        raise NetbenchError(
            outcome.job.error or "preflight failed", hint="cpuaccel check lists what a node lacks"
        )
    report = report_of(outcome)
    if as_json:
        ui.print_json(
            {"run_id": outcome.job.run_id, "folder": outcome.job.folder, **report.to_json()}
        )
        return
    out = ui.stdout()
    for line in report_lines(report):
        out.print(escape(line), highlight=False)
