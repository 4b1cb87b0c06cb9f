"""``cpuaccel provision``: run a playbook (by default the one that makes nodes ready).

The run is the API's (api/provisioning.py); this verb adds what only a command line
has: the listings, the syntax check, asking -K's password, and the printed recap."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from cpuaccel import ui
from cpuaccel.api.provisioning import (
    ProvisionRequest,
    load_playbook,
    prepare,
    run_playbook,
    tag_set,
)
from cpuaccel.api.target import Target
from cpuaccel.cli.options import bundled, host_options, print_hosts
from cpuaccel.errors import UsageError
from cpuaccel.inventory.variables import user_name_problem
from cpuaccel.playbook import loader
from cpuaccel.playbook.become import CliBecome
from cpuaccel.playbook.display import Display, ProgressBar
from cpuaccel.playbook.loader import Playbook
from cpuaccel.playbook.modules import MODULES
from cpuaccel.playbook.strategy import Listener, PlayOptions, default_playbook
from cpuaccel.ui import escape

EPILOG = """\b
Examples:
  cpuaccel provision inventory.yaml                  # fresh nodes -> ready to train
  cpuaccel provision inventory.yaml --check --diff   # what would change; changes nothing
  cpuaccel provision inventory.yaml -e cpuaccel_stack=ipex-legacy
  cpuaccel provision inventory.yaml --limit node3 --tags stack
  cpuaccel provision -i inventory.yaml --playbook site.yaml --json | jq .stats
  cpuaccel provision --list-modules
  cpuaccel provision inventory.yaml -b -K           # tasks as root via sudo (asks once)
  cpuaccel provision --playbook site.yaml --list-tasks   # no inventory needed
  cpuaccel provision --playbook site.yaml --syntax-check
  cpuaccel provision -i inventory.yaml site.yml   # ansible-playbook's order works too
  cpuaccel provision inventory.yaml --list-hosts -u ubuntu --private-key ~/.ssh/id_ed25519

\b
The default playbook (playbooks/provision.yaml) creates cpuaccel_workdir and a venv at
cpuaccel_venv, pushes a wheelhouse the controller fills (nodes need no index), installs
the stack (cpuaccel_stack: upstream or ipex-legacy) and cpuaccel itself, finds
setvars.sh, verifies torch under mpirun, and fails any node whose versions differ.

\b
Exit codes: 0 every host succeeded; 69 a host failed or was unreachable; 64 the
playbook, inventory or arguments were bad (then nothing ran on any node).
"""


def _list_modules() -> None:
    out = ui.stdout()
    for module in MODULES.values():
        where = "controller" if module.on_controller else "node"
        out.print(f"[bold]{module.name}[/] ({where}): {escape(module.summary)}")
        if module.any_args:
            out.print("    any NAME: VALUE pairs")
        for name, arg in module.args.items():
            extra = f" (one of {', '.join(arg.choices)})" if arg.choices else ""
            need = " required" if arg.required else ""
            aliases = f" alias {', '.join(arg.aliases)}" if arg.aliases else ""
            out.print(escape(f"    {name}: {arg.kind}{need}{extra}{aliases}"))


def _list_tasks(playbook: Playbook) -> None:
    out = ui.stdout()
    for play in playbook.plays:
        out.print(f"play: {escape(play.name)} (hosts: {escape(play.hosts)})")
        for task in play.tasks:
            tag_text = f"  tags: {', '.join(sorted(task.tags))}" if task.tags else ""
            # Every part is user text: "[assert]" would otherwise be read as markup.
            out.print(escape(f"  {task.name}  [{task.module}] {task.where}{tag_text}"))


def _list_tags(playbook: Playbook) -> None:
    """Ansible's --list-tags: each play's tags, sorted."""
    out = ui.stdout()
    for play in playbook.plays:
        tags = sorted({tag for task in play.tasks for tag in task.tags})
        text = f"play: {play.name} (hosts: {play.hosts})  TASK TAGS: [{', '.join(tags)}]"
        out.print(escape(text))


def _list_hosts(playbook: Playbook, target: Target) -> None:
    """ansible-playbook's --list-hosts: each play's pattern, within --limit."""
    chosen = {host.name for host in target.hosts}
    for index, play in enumerate(playbook.plays, 1):
        ui.stdout().print(escape(f"play #{index} ({play.hosts}): {play.name}"))
        hosts = target.inventory.select_pattern(play.hosts)
        print_hosts([h.name for h in hosts if h.name in chosen])


def _listener(as_json: bool, diff: bool) -> Listener:
    """What prints the run: a bar only with --json; else a line a task, every host's at
    -v, the commands run on the nodes at -vv."""
    if as_json:
        return ProgressBar()
    return Display(ui.stdout(), verbose=ui.verbosity >= 1, diff=diff, commands=ui.verbosity >= 2)


@dataclass(frozen=True)
class Inspect:
    """--list-tasks, --list-tags and --syntax-check: the playbook read, no host."""

    list_tasks: bool
    list_tags: bool
    syntax_check: bool

    def done(self, path: Path) -> bool:
        """Read the playbook only (no host, so no inventory needed) and print what was
        asked for; True when one of them was."""
        if not (self.list_tasks or self.list_tags or self.syntax_check):
            return False
        playbook = loader.load(path)  # a bad playbook is its one error line, exit 64
        if self.syntax_check:
            text = f"playbook: {path}: syntax OK, {len(playbook.tasks())} task(s)"
            ui.stdout().print(escape(text))
        if self.list_tasks:
            _list_tasks(playbook)
        if self.list_tags:
            _list_tags(playbook)
        return True


def play_options(
    check: bool, diff: bool, tags: tuple[str, ...], skip_tags: tuple[str, ...]
) -> PlayOptions:
    """-C, -D, -t and --skip-tags as the playbook run takes them (become: asked later)."""
    return PlayOptions(check, diff, tag_set(tags), tag_set(skip_tags))


# ---------------------------------------------------------------- become
# Ansible's become flags on ``provision``: ``-b``, ``--become-user``, ``-K``.
#
# Applied as one decorator, so the verb receives a single ``become`` (BecomeFlags) and asks
# for the password only when it is about to contact the nodes (not for --list-tasks).
@dataclass(frozen=True)
class BecomeFlags:
    become: bool
    user: str | None
    ask_pass: bool

    def settle(self) -> CliBecome:
        """The command line's become, asking once (no echo) for the password with -K."""
        if self.user is not None and user_name_problem(self.user) is not None:
            raise UsageError(
                f"--become-user {user_name_problem(self.user)}",
                hint="give a login name, e.g. --become-user root",
            )
        password = None
        if self.ask_pass:
            if not sys.stdin.isatty():
                raise UsageError(
                    "-K (--ask-become-pass) needs a terminal to ask for the password on",
                    hint="set ansible_become_password in a file given as -e @secrets.yaml "
                    "(mode 0600), or run cpuaccel from a terminal",
                )
            # getpass underneath: read from the terminal with echo off, never an argv.
            password = click.prompt(
                "BECOME password", hide_input=True, default="", show_default=False, err=True
            )
        return CliBecome(self.become, self.user, password or None)


def become_options(command: Callable[..., Any]) -> Callable[..., Any]:
    @click.option(
        "-b",
        "--become",
        "become_flag",
        is_flag=True,
        help="Run tasks as become_user (default root) through sudo, as 'become: true'.",
    )
    @click.option(
        "--become-user",
        metavar="USER",
        help="The user -b or 'become: true' runs tasks as (default root).",
    )
    @click.option(
        "-K",
        "--ask-become-pass",
        is_flag=True,
        help="Ask once (no echo) for sudo's password; or set ansible_become_password.",
    )
    @functools.wraps(command)
    def wrapper(
        *args: Any, become_flag: bool, become_user: str | None, ask_become_pass: bool, **kw: Any
    ) -> Any:
        flags = BecomeFlags(become_flag, become_user, ask_become_pass)
        return command(*args, become=flags, **kw)

    return wrapper


# ---------------------------------------------------------------- a playbook as argument
# ``provision -i inv.yaml site.yml``: ansible-playbook's order, the playbook named on the
# command line. The argument is the playbook when its top level is a list (of plays),
# which an inventory's never is (a mapping of groups, or INI); else it is the inventory.
_PLAYBOOK_SUFFIXES = (".yml", ".yaml")
_HEAD = 65536  # bytes read to find the first line that says list or mapping


def is_playbook(path: str) -> bool:
    """Whether the YAML file at ``path`` starts with a list item (``- hosts: ...``)."""
    if not path.lower().endswith(_PLAYBOOK_SUFFIXES) or not os.path.isfile(path):
        return False
    try:
        with open(path, "rb") as file:
            head = file.read(_HEAD).decode("utf-8", errors="replace")
    except OSError:
        return False
    for line in head.splitlines():
        text = line.strip()
        if not text or text.startswith("#") or text == "---" or text.startswith("%"):
            continue
        return line.startswith("- ") or line.rstrip() == "-"
    return False


def playbook_argument(command: Callable[..., Any]) -> Callable[..., Any]:
    """The [INVENTORY] argument taken as the playbook when it is one (``is_playbook``)."""

    @functools.wraps(command)
    def wrapper(**kw: Any) -> Any:
        given = kw.get("inventory_file")
        if given and is_playbook(given):
            if kw.get("playbook_path") and kw["playbook_path"] != given:
                raise UsageError(
                    f"two playbooks given: --playbook {kw['playbook_path']} and {given}",
                    hint="give the playbook once",
                )
            kw["playbook_path"], kw["inventory_file"] = given, None
        return command(**kw)

    return wrapper


@click.command(epilog=EPILOG)
@click.argument("inventory_file", required=False, metavar="[INVENTORY|PLAYBOOK]")
@playbook_argument
@host_options(settles_hosts=True)  # --list-hosts: each play's hosts, as ansible-playbook
@click.option(
    "--playbook",
    "playbook_path",
    metavar="FILE",
    type=click.Path(dir_okay=False),
    help="Playbook to run instead of cpuaccel's default provision.yaml.",
)
@click.option("-C", "--check", is_flag=True, help="Report what would change; change nothing.")
@click.option("-D", "--diff", is_flag=True, help="Show the text changes of copy and template.")
@click.option("-t", "--tags", multiple=True, metavar="TAGS", help="Only tasks with these tags.")
@click.option("--skip-tags", multiple=True, metavar="TAGS", help="Leave out tasks with these tags.")
@click.option("--json", "as_json", is_flag=True, help="Print the recap and results as JSON.")
@click.option("--list-tasks", is_flag=True, help="List the playbook's tasks and exit (no host).")
@click.option("--list-tags", is_flag=True, help="List the playbook's tags and exit (no host).")
@click.option(
    "--syntax-check", is_flag=True, help="Validate the whole playbook and exit (no host)."
)
@click.option(
    "--list-modules", is_flag=True, is_eager=True, help="List modules and arguments, and exit."
)
@become_options
@bundled("play", play_options, "check", "diff", "tags", "skip_tags")
@bundled("inspect", Inspect, "list_tasks", "list_tags", "syntax_check")
def provision_command(
    target: Target,
    playbook_path: str | None,
    play: PlayOptions,
    inspect: Inspect,
    as_json: bool,
    list_modules: bool,
    become: BecomeFlags,
) -> None:
    """Run an Ansible-style playbook on every node: idempotent, in parallel, with a recap.

    A second run on the same nodes reports changed=0: that is the contract.
    """
    if list_modules:
        _list_modules()
        return
    if inspect.done(Path(playbook_path) if playbook_path else default_playbook()):
        return
    if target.list_hosts:
        _, playbook, target = load_playbook(target, playbook_path)
        _list_hosts(playbook, target)
        return
    prepared = prepare(ProvisionRequest(target, playbook_path, play))
    prepared = prepared.becoming(become.settle())  # -K asks here, before any node is contacted
    listener = _listener(as_json, play.diff)
    found = run_playbook(prepared, listener)
    if as_json:
        ui.print_json(found.to_json())
    else:
        assert isinstance(listener, Display)
        listener.recap(found.stats, found.seconds)
    sys.exit(found.exit_code)
