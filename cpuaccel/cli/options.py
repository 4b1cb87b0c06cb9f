"""The options verbs share: one declaration each, so no two verbs drift apart.

- the host options of every verb that talks to hosts, with Ansible's names (``-i -l -e
  -f -T -c -u --private-key``), turned into one :class:`Target`;
- the job options ``run`` and ``submit`` both take (``--timeout``, ``--hang-timeout``,
  ``-m``, ...), and run's world-size flags with the spellings Accelerate and torchrun
  users type (``--nproc_per_node``, ``--num_processes``, ...);
- how ``ps``, ``logs``, ``fetch`` and ``dashboard`` reach a recorded run's head;
- the check that SCRIPT is a Python script, for ``run``, ``submit`` and ``tune``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
import stat
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, overload

import click

from cpuaccel import ui
from cpuaccel.config.inventory_choice import choose_inventory
from cpuaccel.config.project import ProjectConfig
from cpuaccel.config.project_choice import discover_config
from cpuaccel.config.settings import Setting
from cpuaccel.connectors.base import Connector
from cpuaccel.connectors.connect_options import DEFAULT_CONNECT_TIMEOUT, ConnectOptions
from cpuaccel.connectors.hostkeys import opt_out_warnings
from cpuaccel.errors import EXIT_NODE_FAILED, HostError, UsageError
from cpuaccel.executor import DEFAULT_FORKS, ConnectionPool
from cpuaccel.inventory.host import Host
from cpuaccel.inventory.inventory import Inventory, parse_extra_vars
from cpuaccel.inventory.variables import env_name_problem, user_name_problem
from cpuaccel.rank_settings import CHOICES, value_problem
from cpuaccel.ui import escape

if TYPE_CHECKING:  # runs.records reads Slurm's queue: only ps, logs and fetch need it
    from cpuaccel.runs.records import RunRecord

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


# ---------------------------------------------------------------- the job options of run and submit
# ``run``'s job options that ``submit`` also takes and hands to the run inside the job:
# one declaration each, so the two commands cannot drift apart (a type, a bound, a name).
#
# The world-size ones (--master-port, --mixed-precision, --max-restarts) live with their
# aliases in ``launch_aliases.OWN_OPTIONS``; ``--launcher`` and ``--env`` differ on
# purpose between the two (inside a Slurm job, and no secret's value in a batch script),
# so each command declares its own.
JOB_OPTIONS: dict[str, Callable[[Any], Any]] = {
    "job_timeout": click.option(
        "--timeout",
        "job_timeout",
        type=Seconds(0.1),
        metavar="SECONDS",
        help="End the job after this long.",
    ),
    "hang_timeout": click.option(
        "--hang-timeout",
        "hang_timeout",
        type=Seconds(1),
        metavar="SECONDS",
        help="End the job as hung (exit 124) when no rank made progress (a step, an output "
        "line) for this long; stacks go to runs/<id>/hang-R.txt where py-spy is.  "
        "[default: off]",
    ),
    "restart_delay": click.option(
        "--restart-delay",
        type=Seconds(0, 3600),
        metavar="SECONDS",
        help="Wait this long before a restart (--max-restarts).  [default: 3]",
    ),
    "as_module": click.option(
        "-m",
        "--module",
        "as_module",
        is_flag=True,
        help="SCRIPT is a module name, run as `python -m SCRIPT` from the project folder.",
    ),
    "no_python": click.option(
        "--no-python",
        is_flag=True,
        help="SCRIPT is a program (in the project, or on the nodes' PATH) run as each rank, "
        "with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR... set.",
    ),
    "launcher_args": click.option(
        "--launcher-args",
        metavar="'WORDS'",
        help="Extra mpirun options, split as a shell would, placed before the program.",
    ),
}


def job_options(func: Any) -> Any:
    """Declare every option of :data:`JOB_OPTIONS` on a command, in that order."""
    for declare in reversed(JOB_OPTIONS.values()):
        func = declare(func)
    return func


# ---------------------------------------------------------------- world-size flags, aliases
# The world-size flags of ``run`` and ``config show``, with the spellings that
# ``accelerate launch`` and torchrun users type (issue 13, item 1).
#
# ``launch_options`` declares cpuaccel's own flags (--nodes, --ppn, --master-port,
# --mixed-precision) and, hidden from the option list but named in the epilog, their
# aliases: --num_machines/--nnodes, --nproc-per-node, --num_processes (a total),
# --master_addr/--main_process_ip (the head), --master_port, --mixed_precision. The command
# receives one ``launch_flags`` mapping for ``config.effective.resolve``, whose
# ``flag_names`` entry keeps the spelling typed, so that ``config show`` and errors name it.
#
# It also stops an option-looking SCRIPT before anything is read: ``run`` passes unknown
# options through (everything after SCRIPT is the script's), so an option it does not know,
# typed before SCRIPT, would otherwise be taken as the script.

PRECISION_CHOICES = ("auto", "bf16", "fp32", "no")  # the same words in config and run
# "auto" and torchrun's "cpu": what cpuaccel does without --ppn (ranks per node from the
# nodes' sockets). Kept apart from None until the spellings are compared, so that
# `--ppn 4 --nproc-per-node auto` is a contradiction, not one of them silently lost.
_DEFAULT = "default"

EPILOG = """\b
accelerate launch / torchrun spellings (the same settings):
  --num_processes N            N ranks in all: --ppn N/nodes
  --num_machines, --nnodes N|MIN:MAX   --nodes N|MIN:MAX
  --nproc-per-node, --nproc_per_node N|auto|cpu   --ppn N (auto, cpu: the default)
  --master_addr, --master-addr, --main_process_ip HOST   the head: rank 0 and mpirun
  --master_port, --main_process_port PORT   --master-port PORT
  --mixed_precision P          --mixed-precision P
  --max_restarts N             --max-restarts N
"""


def _whole(flag: str, text: str) -> int:
    digits = text.strip()
    if not (digits.isascii() and digits.isdigit()) or int(digits) < 1:
        raise UsageError(
            f"{flag} {text}: expected a whole number of 1 or more", hint=f"e.g. {flag} 2"
        )
    return int(digits)


def _nodes(flag: str, text: Any) -> int | tuple[int, int]:
    """N, or torchrun's MIN:MAX (issue 15 item 2): MAX nodes are taken, and a restart
    may go on with as few as MIN when nodes are lost. N:N is just N."""
    low, sep, high = str(text).partition(":")
    if not sep:
        return _whole(flag, str(text))
    try:
        first, last = _whole(flag, low), _whole(flag, high)
    except UsageError:
        raise UsageError(
            f"{flag} {text}: expected MIN:MAX, whole numbers of 1 or more",
            hint=f"e.g. {flag} 2:3 (at least 2 nodes, at most 3)",
        ) from None
    if first > last:
        raise UsageError(
            f"{flag} {text}: MIN is above MAX",
            hint=f"give MIN:MAX with MIN <= MAX, e.g. {flag} {last}:{first}",
        )
    return first if first == last else (first, last)


def _ppn(flag: str, text: str) -> int | str:
    word = text.strip().lower()
    if word in ("auto", "cpu"):
        return _DEFAULT
    if word == "gpu":
        raise UsageError(
            f"{flag} gpu: cpuaccel runs its ranks on CPUs",
            hint=f"give a number of ranks per node ({flag} 2), or leave it out (sockets per node)",
        )
    return _whole(flag, text)


def _as_is(flag: str, value: Any) -> Any:
    return value


# setting -> (its own flag, or None when run has none; the aliases; how an alias's text
# becomes the value). An alias of one setting never conflicts with another's.
_Convert = Callable[[str, Any], Any]
ALIASES: dict[str, tuple[str | None, tuple[str, ...], _Convert]] = {
    "nodes": ("--nodes", ("--num_machines", "--num-machines", "--nnodes"), _nodes),
    "ppn": ("--ppn", ("--nproc-per-node", "--nproc_per_node"), _ppn),
    "num_processes": (None, ("--num_processes", "--num-processes"), _as_is),
    "head": (None, ("--master_addr", "--master-addr", "--main_process_ip",
                    "--main-process-ip"), _as_is),
    "master_port": ("--master-port", ("--master_port", "--main_process_port",
                                      "--main-process-port"), _as_is),
    "mixed_precision": ("--mixed-precision", ("--mixed_precision",), _as_is),
    "max_restarts": ("--max-restarts", ("--max_restarts",), _as_is),
}  # fmt: skip
MAX_RESTARTS = 1000  # as config/project.py bounds max_restarts: a typo (30000) is caught


def _dest(spelling: str) -> str:
    # --num-machines and --num_machines are two options: their names must differ.
    return "alias_" + spelling.lstrip("-").replace("-", "_h_")


def _alias_type(setting: str) -> Any:
    if setting == "num_processes":
        return click.IntRange(1)
    if setting == "master_port":
        return click.IntRange(1, 65535)
    if setting == "max_restarts":
        return click.IntRange(0, MAX_RESTARTS)
    if setting == "mixed_precision":
        return click.Choice(PRECISION_CHOICES, case_sensitive=False)
    return str


# cpuaccel's own world-size options, by setting name; ``submit`` declares some of them
# from here too (cli/submit.py), so each has one declaration.
OWN_OPTIONS: dict[str, Callable[[Any], Any]] = {
    "nodes": click.option(
        "--nodes",
        metavar="N|MIN:MAX",
        help="How many hosts (default: all selected). MIN:MAX: a restart goes on "
        "without lost nodes while MIN remain.",
    ),
    "ppn": click.option(
        "--ppn", type=click.IntRange(1), help="Ranks per node (default: sockets, or 1)."
    ),
    "master_port": click.option(
        "--master-port",
        type=click.IntRange(1, 65535),
        help="Rendezvous port.  [default: 29500]",
    ),
    "mixed_precision": click.option(
        "--mixed-precision",
        type=click.Choice(PRECISION_CHOICES, case_sensitive=False),
        help="auto, bf16, or fp32 (= no). Exported as ACCELERATE_MIXED_PRECISION / "
        "CPUACCEL_MIXED_PRECISION.",
    ),
    "max_restarts": click.option(
        "--max-restarts",
        type=click.IntRange(0, MAX_RESTARTS),
        metavar="N",
        help="Restart a failed job up to N times, from its newest checkpoint.  [default: 0]",
    ),
}


def _declarations() -> list[Callable[[Any], Any]]:
    """cpuaccel's own options (shown), then every alias (hidden: the epilog lists them)."""
    aliases = [
        click.option(spelling, _dest(spelling), type=_alias_type(setting), hidden=True)
        for setting, (_, spellings, _) in ALIASES.items()
        for spelling in spellings
    ]
    return [*OWN_OPTIONS.values(), *aliases]


def launch_options(func: F) -> F:
    """Declare the world-size flags and their aliases; the command receives them merged
    as ``launch_flags`` (values by setting name, and ``flag_names``: the spelling typed).
    With a ``script`` argument, an option-looking SCRIPT is refused first."""

    @functools.wraps(func)
    def command(**kwargs: Any) -> Any:
        script = kwargs.get("script")
        if script is not None:
            refuse_option_as_script(script)
        return func(launch_flags=merge(kwargs), **kwargs)

    for decorator in reversed(_declarations()):
        command = decorator(command)
    return command  # type: ignore[return-value]


def merge(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Pop this module's options from click's keyword arguments: each setting's value and
    the spelling it was given with; two spellings with different values are an error."""
    merged: dict[str, Any] = {}
    names: dict[str, str] = {}
    for setting, (own, spellings, convert) in ALIASES.items():
        given: list[tuple[str, Any, Any]] = []  # (spelling, as typed, value)
        if own is not None and kwargs.get(setting) is not None:
            typed = kwargs[setting]
            own_value = convert(own, typed) if setting == "nodes" else typed
            given.append((own, typed, own_value))
        kwargs.pop(setting, None)
        for spelling in spellings:
            raw = kwargs.pop(_dest(spelling))
            if raw is not None:
                given.append((spelling, raw, convert(spelling, raw)))
        for spelling, typed, value in given[1:]:
            if _normal(value) != _normal(given[0][2]):
                raise UsageError(
                    f"{given[0][0]} {given[0][1]} and {spelling} {typed} set the same "
                    "thing differently",
                    hint=f"give {own or given[0][0]} once",
                )
        value = given[0][2] if given else None
        merged[setting] = None if value == _DEFAULT else value
        if given:
            names[setting] = given[0][0]
    merged["min_nodes"] = None
    if isinstance(merged["nodes"], tuple):  # MIN:MAX: MAX nodes taken, MIN the floor
        merged["min_nodes"], merged["nodes"] = merged["nodes"]
        names["min_nodes"] = names["nodes"]
    if merged["mixed_precision"] is not None:  # fp32 is written "no", as Accelerate reads it
        merged["mixed_precision"] = _normal(merged["mixed_precision"])
    merged["flag_names"] = names
    return merged


def _normal(value: Any) -> Any:
    word = str(value).lower()
    return "no" if word == "fp32" else word


# ---------------------------------------------------------------- an option as SCRIPT

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
}


def refuse_option_as_script(script: str) -> None:
    """SCRIPT starting with '-' is an option run does not know, typed before the script."""
    if not script.startswith("-") or script == "-":
        return
    option = script.split("=", 1)[0]
    instead = SPELLINGS.get(option)
    if instead is None and option.startswith("--"):
        # -x and --x_y / --x-y are the same option to accelerate: so are they here.
        instead = SPELLINGS.get(option.replace("-", "_").replace("__", "--", 1))
    hint = instead or "see cpuaccel run --help; options for the script go after SCRIPT"
    if not instead:
        hint += f" (a script named {script} is ./{script})"
    raise UsageError(f"{option}: no such option of cpuaccel run", hint=hint)


def launcher_and_env_options(launcher_help: str, env_help: str) -> Callable[[F], F]:
    """``--launcher`` and ``--env``, declared once for ``run`` and ``config show`` (which
    shows what run would settle), each verb with its own help wording. No click
    defaults: None means "not given", so the project file or the inventory may set them
    (config/effective.py)."""

    def apply(func: F) -> F:
        func = click.option(
            "--env", "env_items", multiple=True, metavar="KEY=VALUE|NAME", help=env_help
        )(func)
        return click.option(
            "--launcher",
            type=click.Choice(["auto", "impi", "mpich", "openmpi", "slurm"]),
            help=launcher_help,
        )(func)

    return apply


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
# Is SCRIPT a Python script? (issue 13, item 8)
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
