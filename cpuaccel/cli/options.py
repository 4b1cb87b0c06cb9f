"""The options verbs share: one declaration each, so no two verbs drift apart.

- the host options of every verb that talks to hosts, with Ansible's names (``-i -l -e
  -f -T -c -u --private-key``), turned into one :class:`Target`;
- the options of the settings table (config/settings.py) that run, submit, tune and
  config show take, with the spellings Accelerate and torchrun users type
  (``--nproc_per_node``, ``--num_processes``, ...), collected into one mapping;
- how ``ps``, ``logs``, ``fetch`` and ``dashboard`` reach a recorded run's head;
- the check that SCRIPT is a Python script, for ``run``, ``submit`` and ``tune``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import stat
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, overload

import click
from click.core import ParameterSource

from cpuaccel import ui
from cpuaccel.config.effective import resolve
from cpuaccel.config.inventory_choice import choose_inventory
from cpuaccel.config.kinds import UNSET_WORD, Duration, OneOf, Switch, WholeNumber
from cpuaccel.config.project import ProjectConfig
from cpuaccel.config.project_choice import discover_config
from cpuaccel.config.settings import (
    ALIAS_VERBS,
    SUBMIT,
    TABLE,
    Entry,
    Flag,
    LaunchSettings,
    Setting,
    for_verb,
)
from cpuaccel.connectors.base import Connector
from cpuaccel.connectors.connect_options import DEFAULT_CONNECT_TIMEOUT, ConnectOptions
from cpuaccel.connectors.hostkeys import opt_out_warnings
from cpuaccel.errors import EXIT_NODE_FAILED, HostError, UsageError
from cpuaccel.executor import DEFAULT_FORKS, ConnectionPool
from cpuaccel.inventory import variables
from cpuaccel.inventory.host import Host
from cpuaccel.inventory.inventory import Inventory, parse_extra_vars
from cpuaccel.inventory.variables import env_name_problem, user_name_problem
from cpuaccel.rank_settings import CHOICES, value_problem
from cpuaccel.ui import escape

if TYPE_CHECKING:  # runs.records reads Slurm's queue: only ps, logs and fetch need it
    from cpuaccel.history.records import RunRecord

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

    def settings(self, flags: Mapping[str, Any], hosts: list[Host] | None = None) -> LaunchSettings:
        """The run settings of ``flags`` on ``hosts`` (default: the selected ones), the
        head nameable by a hostname an earlier run recorded (config.effective.resolve)."""
        chosen = self.hosts if hosts is None else hosts
        return resolve(
            flags, self.project, self.inventory, chosen, self.cli_vars, recorded_hostnames
        )


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


def connect_timeout_option(dest: str, cls: type[click.Option] = click.Option) -> Callable[[F], F]:
    """``-T/--connect-timeout``, as every verb that reaches a host spells it."""
    return click.option(
        "-T",
        "--connect-timeout",
        dest,
        cls=cls,
        type=Seconds(0.1, 3600),
        default=DEFAULT_CONNECT_TIMEOUT,
        show_default=True,
        help="Seconds to wait for a host to connect.",
    )


# A verb's --help names the shared options in one row; `cpuaccel help hosts` shows each
# in full (the context's meta says which).
FULL_HOST_HELP = "cpuaccel.host_options_in_full"
HOST_OPTIONS_HELP = (
    "Host options: the inventory, the hosts selected, the login and connection. The same "
    "for every verb that reaches hosts: `cpuaccel help hosts` shows them in full."
)


class SharedOption(click.Option):
    """One of the shared host options."""

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        if ctx.meta.get(FULL_HOST_HELP):
            return super().get_help_record(ctx)
        if self.name != "inventory_path":  # the first: it stands for them all
            return None
        shared = [p for p in ctx.command.params if isinstance(p, SharedOption)]
        return " ".join(p.opts[0] for p in shared), HOST_OPTIONS_HELP


# The shared options, in --help order (each application makes new click Options).
_SHARED_OPTIONS: list[Callable[[Any], Any]] = [
    click.option(
        "-i",
        "--inventory",
        "inventory_path",
        cls=SharedOption,
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
        cls=SharedOption,
        metavar="FILE",
        help="Project file with run defaults, or Accelerate's default_config.yaml. "
        "Default: ./cpuaccel.yaml if present. Flags override it.",
    ),
    click.option(
        "-l",
        "--limit",
        cls=SharedOption,
        metavar="PATTERN",
        help="Select hosts: names, groups, globs, !excl.",
    ),
    click.option(
        "-e",
        "--extra-vars",
        "extra_vars",
        cls=SharedOption,
        multiple=True,
        metavar="KEY=VALUE",
        help="Set a variable on every host, over the inventory (repeatable; @file.yaml).",
    ),
    click.option(
        "-f",
        "--forks",
        cls=SharedOption,
        type=click.IntRange(1, 1024),
        default=DEFAULT_FORKS,
        show_default=True,
        help="Hosts worked on at once.",
    ),
    connect_timeout_option("timeout", cls=SharedOption),
    click.option(
        "--no-host-key-checking",
        cls=SharedOption,
        is_flag=True,
        help="Accept unknown host keys (like ansible_host_key_checking: false). Unsafe.",
    ),
    click.option(
        "-u",
        "--user",
        cls=SharedOption,
        metavar="USER",
        help="Log in as USER where the inventory sets no ansible_user (as Ansible's -u: "
        "a host's ansible_user, or -e ansible_user=..., wins over it).",
    ),
    click.option(
        "--private-key",
        "--key-file",
        "private_key",
        cls=SharedOption,
        metavar="FILE",
        help="SSH private key where the inventory sets no ansible_ssh_private_key_file "
        "(as Ansible's; also used by rsync and MPI's ssh).",
    ),
    click.option(
        "--list-hosts",
        cls=SharedOption,
        is_flag=True,
        help="Print the hosts this command would use and exit; contacts no host.",
    ),
    click.option(
        "-v", "--verbose", "verbosity", cls=SharedOption, count=True, help=ui.VERBOSITY_HELP
    ),
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
                    hint=f"give the inventory once; {positional} is read as a playbook only "
                    "when its top level is a list of plays (- hosts: ...), else pass "
                    "--playbook FILE",
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
    hosts = inventory.select(limit, hostnames=recorded_hostnames)
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


def recorded_hostnames() -> Mapping[str, list[str]]:
    """The nodes' own hostnames the project's newest runs recorded, by hostname: read
    only when a host is asked for by a name the inventory does not have."""
    from cpuaccel.history.records import known_hostnames

    return known_hostnames()


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


class EnvFlags(dict[str, str]):
    """``--env``'s plain variables; ``secret`` holds those passed by name whose name looks
    like a credential (their values must never be printed)."""

    def __init__(self) -> None:
        super().__init__()
        self.secret: dict[str, str] = {}


def parse_env(items: tuple[str, ...], environ: Mapping[str, str] | None = None) -> EnvFlags:
    """``--env KEY=VALUE`` items (of run, submit, tune and config show) as a mapping;
    ``--env NAME`` passes the controller's value of NAME, as ``mpirun -x NAME`` does,
    through secret.env when NAME looks like a credential's (whose value is never given
    here: ``variables.secret_value_problem``)."""
    here = os.environ if environ is None else environ
    env = EnvFlags()
    for item in items:
        key, sep, value = item.partition("=")
        if env_name_problem(key) is not None:
            raise UsageError(
                f"--env {item!r}: expected KEY=VALUE or NAME, KEY a variable name",
                hint="e.g. --env FI_PROVIDER=tcp, or --env HF_TOKEN (its value here)",
            )
        secret = variables.secret_value_problem(key)
        if sep and secret is not None:  # the value is not shown: it is the secret
            raise UsageError(f"--env {key}=...: {secret}", hint=variables.secret_value_hint(key))
        problem = value_problem(key, value if sep else here.get(key, ""))
        if problem is not None:
            example = CHOICES[key][0][0]
            raise UsageError(f"--env {key}: {problem}", hint=f"e.g. --env {key}={example}")
        if sep:
            env[key] = value
            continue
        if key not in here:
            raise UsageError(
                f"--env {key}: {key} is not set here, so there is no value to pass",
                hint=f"export {key} before running cpuaccel, or write --env {key}=VALUE",
            )
        if secret is not None:
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


# ---------------------------------------------------------------- the settings' options
# The options of the settings table (config/settings.py) for run, submit, tune and
# config show: each verb declares those the table gives it, from the entry's flag (its
# spellings, metavar and help) and kind (the click type: the same bounds and choices as
# the project file's check). run, tune and config show also take the spellings that
# ``accelerate launch`` and torchrun users type (--num_machines, --nproc_per_node,
# --master_addr, ...), hidden from the option list and named in the epilog. The command
# receives them all as one ``flags`` mapping, the one ``config.effective.resolve`` reads,
# whose ``flag_names`` entry keeps the spelling typed, so that config show and errors
# name it.
#
# An option-looking SCRIPT is refused before anything is read: run passes unknown
# options through (everything after SCRIPT is the script's), so an option it does not
# know, typed before SCRIPT, would otherwise be taken as the script.

PRECISION_CHOICES = variables.PRECISION_CHOICES  # the same words in config and run
_EPILOG_COLUMN = 28


def _aliases_epilog() -> str:
    lines = ["\b", "accelerate launch / torchrun spellings (the same settings):"]
    for entry in TABLE:
        if entry.flag is None or entry.flag.aliases_help is None:
            continue
        typed, meaning = entry.flag.aliases_help
        gap = " " * (_EPILOG_COLUMN - len(typed) + 1) if len(typed) < _EPILOG_COLUMN else "   "
        lines.append(f"  {typed}{gap}{meaning}")
    return "\n".join(lines) + "\n"


EPILOG = _aliases_epilog()


class FlagValues(dict[str, Any]):
    """The flags mapping ``config.effective.resolve`` reads: each setting's value by name
    (None: not given), ``flag_names`` (the spelling each was typed with), and ``env`` and
    ``secret_env`` from --env. ``typed`` holds each given flag's value as click read it,
    before any conversion, for a verb that hands it on (submit)."""

    def __init__(self) -> None:
        super().__init__()
        self.typed: dict[str, Any] = {}


def setting_options(verb: str, *, hidden: Collection[str] = ()) -> Callable[[F], F]:
    """Declare the options the settings table gives ``verb`` (run, submit, tune or show);
    the command receives them as one ``flags: FlagValues``. ``hidden``: settings whose
    flag is taken but left out of --help (tune refuses them, naming why)."""

    def apply(func: F) -> F:
        @functools.wraps(func)
        def command(**kwargs: Any) -> Any:
            script = kwargs.get("script")
            if script is not None and verb != SUBMIT:  # submit says it in its own words
                refuse_option_as_script(script)
            if script is not None:
                note_options_after_script(script, kwargs.get("script_args") or ())
            flags = collect(verb, kwargs, click.get_current_context())
            return func(flags=flags, **kwargs)

        for declare in reversed(_declarations(verb, hidden)):
            command = declare(command)
        return command  # type: ignore[return-value]

    return apply


def _own_dest(entry: Entry) -> str:
    return f"setting_{entry.name}"  # apart from the other options' names (-T's timeout)


def _dest(spelling: str) -> str:
    # --num-machines and --num_machines are two options: their names must differ.
    return "alias_" + spelling.lstrip("-").replace("-", "_h_")


def _declarations(verb: str, hidden: Collection[str]) -> list[Callable[[Any], Any]]:
    """Each entry's own option (shown), then every alias (hidden: the epilog lists them)."""
    own: list[Callable[[Any], Any]] = []
    aliases: list[Callable[[Any], Any]] = []
    for entry in for_verb(verb):
        flag = entry.flag
        assert flag is not None
        if flag.decls:
            own.append(_option(entry, flag, verb, entry.name in hidden))
        if verb in ALIAS_VERBS:
            kind = None if flag.aliases_take_text else _click_type(entry, verb)
            aliases += [
                click.option(spelling, _dest(spelling), type=kind, hidden=True)
                for spelling in flag.aliases
            ]
    return [*own, *aliases]


def _option(entry: Entry, flag: Flag, verb: str, hidden: bool) -> Callable[[Any], Any]:
    worded = flag.per_verb.get(verb)
    text = worded.help if worded is not None else flag.help
    show = flag.show_default
    if worded is not None and worded.show_default is not None:
        show = worded.show_default
    dest = _own_dest(entry)
    if isinstance(entry.kind, Switch):  # click names a switch's default side itself
        two_sided = "/" in flag.decls[0]
        return click.option(
            *flag.decls,
            dest,
            is_flag=True,
            default=entry.default,
            show_default=show and two_sided,
            help=text,
            hidden=hidden,
        )
    if show:
        text += f"  [default: {entry.default_text()}]"
    kind = None if flag.takes_text else _click_type(entry, verb)
    return click.option(
        *flag.decls,
        dest,
        type=kind,
        multiple=flag.multiple,
        metavar=worded.metavar if worded is not None and worded.metavar else flag.metavar,
        help=text,
        hidden=hidden,
    )


def _click_type(entry: Entry, verb: str) -> Any:
    """The click type of the entry's kind (None: the text as typed)."""
    kind = entry.kind
    if isinstance(kind, WholeNumber):
        return click.IntRange(kind.low, kind.high)
    if isinstance(kind, Duration):
        return Seconds(kind.low, kind.high)
    if isinstance(kind, OneOf):
        worded = entry.flag.per_verb.get(verb) if entry.flag else None
        choices = worded.choices if worded is not None and worded.choices else kind.choices
        return click.Choice(choices, case_sensitive=False)
    return None


def collect(verb: str, kwargs: dict[str, Any], ctx: click.Context) -> FlagValues:
    """Pop the table's options from click's keyword arguments into one FlagValues: each
    setting's value and the spelling it was given with; two spellings with different
    values are an error."""
    flags = FlagValues()
    names: dict[str, str] = {}
    for entry in for_verb(verb):
        given = _given(entry, verb, kwargs, ctx)
        for spelling, typed, value in given[1:]:
            if _normal(entry, value) != _normal(entry, given[0][2]):
                first = entry.flag.spelling if entry.flag and entry.flag.decls else given[0][0]
                raise UsageError(
                    f"{given[0][0]} {given[0][1]} and {spelling} {typed} set the same "
                    "thing differently",
                    hint=f"give {first} once",
                )
        flags[entry.name] = None
        if given:
            spelling, typed, value = given[0]
            names[entry.name] = spelling
            flags.typed[entry.name] = typed
            if isinstance(entry.kind, OneOf):
                value = _normal(entry, value)
            flags[entry.name] = None if value == UNSET_WORD else value
    if "nodes" in flags:  # --nodes MIN:MAX: MAX nodes taken, MIN the floor
        flags["min_nodes"] = None
        if isinstance(flags["nodes"], tuple):
            flags["min_nodes"], flags["nodes"] = flags["nodes"]
            names["min_nodes"] = names["nodes"]
    if "env" in flags:  # --env: the plain variables, and the credentials passed by name
        env = parse_env(tuple(flags.typed.get("env", ())))
        flags["env"], flags["secret_env"] = env, env.secret
    flags["flag_names"] = names
    return flags


def _given(
    entry: Entry, verb: str, kwargs: dict[str, Any], ctx: click.Context
) -> list[tuple[str, Any, Any]]:
    """(spelling, as typed, value) for each spelling of the setting given."""
    flag = entry.flag
    assert flag is not None
    given: list[tuple[str, Any, Any]] = []
    if flag.decls:
        dest = _own_dest(entry)
        typed = kwargs.pop(dest)
        source = ctx.get_parameter_source(dest)
        if typed not in (None, ()) and source not in (None, ParameterSource.DEFAULT):
            value = entry.kind.parse_text(flag.spelling, typed) if flag.takes_text else typed
            given.append((flag.spelling, typed, value))
    if verb in ALIAS_VERBS:
        for spelling in flag.aliases:
            raw = kwargs.pop(_dest(spelling))
            if raw is not None:
                value = entry.kind.parse_text(spelling, raw) if flag.aliases_take_text else raw
                given.append((spelling, raw, value))
    return given


def _normal(entry: Entry, value: Any) -> Any:
    if isinstance(entry.kind, OneOf):
        return entry.kind.normal(value)
    return str(value).lower()


# ---------------------------------------------------------------- an option as SCRIPT

_QUIET = (
    "cpuaccel is quiet already: a failing rank's traceback is shown once, without the "
    "launcher's frames, and -v asks for more: leave it out"
)
# Options of accelerate launch, torchrun and mpirun that run does not take, with what to
# type instead. Anything not here gets the general answer.
SPELLINGS: dict[str, str] = {
    "-n": "-n is mpirun's total: --num_processes N (N ranks in all) or --ppn N per node",
    "-np": "-np is mpirun's total: --num_processes N (N ranks in all) or --ppn N per node",
    "--config_file": "the config file is --config FILE (Accelerate's default_config.yaml works)",
    "--config-file": "the config file is --config FILE (Accelerate's default_config.yaml works)",
    "--hostfile": "hosts come from -i FILE (an Ansible inventory or an MPI hostfile)",
    "--num_cpu_threads_per_process": "threads per rank: --env OMP_NUM_THREADS=N",
    "--machine_rank": "cpuaccel starts every machine's ranks from here: leave it out",
    "--node_rank": "cpuaccel starts every machine's ranks from here: leave it out",
    "--node-rank": "cpuaccel starts every machine's ranks from here: leave it out",
    "--standalone": "one machine is --nodes 1 (or -l HOST): leave --standalone out",
    "--cpu": "cpuaccel always trains on CPUs: leave it out",
    "--use_cpu": "cpuaccel always trains on CPUs: leave it out",
    "--multi_gpu": "cpuaccel trains on CPUs: leave it out",
    "--mpirun_hostfile": "the hostfile is an inventory: -i FILE (an MPI hostfile works as is)",
    "--ipex": "the runtime applies IPEX on every rank where intel_extension_for_pytorch "
    "imports and matches torch (init(ipex=False) turns it off): leave --ipex out",
    "--enable_cpu_affinity": "cpuaccel pins each rank to its own cores itself "
    "(I_MPI_PIN_DOMAIN, or the launcher's binding): leave it out",
    "-q": _QUIET,
    "--quiet": _QUIET,
}


def refuse_option_as_script(script: str) -> None:
    """SCRIPT starting with '-' is an option run does not know, typed before the script:
    said with cpuaccel's spelling of another tool's option, else the closest option."""
    if not script.startswith("-") or script == "-":
        return
    option = script.split("=", 1)[0]
    instead = SPELLINGS.get(option)
    if instead is None and option.startswith("--"):
        # -x and --x_y / --x-y are the same option to accelerate: so are they here.
        instead = SPELLINGS.get(option.replace("-", "_").replace("__", "--", 1))
    ctx = click.get_current_context(silent=True)
    verb = f"cpuaccel {ctx.info_name}" if ctx is not None else "cpuaccel run"
    if instead is not None:
        raise UsageError(f"{option}: no such option of {verb}", hint=instead)
    hint = f"see {verb} --help; options for the script go after SCRIPT"
    close = closest_option(option, ctx)
    if close is not None:
        hint = f"did you mean {close}? ({hint})"
    if os.path.lexists(script):  # the one case where the file is what was meant
        hint += f"; the script named {script} is ./{script}"
    raise UsageError(f"{option}: no such option of {verb}", hint=hint)


def note_options_after_script(script: str, args: Sequence[str]) -> None:
    """``run train.py --nodes 5``: --nodes goes to the script (which may have its own),
    said in one note so that cpuaccel's option is not lost unseen."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return
    own = {
        name
        for param in ctx.command.params
        if isinstance(param, click.Option)
        for name in (*param.opts, *param.secondary_opts)
        if name.startswith("--") and name != "--help"
    }
    given = []
    for word in args:
        if word == "--":
            break
        option = word.split("=", 1)[0]
        if option in own and option not in given:
            given.append(option)
    if given:
        names = ", ".join(given)
        goes, it = ("goes", "it") if len(given) == 1 else ("go", "them")
        ui.stderr().print(
            f"note: {escape(names)} after {escape(script)} {goes} to the script; "
            f"put {it} before {escape(script)} for cpuaccel",
            highlight=False,
        )


def closest_option(option: str, ctx: click.Context | None) -> str | None:
    """The command's option spelled most like ``option`` (a typo's fix), if any is close."""
    if ctx is None:
        return None
    import difflib  # only for the hint on an unknown option: off every command's start-up

    names = [
        name
        for param in ctx.command.params
        if isinstance(param, click.Option)
        for name in (*param.opts, *param.secondary_opts)
        if name.startswith("--") == option.startswith("--")
    ]
    close = difflib.get_close_matches(option, names, n=1, cutoff=0.75)
    return close[0] if close else None


# ---------------------------------------------------------------- a recorded run's head
# Reaching a recorded run's head node, for ps, logs and fetch: ``-i`` (else the
# inventory the run recorded, else the usual choice), ``-T`` and
# ``--no-host-key-checking``, as the other verbs spell them.


def head_options(func: F) -> F:
    options = [
        click.option(
            "-i",
            "--inventory",
            "inventory_path",
            metavar="FILE",
            help="The inventory that names the run's head node. Default: the one the run "
            "recorded (detached runs), else $CPUACCEL_INVENTORY, else ./inventory.yaml.",
        ),
        connect_timeout_option("connect_timeout"),
        click.option(
            "--no-host-key-checking", is_flag=True, help="Accept unknown host keys. Unsafe."
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


class Heads:
    """Connections to the heads of recorded runs, one a host, opened when first used."""

    def __init__(self, inventory_path: str | None, connect_timeout: float, no_hkc: bool) -> None:
        self.inventory_path = inventory_path
        self.connect_timeout = connect_timeout
        self.no_hkc = no_hkc
        self._pools: dict[str, ConnectionPool] = {}
        self._targets: dict[str | None, Any] = {}
        self._lock = threading.Lock()  # ps asks several heads at once
        if inventory_path:  # a bad -i is said at once, even when no head is asked
            self._target(inventory_path)

    def target(self, path: str | None) -> Any:
        """The ``Target`` of the inventory at ``path`` (read once)."""
        with self._lock:
            return self._target(path)

    def _target(self, path: str | None) -> Any:
        if path not in self._targets:
            self._targets[path] = resolve_target(
                path, None, (), DEFAULT_FORKS, self.connect_timeout, self.no_hkc
            )
        return self._targets[path]

    def connector(self, run: RunRecord) -> Callable[[], Connector]:
        """How to reach ``run``'s head (connecting on first use); UsageError when no
        inventory names it."""
        with self._lock:
            return self._connector(run)

    def _connector(self, run: RunRecord) -> Callable[[], Connector]:
        head = run.head
        if head is None:
            raise UsageError(f"{run.path}/run.json names no head node", hint="is it a run folder?")
        path = self.inventory_path or run.record.get("inventory")
        target = self._target(str(path) if path else None)
        host = target.inventory.hosts.get(head)
        if host is None:
            where = target.inventory.source or "the default inventory (this machine)"
            raise UsageError(
                f"run {run.run_id}'s head {head} is not in {where}",
                hint="give the inventory the run used: -i FILE",
            )
        key = f"{path}:{head}"
        if key not in self._pools:
            self._pools[key] = ConnectionPool(target.connect)
        pool = self._pools[key]
        return lambda: pool.get(host)

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()


def node_failed(exc: HostError) -> HostError:
    """The head could not be reached or failed its task: exit 69, as other verbs do."""
    exc.exit_code = EXIT_NODE_FAILED
    return exc


# ---------------------------------------------------------------- SCRIPT
# Is SCRIPT a Python script?
#
# `cpuaccel run inventory.yaml train.py` (the inventory named as `provision` takes it)
# used to launch the YAML file as the script on every rank. A SCRIPT that is a config or
# inventory file, or not Python at all, is refused with the spelling that was meant,
# unless the ranks are told to run it as an executable (``no_python``).
PYTHON_SUFFIXES = (".py", ".pyw", ".pyz")
# Files users keep beside their code that are never run: what each one usually is.
CONFIG_SUFFIXES = {
    ".yaml": "YAML",
    ".yml": "YAML",
    ".ini": "INI",
    ".cfg": "INI",
    ".toml": "TOML",
    ".json": "JSON",
}
_HEAD_BYTES = 256


def check_script_kind(script: str, *, no_python: bool = False) -> None:
    """Refuse a SCRIPT that is not a Python file; with ``no_python`` (the ranks run it as
    an executable) anything goes. A missing file is left to the caller's own error."""
    if no_python:
        return
    path = Path(script)
    kind = CONFIG_SUFFIXES.get(path.suffix.lower())
    if kind is not None:
        raise UsageError(
            f"{script}: SCRIPT is a {kind} file, not a Python script",
            hint=f"an inventory goes with -i (cpuaccel run -i {script} train.py), a "
            f"cpuaccel.yaml or Accelerate config with --config {script}",
        )
    if path.suffix.lower() in PYTHON_SUFFIXES:
        return
    first = _first_line(path)
    if first is None or (first.startswith(b"#!") and b"python" in first):
        return
    raise UsageError(
        f"{script}: SCRIPT is not a Python file (no .py suffix, no python #! line)",
        hint=f"to run it as every rank's program: cpuaccel run --no-python {script}; "
        "else name the Python script (train.py)",
    )


def _first_line(path: Path) -> bytes | None:
    """The file's first bytes up to a newline; None when it is not a regular file (the
    caller says "no such script"). Read without blocking: a FIFO is never opened."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except (OSError, ValueError):
        return None
    try:
        head = os.read(fd, _HEAD_BYTES) if stat.S_ISREG(os.fstat(fd).st_mode) else None
    except OSError:
        return None
    finally:
        os.close(fd)
    return None if head is None else head.split(b"\n", 1)[0]
