"""``cpuaccel sync``: make every node's copy of the project identical to the controller's.

The work is the API's (api/syncing.py); this verb prints each node's line, or JSON."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import click

from cpuaccel import ui
from cpuaccel.api.syncing import sync_target
from cpuaccel.api.target import Target
from cpuaccel.cli.options import host_options
from cpuaccel.executor import HostResult, Status
from cpuaccel.projectsync.node_result import NodeReport
from cpuaccel.ui import escape

EPILOG = """\b
Examples:
  cpuaccel sync -i inventory.yaml                 # ./ to {{cpuaccel_workdir}}/<this folder>
  cpuaccel sync -i inventory.yaml --check         # what would change; changes nothing
  cpuaccel sync -i inventory.yaml -C -D           # ... and which files: + new ~ changed - gone
  cpuaccel sync -i inventory.yaml src/ configs/ --dest /scratch/job --delete
  cpuaccel sync --exclude 'data/*.bin' --json

\b
Leaves out what .gitignore and .cpuaccelignore ignore, plus .git/, __pycache__/,
virtualenvs and runs/. One folder: its contents land at the destination; several
sources or files: each lands below it under its own name.

\b
Exit codes: 0 every node matches the source; 1 (--check) some node would change;
69 a node does not match afterwards or is unreachable; 64 the input was bad.
"""


def _size(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000  # type: ignore[assignment]
    return f"{n} B"


def _diff_lines(report: NodeReport) -> list[str]:
    """--diff: each path that was (or would be) added, changed or deleted, one a line,
    marked as diff marks lines: ``+`` new on the node, ``~`` replaced, ``-`` removed."""
    added = set(report.added)
    lines = [f"+ {rel}" if rel in added else f"~ {rel}" for rel in report.changed]
    return lines + [f"- {rel}" for rel in report.deleted]


def _print_text(results: Sequence[HostResult[NodeReport]], diff: bool) -> None:
    out = ui.stdout()
    for r in results:
        out.print(_line(r))
        if diff and r.value is not None:
            for line in _diff_lines(r.value):
                style = {"+": "green", "-": "red"}.get(line[0], "yellow")
                out.print(f"    [{style}]{escape(line)}[/]")


def _line(r: HostResult[NodeReport]) -> str:
    name = escape(r.host.name)
    if r.value is None:
        colour = "red" if r.status is Status.UNREACHABLE else "yellow"
        hint = f" (fix: {escape(r.hint)})" if r.hint else ""
        return f"[{colour}]{name}: {r.status.value}[/]: {escape(r.error or '')}{hint}"
    v = r.value
    if v.shared_with:
        state = "matches" if v.in_sync else "[red]DIFFERS[/]"
        return f"{name}: shares {escape(v.shared_with)}'s filesystem, written once; {state}"
    verb = "would change" if v.method == "check" else "changed"
    if not v.changed and not v.deleted:
        return f"[green]{name}[/]: in sync ({escape(v.dest)}, {r.seconds:.2f} s)"
    return (
        f"[yellow]{name}[/]: {len(v.changed)} {verb}, {len(v.deleted)} deleted, "
        f"{_size(v.bytes)}, {r.seconds:.2f} s ({v.method}) -> {escape(v.dest)}"
    )


@click.command(epilog=EPILOG)
@host_options
@click.argument("sources", nargs=-1, type=click.Path())
@click.option("--dest", metavar="DIR", help="Destination on each node (Jinja2 over host vars).")
@click.option("--delete", is_flag=True, help="Remove files on the node the source does not have.")
@click.option("--exclude", multiple=True, metavar="PATTERN", help="Leave out (gitignore syntax).")
@click.option("--copy-links", is_flag=True, help="Send what symlinks pointing outside point to.")
@click.option("-C", "--check", is_flag=True, help="Show what would change; change nothing.")
@click.option(
    "-D",
    "--diff",
    is_flag=True,
    help="List each file added (+), changed (~) or deleted (-) on every node.",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of lines.")
def sync_command(target: Target, diff: bool, as_json: bool, **sync: Any) -> None:
    """Push the training code and configs to every node, verified.

    Only what differs moves (content hashes, rsync for large changes); files reach
    their real paths by rename, so a killed sync leaves no half-written file, and
    every node checks the result against the controller's manifest.
    """
    found = sync_target(target, **sync)  # SOURCES, --dest, --delete, --exclude ... -C
    if as_json:
        ui.print_json(found.to_json())
    else:
        _print_text(found.results, diff)
        out = ui.stdout()
        matching = sum(bool(r.value and r.value.in_sync) for r in found.results)
        out.print(
            f"{matching}/{len(found.results)} node(s) match the source "
            f"({found.files} entries, manifest {found.manifest[:12]})"
        )
    sys.exit(found.exit_code)
