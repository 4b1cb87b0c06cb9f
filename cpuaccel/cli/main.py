"""The ``cpuaccel`` command: verbs, and one place that turns errors into exit codes."""

from __future__ import annotations

import contextlib
import gc
import importlib
import sys
from collections.abc import Iterator

# ---------------------------------------------------------------- the GC while loading
# Modules loaded with the cyclic garbage collector paused, their heap then frozen.
#
# A command's start-up allocates tens of thousands of objects that live as long as the
# process (classes, functions, dataclasses' generated methods, compiled regexes): the
# collections those allocations set off find nothing to free, yet cost a visible part of a
# one-node check, whose time is mostly start-up; and the exit's collections would walk
# them all again. Frozen, every later collection skips them; finalizers, atexit hooks and
# flushes still run at exit.
#
# Only the command's own process freezes (``start_command``, from ``cli.main.main``): a
# test that drives the click group in its own process keeps its heap collectable, as a
# frozen object left over from one test would never be freed.
_command = False  # this process is one command, whose heap ends with it


def start_command() -> None:
    """Marks this process as the command's and freezes what is alive (click's modules,
    loaded paused); later pauses freeze what loaded in them."""
    global _command
    _command = True
    gc.freeze()


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Pauses the cyclic GC for the block (if it was on); then, in the command's own
    process, freezes what is alive."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if _command:
            gc.freeze()
        if enabled:
            gc.enable()


with paused():  # click and what every verb shares
    import click

    from cpuaccel import __version__
    from cpuaccel.errors import EXIT_USAGE, CpuaccelError, UsageError
    from cpuaccel.jobs import given_id

# Each verb's module is imported only when that verb runs (or for --help): start-up is
# paid on every command, and a sync need not load the playbook engine or the launcher.
VERBS = {
    "config": "cpuaccel.cli.config:config_command",
    "check": "cpuaccel.cli.check:check_command",
    "provision": "cpuaccel.cli.provision:provision_command",
    "sync": "cpuaccel.cli.sync:sync_command",
    "run": "cpuaccel.cli.run:run_command",
    "report": "cpuaccel.cli.report:report_command",
    "stop": "cpuaccel.cli.stop:stop_command",
    "ps": "cpuaccel.cli.ps:ps_command",
    "logs": "cpuaccel.cli.logs:logs_command",
    "fetch": "cpuaccel.cli.fetch:fetch_command",
    "submit": "cpuaccel.cli.submit:submit_command",
    "dashboard": "cpuaccel.cli.dashboard:dashboard_command",
    "tune": "cpuaccel.cli.tune:tune_command",
    "bench": "cpuaccel.cli.bench:bench_command",
    "help": "cpuaccel.cli.help:help_command",
}

EPILOG = """\b
Examples:
  cpuaccel check                       # localhost only, no inventory needed
  cpuaccel check -i inventory.yaml     # every node: reachable, alike, ready?
  cpuaccel check -i inventory.yaml --limit 'workers:!node3' --json
  cpuaccel provision inventory.yaml            # make every node ready (idempotent)
  cpuaccel sync -i inventory.yaml              # push ./ to every node, verified
  cpuaccel run --nodes 1 --ppn 2 train.py      # this machine, 2 ranks
  cpuaccel run -i inventory.yaml --nodes 4 --ppn 4 train.py --epochs 3
  cpuaccel run -i inventory.yaml --detach train.py  # prints the run id, returns
  cpuaccel stop last                           # end it on every node, verified
  cpuaccel submit --nodes 4 --ppn 2 train.py   # a Slurm batch job; prints its ids
  cpuaccel report                              # the newest run: PNG + summary
  cpuaccel ps                                  # the runs of this folder, their state
  cpuaccel logs last -f --rank 0               # follow a run's output
  cpuaccel fetch last --checkpoints            # a run's results from its head node
  cpuaccel dashboard                           # the live page of ./runs (Ctrl-C ends)
  cpuaccel tune --write train.py               # measure ranks x threads, keep the best
  cpuaccel bench net                           # latency, bandwidth, allreduce by size
  cpuaccel config                              # questions -> inventory.yaml, cpuaccel.yaml
  cpuaccel help hosts                          # the host options every verb shares

\b
Exit codes: 0 all well; 1 problems found; 64 bad input; 69 a node unreachable or failed.
"""


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(VERBS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = VERBS.get(cmd_name)
        if target is None:
            return None
        module, _, attr = target.partition(":")
        with paused():  # the verb's modules
            loaded = importlib.import_module(module)
        command = getattr(loaded, attr)
        assert isinstance(command, click.Command)
        command.name = cmd_name  # older click names it after the function
        return command

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        """A verb that does not exist is named with the closest one (``chek``: check)."""
        name = args[0] if args else ""
        if name and name not in VERBS and not name.startswith("-"):
            import difflib  # only for the hint on an unknown verb: off every start-up

            close = difflib.get_close_matches(name, list(VERBS), n=1, cutoff=0.6)
            hint = "see 'cpuaccel --help' for the verbs"
            if close:
                hint = f"did you mean 'cpuaccel {close[0]}'? ({hint})"
            raise UsageError(f"No such command '{name}' of cpuaccel", hint=hint)
        return super().resolve_command(ctx, args)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """Each verb with its docstring's whole first sentence, wrapped, never cut."""
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit=10_000)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(
    cls=LazyGroup,
    epilog=EPILOG,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.version_option(__version__, "-V", "--version", prog_name="cpuaccel")
def cli() -> None:
    """Provision Intel Xeon nodes, sync code to them, and launch PyTorch training with MPI."""


def main() -> None:
    start_command()
    try:
        _main()
    finally:
        # The exit's collections walk the whole heap, over and over while the interpreter
        # tears its modules down, a visible share of a short command (cli/main.py).
        gc.freeze()


def _main() -> None:
    try:
        # `CPUACCEL_RUN_ID=ID cpuaccel run`: the id passed on, this process replaced.
        given_id.hand_over(sys.argv)
        cli.main(standalone_mode=False)
    except CpuaccelError as exc:
        _print_error(str(exc))
        sys.exit(exc.exit_code)
    except click.exceptions.Abort as exc:
        if isinstance(exc.__cause__, EOFError):  # click's word for it, not a Ctrl-C
            _print_error(
                "an input ended where cpuaccel did not expect it (EOFError): a bug\n"
                "  fix: run it again with -vvv and report the output"
            )
            sys.exit(1)
        sys.exit(130)
    except click.ClickException as exc:
        # One error line and a fix, like every other bad input, rather than click's
        # usage block with the error at its end.
        _print_error(f"{exc.format_message()}\n  fix: {_click_hint(exc)}")
        sys.exit(EXIT_USAGE if exc.exit_code == 2 else exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)


def _print_error(text: str) -> None:
    from rich.markup import escape

    from cpuaccel import ui

    ui.stderr().print(f"[bold red]error:[/] {escape(text)}", markup=True, highlight=False)


def _click_hint(exc: click.ClickException) -> str:
    context = getattr(exc, "ctx", None)
    path = context.command_path if context is not None else "cpuaccel"
    return f"see '{path} --help'"
