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
import os
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, overload

import click
from click.core import ParameterSource

from cpuaccel import ui
from cpuaccel.api.keywords import FlagValues, Seconds, click_type, normal_choice, parse_env
from cpuaccel.api.target import HostFlags, Target, resolve_target
from cpuaccel.config.kinds import UNSET_WORD, OneOf, Switch
from cpuaccel.config.settings import (
    ALIAS_VERBS,
    SUBMIT,
    TABLE,
    Entry,
    Flag,
    for_verb,
)
from cpuaccel.connectors.connect_options import DEFAULT_CONNECT_TIMEOUT
from cpuaccel.errors import UsageError
from cpuaccel.executor import DEFAULT_FORKS
from cpuaccel.ui import escape

if TYPE_CHECKING:  # runs.records reads Slurm's queue: only ps, logs and fetch need it
    pass

F = TypeVar("F", bound=Callable[..., Any])


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


def shown_option(*decls: str, **attrs: Any) -> Callable[[F], F]:
    """A click option whose default its --help shows."""
    return click.option(*decls, show_default=True, **attrs)


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
        target = resolve_target(HostFlags(**given))
        if list_hosts and not settles_hosts:
            print_hosts([host.name for host in target.hosts])
            return None
        if settles_hosts:
            target = dataclasses.replace(target, list_hosts=list_hosts)
        return func(target=target, **kwargs)

    for decorator in reversed(_SHARED_OPTIONS):
        command = decorator(command)
    return command


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
            kind = None if flag.aliases_take_text else click_type(entry, verb)
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
    kind = None if flag.takes_text else click_type(entry, verb)
    return click.option(
        *flag.decls,
        dest,
        type=kind,
        multiple=flag.multiple,
        metavar=worded.metavar if worded is not None and worded.metavar else flag.metavar,
        help=text,
        hidden=hidden,
    )


def collect(verb: str, kwargs: dict[str, Any], ctx: click.Context) -> FlagValues:
    """Pop the table's options from click's keyword arguments into one FlagValues: each
    setting's value and the spelling it was given with; two spellings with different
    values are an error."""
    flags = FlagValues()
    names: dict[str, str] = {}
    for entry in for_verb(verb):
        given = _given(entry, verb, kwargs, ctx)
        for spelling, typed, value in given[1:]:
            if normal_choice(entry, value) != normal_choice(entry, given[0][2]):
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
                value = normal_choice(entry, value)
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


def bundled(
    name: str, make: Callable[..., Any], *options: str
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The command receives its ``options`` (their destinations, as click passes them)
    as one value, ``make(**those)``, under ``name``: a verb's related flags reach it as
    one object, e.g. provision's -C -D -t --skip-tags as ``PlayOptions``."""

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def command(*args: Any, **kwargs: Any) -> Any:
            given = {option: kwargs.pop(option) for option in options}
            return func(*args, **{name: make(**given)}, **kwargs)

        return command

    return decorate
