"""The ``cpuaccel config`` questionnaire: the questions ``accelerate config`` asks for CPU
training, answered once on the controller instead of on every node.

Each question shows its default and validates the answer as typed (a wrong answer is
asked again, with the reason). Answers given as flags are not asked; with ``--yes``
nothing is asked and every other answer takes its default.
"""

from __future__ import annotations

import getpass
import ipaddress
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from cpuaccel.config.kinds import OneOf, WholeNumber
from cpuaccel.config.settings import BY_NAME, INVENTORY_VARIABLES, Entry
from cpuaccel.errors import CpuaccelError, InventoryError, UsageError
from cpuaccel.inventory import variables
from cpuaccel.inventory.hostfile import looks_like_hostfile
from cpuaccel.inventory.inventory import Inventory
from cpuaccel.sourcefile import read_source

_HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9\-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9\-]{0,61}[A-Za-z0-9])?)*$"
)


# The run settings asked under "Processes", in this order: each entry's question
# (config/settings.py) is the Answers field of its name.
SETTINGS_ASKED = ("master_port", "launcher", "ccl_workers", "mixed_precision")


@dataclass
class Answers:
    mode: str | None = None  # "single" or "multi"
    source: str | None = None  # an existing hostfile or inventory to start from
    machines: int | None = None
    hosts: list[str] = field(default_factory=list)
    user: str | None = None
    ssh_port: int | None = None
    key: str | None = None
    ppn: int | None = None
    head: str | None = None
    master_port: int | None = None
    launcher: str | None = None
    ccl_workers: int | None = None
    mixed_precision: str | None = None
    python: str | None = None
    workdir: str | None = None
    # The source is a YAML inventory: its SSH and Python settings stay in it.
    source_is_inventory: bool = False


def _checked(check: Callable[[str], Any]) -> Callable[[str], Any]:
    """click.prompt asks again when the conversion raises click's UsageError."""

    def convert(text: str) -> Any:
        try:
            return check(str(text).strip())
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None

    return convert


def check_host(text: str) -> str:
    if re.fullmatch(r"[xX]+(\.[xX]+)+", text):
        raise ValueError(f"{text!r} is a placeholder: type the node's name or IP address")
    try:
        address = str(ipaddress.ip_address(text))
    except ValueError:
        pass
    else:
        problem = variables.scope_id_problem(address)
        if problem is not None:
            raise ValueError(problem)
        return address
    if not _HOSTNAME.match(text):
        raise ValueError(f"{text!r} is not a host name or IP address")
    return text


def check_int(low: int, high: int) -> Callable[[str], int]:
    def check(text: str) -> int:
        if not text.isdigit() or not low <= int(text) <= high:
            raise ValueError(f"type a whole number from {low} to {high}")
        return int(text)

    return check


def check_choice(options: tuple[str, ...]) -> Callable[[str], str]:
    def check(text: str) -> str:
        text = text.lower()
        matches = [o for o in options if o.startswith(text)] if text else []
        if text in options:
            return text
        if len(matches) == 1:
            return matches[0]
        raise ValueError(f"type one of: {', '.join(options)}")

    return check


def check_key(text: str) -> str:
    if text and not Path(os.path.expanduser(text)).is_file():
        raise ValueError(f"no key file at {text} (leave empty to use ssh's defaults)")
    return text


def check_word(text: str) -> str:
    """A user name, path or interpreter: one word (it lands in YAML and shell lines)."""
    if not text or any(c.isspace() for c in text):
        raise ValueError("type one word without spaces, e.g. /opt/venv/bin/python")
    return text


def check_source(text: str) -> str:
    if not text:
        return text
    if not Path(text).is_file():
        raise ValueError(f"no file at {text} (leave empty to type the addresses)")
    try:
        Inventory.load(text).check_declared(INVENTORY_VARIABLES)
    except CpuaccelError as exc:
        raise ValueError(str(exc)) from None
    return text


def local_sockets() -> int:
    """This machine's sockets: the default ranks per node (one per socket)."""
    ids = set()
    for path in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/topology/physical_package_id"):
        try:
            ids.add(path.read_text().strip())
        except OSError:
            continue
    return max(1, len(ids))


def default_key() -> str:
    for name in ("id_ed25519", "id_ecdsa", "id_rsa"):
        path = Path.home() / ".ssh" / name
        if path.is_file():
            return f"~/.ssh/{name}"
    return ""


class Asker:
    """Asks on the terminal, or, with ``--yes``, takes the default without asking."""

    def __init__(self, interactive: bool) -> None:
        self.interactive = interactive

    def section(self, title: str) -> None:
        if self.interactive:
            click.echo(f"\n{title}\n" + "-" * len(title))

    def ask(self, question: str, default: Any, check: Callable[[str], Any], flag: str) -> Any:
        if not self.interactive:
            if default is None:
                raise UsageError(
                    f"--yes needs {flag}", hint=f"pass {flag}, or answer interactively"
                )
            return check(str(default))
        return click.prompt(
            question,
            default=default,
            value_proc=_checked(check),
            show_default=default not in (None, ""),
        )


def run_questionnaire(given: Answers, interactive: bool) -> Answers:
    a = given
    asker = Asker(interactive)
    asker.section("Machines")
    multi = _ask_machines(a, asker)
    if multi and not a.source_is_inventory:
        asker.section("SSH (how cpuaccel reaches the machines)")
        _ask_ssh(a, asker)
    asker.section("Processes")
    _ask_processes(a, asker, multi)
    if not a.source_is_inventory:
        asker.section("Python environment on the nodes")
        _ask_environment(a, asker, multi)
    return a


def _ask_machines(a: Answers, asker: Asker) -> bool:
    """Single or multi (the answer), the file to start from, and the machines' addresses."""
    if a.mode is None:
        a.mode = "multi" if (a.hosts or a.source) else None
    if a.mode is None:
        a.mode = asker.ask(
            "Which type of machine setup? (single: this machine; multi: several machines)",
            "single",
            check_choice(("single", "multi")),
            "--single or --multi",
        )
    multi = a.mode == "multi"
    if multi and not a.hosts and a.source is None:
        a.source = (
            asker.ask(
                "An existing MPI hostfile or inventory to start from? "
                "(path; empty to type addresses)",
                "",
                check_source,
                "--from",
            )
            or None
        )
    if a.source:
        inventory = Inventory.load(a.source).check_declared(INVENTORY_VARIABLES)
        text = read_source(a.source, InventoryError, "inventory file", "check the path")
        a.source_is_inventory = not looks_like_hostfile(text)
        a.hosts = a.hosts or list(inventory.hosts)
    if multi and not a.hosts:
        _ask_hosts(a, asker)
    if not multi:
        a.hosts = ["localhost"]
    return multi


def _ask_hosts(a: Answers, asker: Asker) -> None:
    machines = a.machines or asker.ask(
        "How many machines will you use?", 2, check_int(1, 4096), "--hosts"
    )
    for i in range(machines):
        role = " (the main node: rank 0 and mpirun)" if i == 0 else ""
        while True:
            host = asker.ask(f"Address of machine {i}{role}", None, check_host, "--hosts")
            if host not in a.hosts:
                break
            click.echo(f"Error: {host} is already machine {a.hosts.index(host)}")
        a.hosts.append(host)


def _ask_ssh(a: Answers, asker: Asker) -> None:
    if a.user is None:
        a.user = asker.ask("SSH user", getpass.getuser(), variables.user_name, "--user")
    if a.ssh_port is None:
        a.ssh_port = asker.ask("SSH port", 22, check_int(1, 65535), "--ssh-port")
    if a.key is None:
        a.key = asker.ask(
            "SSH private key (empty: ssh's defaults)", default_key(), check_key, "--key"
        )


def _ask_processes(a: Answers, asker: Asker, multi: bool) -> None:
    if a.ppn is None:
        a.ppn = asker.ask(
            "How many processes per machine?", local_sockets(), check_int(1, 1024), "--ppn"
        )
    if multi and a.head is None:
        a.head = (
            a.hosts[0]
            if len(a.hosts) == 1
            else asker.ask(
                f"Which machine hosts the main process? ({', '.join(a.hosts)})",
                a.hosts[0],
                check_choice(tuple(a.hosts)),
                "--head",
            )
        )
    for name in SETTINGS_ASKED:
        if getattr(a, name) is None:
            setattr(a, name, _ask_setting(BY_NAME[name], asker))


def _ask_setting(entry: Entry, asker: Asker) -> Any:
    """The settings table's question for ``entry``: its default (as `cpuaccel run`
    takes it), checked by its kind's bounds or choices."""
    question, kind = entry.question, entry.kind
    check: Callable[[str], Any]
    if question is not None and isinstance(kind, WholeNumber) and kind.high is not None:
        check = check_int(kind.low, kind.high)
    elif question is not None and isinstance(kind, OneOf):
        check = check_choice(question.choices or kind.choices)
    else:
        raise TypeError(f"{entry.name}: no question of the questionnaire's kinds")
    return asker.ask(question.text, entry.default, check, question.flag)


def _ask_environment(a: Answers, asker: Asker, multi: bool) -> None:
    if a.python is None:
        a.python = asker.ask(
            "Python on every node, the same path everywhere: an interpreter "
            "(.../bin/python3), or a venv folder for `cpuaccel provision` to create",
            sys.executable,
            check_word,
            "--python",
        )
    if a.workdir is None and multi:
        a.workdir = asker.ask(
            "Folder on the nodes for the synced code and runs",
            "~/cpuaccel",
            check_word,
            "--workdir",
        )
