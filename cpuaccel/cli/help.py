"""``cpuaccel help [hosts|VERB]``: the host options every verb shares, in full; a
verb's help; or the list of verbs."""

from __future__ import annotations

from typing import Any

import click

from cpuaccel import ui
from cpuaccel.cli.options import FULL_HOST_HELP, host_options
from cpuaccel.errors import UsageError

# The verbs whose --help names the host options in one row (cli/options.py's
# host_options).
HOST_VERBS = "check, provision, sync, run, tune, stop and config show"


def _hosts_text(parent: click.Context) -> str:
    @host_options
    def _hosts(target: Any) -> None:  # pragma: no cover - never invoked
        pass

    command = click.Command("hosts", callback=_hosts, params=_hosts.__click_params__)  # type: ignore[attr-defined]
    command.params.reverse()  # click's decorators stack them last first
    ctx = click.Context(command, info_name="hosts", parent=parent)
    ctx.meta[FULL_HOST_HELP] = True
    command.add_help_option = False
    formatter = ctx.make_formatter()
    formatter.write_text(
        f"The host options of {HOST_VERBS}: which hosts a verb works on, and how it logs "
        "in. Each verb's --help names them in one row."
    )
    command.format_options(ctx, formatter)
    return formatter.getvalue().rstrip("\n")


@click.command("help")
@click.argument("topic", required=False, metavar="[hosts|VERB]")
@click.pass_context
def help_command(ctx: click.Context, topic: str | None) -> None:
    """Show the host options every verb shares in full (hosts), or a verb's help."""
    root = ctx.find_root()
    group = root.command
    out = ui.stdout()
    if topic is None:
        out.print(group.get_help(root), markup=False, highlight=False)
        return
    if topic == "hosts":
        out.print(_hosts_text(root), markup=False, highlight=False)
        return
    assert isinstance(group, click.Group)
    verb = group.get_command(root, topic)
    if verb is None or topic == "help":
        raise UsageError(
            f"cpuaccel help {topic}: no such topic",
            hint=f"give hosts, or a verb: {', '.join(group.list_commands(root))}",
        )
    sub = click.Context(verb, info_name=topic, parent=root)
    out.print(verb.get_help(sub), markup=False, highlight=False)
