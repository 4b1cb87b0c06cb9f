"""``run --json``: the one JSON object on stdout, on every path, a bad flag included.

A script that runs ``cpuaccel run --json ...`` reads stdout as one object whatever
happened. A value click refuses (``--ppn 0``) fails before ``run_command`` runs, so
``RunCommand`` catches click's usage errors when ``--json`` is among run's own options
(before SCRIPT: after it, ``--json`` is the script's) and prints the object first;
``cli/main.py`` then prints the error line and exits 64 as for any bad flag.
"""

from __future__ import annotations

from collections.abc import Sequence

import click

from cpuaccel import ui
from cpuaccel.errors import EXIT_USAGE, CpuaccelError
from cpuaccel.jobs.result import ERROR, JobReport
from cpuaccel.jobs.supervise import EXIT_INTERRUPTED


def failure(exc: BaseException, seconds: float) -> JobReport:
    """The object of a run that ended before any job: bad input, or Ctrl-C."""
    if isinstance(exc, CpuaccelError):
        return JobReport(exc.exit_code, ERROR, seconds, error=exc.message, fix=exc.hint)
    if isinstance(exc, click.ClickException):
        hint = "see 'cpuaccel run --help'"
        return JobReport(EXIT_USAGE, ERROR, seconds, error=exc.format_message(), fix=hint)
    return JobReport(EXIT_INTERRUPTED, "interrupted", seconds, error="interrupted")


def wants_json(command: click.Command, args: Sequence[str]) -> bool:
    """Whether ``--json`` is one of run's own options in ``args`` (it may be a value, or
    the script's own flag after SCRIPT, and then it is not)."""
    takes_value = {
        opt
        for param in command.params
        if isinstance(param, click.Option) and not param.is_flag and not param.count
        for opt in param.opts
    }
    words = iter(args)
    for word in words:
        if word == "--json":
            return True
        if word == "--" or not word.startswith("-"):
            return False  # SCRIPT: the rest is the script's
        if word in takes_value:
            next(words, None)  # its value
    return False


class RunCommand(click.Command):
    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        json_wanted = wants_json(self, args)
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            if json_wanted:
                ui.print_json(failure(exc, 0.0).to_json())
            raise
