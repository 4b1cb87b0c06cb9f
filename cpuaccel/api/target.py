"""The hosts a call works on: the inventory read, ``limit`` applied, how to connect.

``resolve_target`` is what every verb's host options (``-i -l -e -f -T -u
--private-key -c``) and every API call's keywords (``inventory=``, ``limit=``, ...) turn
into: one ``Target``, read once, before anything is contacted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict, Unpack

from cpuaccel import ui
from cpuaccel.api.keywords import no_such
from cpuaccel.config.effective import resolve
from cpuaccel.config.inventory_choice import choose_inventory
from cpuaccel.config.project import ProjectConfig
from cpuaccel.config.project_choice import discover_config
from cpuaccel.config.settings import LaunchSettings, Setting
from cpuaccel.connectors.connect_options import DEFAULT_CONNECT_TIMEOUT, ConnectOptions
from cpuaccel.connectors.hostkeys import opt_out_warnings
from cpuaccel.errors import CpuaccelError, InsecureWarning, UsageError
from cpuaccel.executor import DEFAULT_FORKS
from cpuaccel.inventory.host import Host
from cpuaccel.inventory.inventory import Inventory, parse_extra_vars
from cpuaccel.inventory.variables import user_name_problem
from cpuaccel.ui import escape


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


@dataclass(frozen=True)
class HostFlags:
    """The host options as given (``-i -l -e -f -T --no-host-key-checking --config -u
    --private-key``, or the API's keywords as those words), before anything is read."""

    inventory_path: str | None = None
    limit: str | None = None
    extra_vars: tuple[str, ...] = ()
    forks: int = DEFAULT_FORKS
    timeout: float = DEFAULT_CONNECT_TIMEOUT
    no_host_key_checking: bool = False
    config_path: str | None = None
    user: str | None = None
    private_key: str | None = None


def resolve_target(given: HostFlags) -> Target:
    """The ``Target`` of the host options ``given``: the project file and the inventory
    read once, ``limit`` applied, how to connect."""
    inventory_path, limit, user = given.inventory_path, given.limit, given.user
    config_path, private_key = given.config_path, given.private_key
    _check_login(user, private_key)
    project = discover_config(config_path, inventory_path)
    cli_vars = parse_extra_vars(given.extra_vars)
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
        connect_timeout=given.timeout,
        host_key_checking=False if given.no_host_key_checking else None,
        user=user,
        private_key=_key_path(private_key),
    )
    warn([*(project.warnings if project else []), *inventory.warnings])
    warn(opt_out_warnings(hosts, connect))  # an opt-out of host key checks is never silent
    return Target(
        inventory, hosts, given.forks, connect, project, choice.setting, limit_setting, cli_vars
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


def target_of(
    inventory: str | os.PathLike[str] | None = None, **options: Unpack[HostOptions]
) -> Target:
    """The API's host keywords as one ``Target``, as the CLI's ``-i -l -e -f -T
    --no-host-key-checking -c -u --private-key`` make it: each checked as its flag is
    (a bad one raises the CLI's message naming the flag), the inventory read once.
    ``extra_vars`` is a mapping, or ``KEY=VALUE`` / ``@file.yaml`` words as ``-e`` takes."""
    given = HostKeywords.of(inventory, options)
    limit, extra_vars, forks = given.limit, given.extra_vars, given.forks
    connect_timeout, host_key_checking = given.connect_timeout, given.host_key_checking
    config, user, private_key = given.config, given.user, given.private_key
    if isinstance(forks, bool) or not isinstance(forks, int) or not 1 <= forks <= 1024:
        raise UsageError(
            f"forks={forks!r}: expected a whole number from 1 to 1024", hint="e.g. forks=16"
        )
    if (
        isinstance(connect_timeout, bool)
        or not isinstance(connect_timeout, (int, float))
        or not 0.1 <= connect_timeout <= 3600
    ):
        raise UsageError(
            f"connect_timeout={connect_timeout!r}: expected seconds from 0.1 to 3600",
            hint="e.g. connect_timeout=10",
        )
    if not isinstance(host_key_checking, bool):
        raise UsageError(
            f"host_key_checking={host_key_checking!r}: expected True or False",
            hint="leave it True unless the hosts' keys cannot be known (unsafe)",
        )
    for name, value in (("inventory", inventory), ("config", config), ("private_key", private_key)):
        if value is not None and not isinstance(value, (str, os.PathLike)):
            raise UsageError(f"{name}={value!r}: expected a path", hint=f"e.g. {name}='...'")
    for name, value in (("limit", limit), ("user", user)):
        if value is not None and not isinstance(value, str):
            raise UsageError(f"{name}={value!r}: expected a string", hint=f"e.g. {name}='...'")
    flags = HostFlags(
        os.fspath(inventory) if inventory is not None else None,
        limit,
        _extra_words(extra_vars),
        forks,
        float(connect_timeout),
        not host_key_checking,
        os.fspath(config) if config is not None else None,
        user,
        os.fspath(private_key) if private_key is not None else None,
    )
    target = resolve_target(flags)
    # An opt-out of host key checks is never silent, output or not: a Python warning,
    # which the caller's warning filters may still turn into an error or hide.
    for message in opt_out_warnings(target.hosts, target.connect):
        warnings.warn(message, InsecureWarning, stacklevel=3)
    return target


def _extra_words(extra_vars: Mapping[str, Any] | Sequence[str]) -> tuple[str, ...]:
    """``extra_vars`` as the words ``-e`` takes: a mapping becomes one JSON object (its
    values keep their types, as ``-e '{"k": 1}'`` does)."""
    if isinstance(extra_vars, Mapping):
        import json

        return (json.dumps(dict(extra_vars)),) if extra_vars else ()
    if isinstance(extra_vars, str) or not all(isinstance(w, str) for w in extra_vars):
        raise UsageError(
            f"extra_vars={extra_vars!r}: expected a mapping or a list of KEY=VALUE strings",
            hint="e.g. extra_vars={'cpuaccel_ppn': 2}",
        )
    return tuple(extra_vars)


class HostOptions(TypedDict, total=False):
    """The host keywords every API call takes beside ``inventory``, the CLI's host
    options: ``limit`` (-l), ``extra_vars`` (-e), ``forks`` (-f), ``connect_timeout``
    (-T), ``host_key_checking`` (--no-host-key-checking), ``config`` (-c), ``user``
    (-u), ``private_key`` (--private-key). Each is checked as its flag is (``target_of``)."""

    limit: str | None
    extra_vars: Mapping[str, Any] | Sequence[str]
    forks: int
    connect_timeout: float
    host_key_checking: bool
    config: str | os.PathLike[str] | None
    user: str | None
    private_key: str | os.PathLike[str] | None


HOST_OPTIONS = tuple(HostOptions.__annotations__)


@dataclass(frozen=True)
class HostKeywords:
    """The host keywords of an API call, as given (``target_of`` checks them)."""

    inventory: str | os.PathLike[str] | None = None
    limit: str | None = None
    extra_vars: Mapping[str, Any] | Sequence[str] = ()
    forks: int = DEFAULT_FORKS
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    host_key_checking: bool = True
    config: str | os.PathLike[str] | None = None
    user: str | None = None
    private_key: str | os.PathLike[str] | None = None

    @classmethod
    def of(
        cls, inventory: str | os.PathLike[str] | None, given: Mapping[str, Any], *also: str
    ) -> HostKeywords:
        """``inventory`` and the host keywords ``given``; an unknown keyword is refused
        with the closest of these and ``also`` (the calling function's own keywords)."""
        unknown = [name for name in given if name not in HOST_OPTIONS]
        if unknown:
            words = [*HOST_OPTIONS, *also]
            raise no_such(unknown[0], words, "keyword", ["inventory", *words])
        return cls(inventory, **given)

    def target(self, variables: Mapping[str, Any] | None = None) -> Target:
        """The Target, with ``variables`` (settings the inventory sets) over extra_vars;
        an error names the keywords (``inventory=``), not the CLI's flags (``-i``)."""
        with api_words():
            return self._target(variables)

    def _target(self, variables: Mapping[str, Any] | None) -> Target:
        return target_of(
            self.inventory,
            limit=self.limit,
            extra_vars=_with_variables(self.extra_vars, variables or {}),
            forks=self.forks,
            connect_timeout=self.connect_timeout,
            host_key_checking=self.host_key_checking,
            config=self.config,
            user=self.user,
            private_key=self.private_key,
        )


# The host flags as messages shared with the CLI name them, and their keywords.
_API_WORDS = (
    (r"(?<![\w-])-u/--user ('[^']*')", r"user=\1"),
    (r"(?<![\w-])(?:-l|--limit) ('[^']*')", r"limit=\1"),
    (r"(?<![\w-])-u/--user(?![\w-])", "user="),
    (r"(?<![\w-])-u (\w+)", r"user='\1'"),
    (r"(?<![\w-])--private-key ([^\s:]+)", r"private_key='\1'"),
    (r"(?<![\w-])--private-key(?![\w-])", "private_key="),
    (r"(?<![\w-])-i (FILE|PATH)\b", r"inventory='\1'"),
    (r"(?<![\w-])-i(?![\w-])", "inventory="),
    (r"(?<![\w-])(?:-l|--limit)(?![\w-])", "limit="),
)


def api_text(text: str) -> str:
    """``text`` (a message or fix written for the CLI) with the host flags named as
    the API's keywords."""
    import re

    for pattern, keyword in _API_WORDS:
        text = re.sub(pattern, keyword, text)
    return text


@contextlib.contextmanager
def api_words() -> Iterator[None]:
    """A CpuaccelError raised within names the API's keywords, not the CLI's flags."""
    try:
        yield
    except CpuaccelError as exc:
        exc.message = api_text(exc.message)
        exc.args = (exc.message, *exc.args[1:])
        if exc.hint:
            exc.hint = api_text(exc.hint)
        raise


def _with_variables(
    extra_vars: Mapping[str, Any] | Sequence[str], variables: Mapping[str, Any]
) -> Mapping[str, Any] | Sequence[str]:
    """``extra_vars`` with the settings given as inventory variables over them."""
    if not variables:
        return extra_vars
    if isinstance(extra_vars, Mapping):
        return {**extra_vars, **variables}
    import json

    return [*extra_vars, json.dumps(dict(variables))]
