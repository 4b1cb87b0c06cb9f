"""Options shared by every verb that talks to hosts, with Ansible's names."""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, overload

import click

from cpuaccel import ui
from cpuaccel.config.inventory_choice import choose_inventory
from cpuaccel.config.project import ProjectConfig, discover_config
from cpuaccel.config.settings import Setting
from cpuaccel.connectors.base import DEFAULT_CONNECT_TIMEOUT, ConnectOptions
from cpuaccel.connectors.hostkeys import opt_out_warnings
from cpuaccel.errors import UsageError
from cpuaccel.executor import DEFAULT_FORKS
from cpuaccel.inventory.host import Host
from cpuaccel.inventory.inventory import Inventory, parse_extra_vars
from cpuaccel.inventory.variables import env_name_problem, user_name_problem
from cpuaccel.rank_settings import CHOICES, value_problem
from cpuaccel.ui import escape

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Target:
    """What the shared options select: the inventory, its chosen hosts, how to connect."""

    inventory: Inventory
    hosts: list[Host]
    forks: int
    connect: ConnectOptions
    # The project file (cpuaccel.yaml or an Accelerate config), if any, and what the
    # shared flags themselves said, so that settings can name their source.
    project: ProjectConfig | None = None
    inventory_setting: Setting[str] | None = None
    limit: Setting[str] | None = None
    cli_vars: dict[str, Any] = field(default_factory=dict)
    # --list-hosts, for a command that settles its hosts itself (host_options).
    list_hosts: bool = False


_OPTION_NAMES = (
    "inventory_path",
    "limit",
    "extra_vars",
    "forks",
    "timeout",
    "no_host_key_checking",
    "config_path",
    "user",
    "private_key",
)


def _one_inventory(_ctx: click.Context, _param: click.Parameter, values: Any) -> str | None:
    if len(values) > 1:
        raise UsageError(
            f"several inventories given: {' '.join('-i ' + value for value in values)}",
            hint="cpuaccel reads one inventory: merge them into one file (or list hosts as "
            "-i node1,node2,)",
        )
    return str(values[0]) if values else None


class Seconds(click.FloatRange):
    """A number of seconds in a range, never NaN or infinite: click's FloatRange lets
    ``nan`` through (no comparison with it is true), and a NaN bound never passes."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        return number


def connect_timeout_option(dest: str) -> Callable[[F], F]:
    """``-T/--connect-timeout``, as every verb that reaches a host spells it."""
    return click.option(
        "-T",
        "--connect-timeout",
        dest,
        type=Seconds(0.1, 3600),
        default=DEFAULT_CONNECT_TIMEOUT,
        show_default=True,
        help="Seconds to wait for a host to connect.",
    )


# The shared options, in --help order (each application makes new click Options).
_SHARED_OPTIONS: list[Callable[[Any], Any]] = [
    click.option(
        "-i",
        "--inventory",
        "inventory_path",
        metavar="FILE",
        multiple=True,  # Ansible merges several -i; cpuaccel reads one: said, not dropped
        callback=_one_inventory,
        help="Ansible inventory (YAML or INI, with group_vars/ and host_vars/ beside "
        "it), an MPI hostfile, hosts as 'node1,node2,', or a Slurm partition's nodes as "
        "'slurm:PARTITION' ('slurm:' the default partition). Default: $CPUACCEL_INVENTORY, "
        "else ./inventory.yaml, else localhost only.",
    ),
    click.option(
        "-c",
        "--config",
        "config_path",
        metavar="FILE",
        help="Project file with run defaults, or Accelerate's default_config.yaml. "
        "Default: ./cpuaccel.yaml if present. Flags override it.",
    ),
    click.option(
        "-l", "--limit", metavar="PATTERN", help="Select hosts: names, groups, globs, !excl."
    ),
    click.option(
        "-e",
        "--extra-vars",
        "extra_vars",
        multiple=True,
        metavar="KEY=VALUE",
        help="Set a variable on every host, over the inventory (repeatable; @file.yaml).",
    ),
    click.option(
        "-f",
        "--forks",
        type=click.IntRange(1, 1024),
        default=DEFAULT_FORKS,
        show_default=True,
        help="Hosts worked on at once.",
    ),
    connect_timeout_option("timeout"),
    click.option(
        "--no-host-key-checking",
        is_flag=True,
        help="Accept unknown host keys (like ansible_host_key_checking: false). Unsafe.",
    ),
    click.option(
        "-u",
        "--user",
        metavar="USER",
        help="Log in as USER where the inventory sets no ansible_user (as Ansible's -u: "
        "a host's ansible_user, or -e ansible_user=..., wins over it).",
    ),
    click.option(
        "--private-key",
        "--key-file",
        "private_key",
        metavar="FILE",
        help="SSH private key where the inventory sets no ansible_ssh_private_key_file "
        "(as Ansible's; also used by rsync and MPI's ssh).",
    ),
    click.option(
        "--list-hosts",
        is_flag=True,
        help="Print the hosts this command would use and exit; contacts no host.",
    ),
    click.option("-v", "--verbose", "verbosity", count=True, help=ui.VERBOSITY_HELP),
]


@overload
def host_options(func: F) -> F: ...


@overload
def host_options(*, settles_hosts: bool) -> Callable[[F], F]: ...


def host_options(func: F | None = None, *, settles_hosts: bool = False) -> Any:
    """Add the shared options; the command receives them as one ``target: Target``.

    The target is resolved (the inventory read, --limit applied) before the command's
    body runs, so a bad inventory stops every verb the same way. --list-hosts prints
    the selected hosts and returns before the body, unless ``settles_hosts``: then the
    command narrows the hosts itself (run's --nodes, head first) and calls
    ``list_hosts_and_exit`` with its final choice.
    """
    if func is None:
        return functools.partial(host_options, settles_hosts=settles_hosts)

    @functools.wraps(func)
    def command(**kwargs: Any) -> Any:
        ui.set_verbosity(kwargs.pop("verbosity"))
        list_hosts = kwargs.pop("list_hosts")
        given = {name: kwargs.pop(name) for name in _OPTION_NAMES}
        # `cpuaccel provision inventory.yaml`: the inventory as an argument, like
        # ansible-playbook's habit of naming files on the command line.
        positional = kwargs.pop("inventory_file", None)
        if positional:
            if given["inventory_path"] and given["inventory_path"] != positional:
                raise UsageError(
                    f"two inventories given: -i {given['inventory_path']} and {positional}",
                    hint="give the inventory once",
                )
            given["inventory_path"] = positional
        # `check --slurm [PARTITION]`: the same as -i slurm:PARTITION.
        slurm = kwargs.pop("slurm_partition", None)
        if slurm is not None:
            if given["inventory_path"]:
                raise UsageError(
                    f"two inventories given: -i {given['inventory_path']} and --slurm {slurm}",
                    hint="give either -i or --slurm",
                )
            given["inventory_path"] = f"slurm:{slurm}"
        target = resolve_target(**given)
        if list_hosts and not settles_hosts:
            print_hosts([host.name for host in target.hosts])
            return None
        if settles_hosts:
            target = dataclasses.replace(target, list_hosts=list_hosts)
        return func(target=target, **kwargs)

    for decorator in reversed(_SHARED_OPTIONS):
        command = decorator(command)
    return command


def resolve_target(
    inventory_path: str | None,
    limit: str | None,
    extra_vars: tuple[str, ...],
    forks: int,
    timeout: float,
    no_host_key_checking: bool,
    config_path: str | None = None,
    user: str | None = None,
    private_key: str | None = None,
) -> Target:
    _check_login(user, private_key)
    project = discover_config(config_path, inventory_path)
    cli_vars = parse_extra_vars(extra_vars)
    choice = choose_inventory(inventory_path, project)
    inventory = choice.load(cli_vars)
    if choice.slurm is not None:  # no -i: the hosts are the allocation's, said once
        names = ", ".join(choice.slurm.nodes)
        ui.stderr().print(f"hosts: the nodes of {choice.slurm.label} ({escape(names)})")
    limit_setting = Setting("limit", limit, "flag", "--limit") if limit else None
    if limit is None and project is not None and project.get("limit"):
        limit = str(project.get("limit"))
        limit_setting = Setting("limit", limit, "project file", project.where("limit"))
    hosts = inventory.select(limit)
    connect = ConnectOptions(
        connect_timeout=timeout,
        host_key_checking=False if no_host_key_checking else None,
        user=user,
        private_key=_key_path(private_key),
    )
    warn([*(project.warnings if project else []), *inventory.warnings])
    warn(opt_out_warnings(hosts, connect))  # an opt-out of host key checks is never silent
    return Target(
        inventory, hosts, forks, connect, project, choice.setting, limit_setting, cli_vars
    )


def _check_login(user: str | None, private_key: str | None) -> None:
    """-u and --private-key are checked as the inventory's ansible_user and key are:
    before anything connects, naming the flag."""
    if user is not None and user_name_problem(user) is not None:
        raise UsageError(
            f"-u/--user {user_name_problem(user)}",
            hint="give a login name of letters, digits, '.', '_' and '-', e.g. -u ubuntu",
        )
    if private_key is not None:
        path = Path(private_key).expanduser()
        if not path.is_file():
            state = "does not exist" if not path.exists() else "is not a regular file"
            raise UsageError(
                f"--private-key {private_key}: the file {state}",
                hint="give the path of an SSH private key, e.g. --private-key ~/.ssh/id_ed25519",
            )


def _key_path(private_key: str | None) -> str | None:
    """The key as an absolute path (rsync and MPI's ssh run in other folders, the latter
    on the head node); a ``~`` path is kept for each ssh to expand, as the inventory's."""
    if private_key is None or private_key.startswith("~"):
        return private_key
    return os.path.abspath(private_key)


def print_hosts(names: Sequence[str]) -> None:
    """--list-hosts, as Ansible prints it: a count, then one name a line."""
    out = ui.stdout()
    out.print(f"  hosts ({len(names)}):")
    for name in names:
        out.print(f"    {escape(name)}")


def list_hosts_and_exit(target: Target, names: Sequence[str]) -> None:
    """For a command that settles its own hosts: with --list-hosts, print them and end
    (exit 0) before anything is contacted."""
    if target.list_hosts:
        print_hosts(names)
        raise click.exceptions.Exit(0)


# Names whose value is a credential (HF_TOKEN, AWS_SECRET_ACCESS_KEY, ...): `--env NAME`
# passes them through secret.env (0600 on the nodes), never env.sh, argv or the logs.
SECRET_NAME = re.compile("TOKEN|KEY|SECRET|PASSWORD", re.IGNORECASE)


class EnvFlags(dict[str, str]):
    """``--env``'s plain variables; ``secret`` holds those passed by name whose name looks
    like a credential (their values must never be printed)."""

    def __init__(self) -> None:
        super().__init__()
        self.secret: dict[str, str] = {}


def parse_env(items: tuple[str, ...], environ: Mapping[str, str] | None = None) -> EnvFlags:
    """``--env KEY=VALUE`` items (of run and config show) as a mapping; ``--env NAME``
    passes the controller's value of NAME, as ``mpirun -x NAME`` does."""
    here = os.environ if environ is None else environ
    env = EnvFlags()
    for item in items:
        key, sep, value = item.partition("=")
        if env_name_problem(key) is not None:
            raise UsageError(
                f"--env {item!r}: expected KEY=VALUE or NAME, KEY a variable name",
                hint="e.g. --env FI_PROVIDER=tcp, or --env HF_TOKEN (its value here)",
            )
        problem = value_problem(key, value if sep else here.get(key, ""))
        if problem is not None:
            example = CHOICES[key][0][0]
            raise UsageError(f"--env {key}: {problem}", hint=f"e.g. --env {key}={example}")
        if sep:
            env[key] = value
            env.secret.pop(key, None)
            continue
        if key not in here:
            raise UsageError(
                f"--env {key}: {key} is not set here, so there is no value to pass",
                hint=f"export {key} before running cpuaccel, or write --env {key}=VALUE",
            )
        if SECRET_NAME.search(key):
            env.secret[key] = here[key]
            env.pop(key, None)
        else:
            env[key] = here[key]
    return env


def beside_playbook(target: Target, folder: Path) -> Target:
    """The target with the group_vars/ and host_vars/ beside a playbook in ``folder``
    read too (over those beside the inventory), as ansible-playbook reads them."""
    inventory = target.inventory.with_playbook_vars(folder)
    if inventory is target.inventory:
        return target
    warn(inventory.warnings[len(target.inventory.warnings) :])
    hosts = [inventory.hosts[host.name] for host in target.hosts]
    return dataclasses.replace(target, inventory=inventory, hosts=hosts)


def warn(messages: list[str]) -> None:
    if not messages:
        return  # no console made, so rich is not loaded for nothing (cpuaccel/ui.py)
    err = ui.stderr()
    for message in messages:
        err.print(f"[yellow]warning:[/] {escape(message)}")
