"""Provisioning nodes: a playbook run on every selected host, in parallel, with a recap.

By default the playbook is cpuaccel's own provision.yaml, which makes fresh nodes ready
to train. ``run_playbook`` runs a loaded playbook on a resolved ``Target``;
``provision`` is the whole of it from Python, with the host keywords of ``target_of``.
What the CLI alone does (--list-tasks, --syntax-check, asking -K's password) stays in
cli/provision.py.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Unpack

from cpuaccel import ui
from cpuaccel.api.keywords import check_switches
from cpuaccel.api.output import quiet_unless
from cpuaccel.api.target import HostKeywords, HostOptions, Target, beside_playbook
from cpuaccel.errors import EXIT_NODE_FAILED, EXIT_OK, UsageError
from cpuaccel.executor import ConnectionPool
from cpuaccel.inventory.variables import user_name_problem
from cpuaccel.playbook import loader
from cpuaccel.playbook.become import CliBecome
from cpuaccel.playbook.display import Display
from cpuaccel.playbook.loader import Playbook
from cpuaccel.playbook.strategy import (
    HostStats,
    LinearStrategy,
    Listener,
    PlayOptions,
    default_playbook,
)

# The tag whose tasks are safe on this machine: they fill the controller's wheelhouse.
WHEELHOUSE = "wheelhouse"


@dataclass(frozen=True)
class ProvisionResult:
    """What a playbook run did (with ``check``: would do): each host's recap counts
    (``ok changed unreachable failed skipped rescued ignored``), and per play and task
    each host's result, as ``--json`` lists them."""

    playbook: str
    check: bool
    seconds: float
    stats: Mapping[str, HostStats]
    plays: Sequence[Mapping[str, Any]] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        """No host failed a task or was unreachable."""
        return all(s.succeeded for s in self.stats.values())

    @property
    def exit_code(self) -> int:
        """``cpuaccel provision``'s exit code: 0 every host succeeded, 69 one did not."""
        return EXIT_OK if self.ok else EXIT_NODE_FAILED

    def to_json(self) -> dict[str, Any]:
        """What ``cpuaccel provision --json`` prints."""
        return {
            "playbook": self.playbook,
            "check": self.check,
            "ok": self.ok,
            "seconds": round(self.seconds, 3),
            "stats": {name: s.to_json() for name, s in self.stats.items()},
            "plays": list(self.plays),
        }


def tag_set(values: Iterable[str]) -> frozenset[str]:
    """Tags as given (each value may hold several, comma-separated) as one set."""
    return frozenset(t.strip() for v in values for t in v.split(",") if t.strip())


def load_playbook(target: Target, playbook: str | None) -> tuple[Path, Playbook, Target]:
    """The playbook's path (None: cpuaccel's provision.yaml), the playbook, validated
    whole before anything runs on any node (a bad one raises PlaybookError), and the
    target with the group_vars/ and host_vars/ beside a given playbook read too, as
    ansible-playbook reads them."""
    path = Path(playbook) if playbook else default_playbook()
    loaded = loader.load(path)
    if playbook:
        target = beside_playbook(target, path.parent)
    return path, loaded, target


@dataclass(frozen=True)
class Fixes:
    """How a refusal's fix names what to give: the command line's words (the default)
    or the Python call's keywords."""

    inventory: str = (
        "give the nodes' inventory (cpuaccel provision inventory.yaml); "
        "--tags wheelhouse alone fills the controller's wheelhouse"
    )
    settings: str = "in the inventory (host or group vars), or -e cpuaccel_venv=/opt/cpuaccel/venv"


# ``provision()``'s fixes, which name its keywords.
KEYWORD_FIXES = Fixes(
    inventory="give the nodes' inventory (provision('inventory.yaml')); "
    "tags='wheelhouse' alone fills the controller's wheelhouse",
    settings="in the inventory (host or group vars), or "
    "extra_vars={'cpuaccel_venv': '/opt/cpuaccel/venv'}",
)


def refuse_local_default(
    target: Target, playbook: str | None, tags: frozenset[str], hint: str = Fixes.inventory
) -> None:
    """No inventory means this machine alone: the default playbook would reinstall the
    environment cpuaccel itself runs from (UsageError). Only its wheelhouse step is safe."""
    if target.inventory.source is None and not playbook and tags != {WHEELHOUSE}:
        raise UsageError(
            "no inventory given: the default playbook would provision this machine's own "
            "Python environment",
            hint=hint,
        )


# The default playbook's settings: where the node's Python goes (one of these, an
# absolute path), and the stack, which has a default of its own (upstream).
PYTHON_SETTINGS = ("cpuaccel_venv", "cpuaccel_python")
STACK_SETTING, STACKS = "cpuaccel_stack", "cpuaccel_stacks"


def refuse_unset_settings(
    target: Target,
    playbook: str | None,
    loaded: Playbook,
    how: str = Fixes.settings,
) -> None:
    """The default playbook needs, on every host, cpuaccel_venv or cpuaccel_python as an
    absolute path, and a cpuaccel_stack it knows when one is set: checked here, from the
    inventory and -e, so that a missing setting is bad input (UsageError, exit 64) named
    before anything runs on any node, not a task failed on each of them."""
    if playbook:
        return  # a playbook of the user's own needs what it needs
    unset, relative, stacks = [], [], _stacks(loaded)
    for host in target.hosts:
        given = next((host.vars[k] for k in PYTHON_SETTINGS if host.vars.get(k)), None)
        if given is None:
            unset.append(host.name)
        elif not str(given).startswith("/"):
            relative.append(f"{host.name} ({given})")
        stack = host.vars.get(STACK_SETTING)
        if stack is not None and stacks and stack not in stacks:
            raise UsageError(
                f"{host.name}: cpuaccel_stack {stack!r} is not one of {', '.join(stacks)}",
                hint=f"set cpuaccel_stack to one of them, or leave it out ({stacks[0]})",
            )
    if unset or relative:
        names = unset or relative
        what = "is set" if unset else "is an absolute path"
        raise UsageError(
            f"{', '.join(names)}: neither cpuaccel_venv nor cpuaccel_python {what}; the "
            "default playbook puts the node's Python there",
            hint="set cpuaccel_venv (an absolute path where provision creates the node's "
            "environment) or cpuaccel_python (the absolute path of an interpreter you "
            f"manage) {how}; check and run use the same",
        )


def _stacks(loaded: Playbook) -> list[str]:
    """The stacks the playbook knows (its plays' cpuaccel_stacks), the default first."""
    for play in loaded.plays:
        known = play.vars.get(STACKS)
        if isinstance(known, dict):
            default = play.vars.get(STACK_SETTING)
            return sorted(known, key=lambda name: name != default)
    return []


@dataclass(frozen=True)
class ProvisionRequest:
    """A playbook run as its caller asks for it, from ``cpuaccel provision``'s flags or
    ``provision()``'s keywords: on ``target``'s hosts, ``playbook`` (None: cpuaccel's
    provision.yaml), as ``play`` says."""

    target: Target
    playbook: str | None = None
    play: PlayOptions = field(default_factory=PlayOptions)


@dataclass(frozen=True)
class Prepared:
    """A request's playbook loaded and checked, ready to run: ``path`` and ``loaded``,
    on ``target`` (with the variables beside a given playbook read too)."""

    request: ProvisionRequest
    path: Path
    loaded: Playbook
    target: Target

    def becoming(self, become: CliBecome) -> Prepared:
        """The same run, as ``become`` says (the command line's -K asks only now)."""
        play = dataclasses.replace(self.request.play, become=become)
        return dataclasses.replace(self, request=dataclasses.replace(self.request, play=play))


def prepare(request: ProvisionRequest, fixes: Fixes = Fixes()) -> Prepared:
    """The request's playbook loaded (validated whole), and the run refused, before
    anything runs on any node, when it would provision this machine's own environment
    or a setting the default playbook needs is missing (``fixes`` name what to give)."""
    path, loaded, target = load_playbook(request.target, request.playbook)
    refuse_local_default(target, request.playbook, request.play.tags, hint=fixes.inventory)
    refuse_unset_settings(target, request.playbook, loaded, how=fixes.settings)
    return Prepared(request, path, loaded, target)


def run_playbook(prepared: Prepared, listener: Listener | None = None) -> ProvisionResult:
    """Run the prepared playbook on the hosts of its target, telling ``listener`` each
    play and task. A host that fails or is unreachable is counted in its stats, not
    raised."""
    started = time.monotonic()
    target, play = prepared.target, prepared.request.play
    with ConnectionPool(target.connect) as pool:
        runner = LinearStrategy(
            prepared.loaded,
            target.inventory,
            target.hosts,
            pool,
            forks=target.forks,
            play=play,
            listener=listener,
        )
        stats = runner.run()
    seconds = time.monotonic() - started
    return ProvisionResult(str(prepared.path), play.check, seconds, stats, tuple(runner.log))


class ProvisionOptions(HostOptions, total=False):
    """provision()'s own keywords, beside the host keywords (``HostOptions``)."""

    playbook: str | os.PathLike[str] | None
    check: bool
    diff: bool
    tags: str | Sequence[str]
    skip_tags: str | Sequence[str]
    become: bool
    become_user: str | None
    become_password: str | None
    progress: bool


# provision's own keywords, beside the host keywords (a misspelt one's closest match).
_OWN = (
    "playbook", "check", "diff", "tags", "skip_tags", "become", "become_user",
    "become_password", "progress",
)  # fmt: skip


def provision(
    inventory: str | os.PathLike[str] | None = None, **keywords: Unpack[ProvisionOptions]
) -> ProvisionResult:
    """Run a playbook on every node, as ``cpuaccel provision`` does.

    ``playbook``: the playbook file (default: cpuaccel's provision.yaml, which needs an
    inventory: it is refused on this machine alone, but for ``tags="wheelhouse"``);
    ``check``: change nothing, report what would change; ``diff``: the text changes of
    copy and template (in the output, with ``progress``); ``tags`` and ``skip_tags``: only
    the tasks with these tags, or not those (a string may hold several, comma-separated);
    ``become``, ``become_user``, ``become_password``: run tasks as ``become_user``
    (default root) through sudo, as ``-b``, ``--become-user`` and ``-K`` do. The host
    keywords are ``target_of``'s. Prints the tasks and the recap only with ``progress``.

    Returns a ``ProvisionResult``; ``.ok`` is False when a host failed or was
    unreachable, which is never raised. Raises ``cpuaccel.errors.UsageError`` for a bad
    keyword, ``PlaybookError`` for a bad playbook, ``InventoryError`` or
    ``ProjectFileError`` for a wrong inventory or project file, all before anything runs
    on any node.
    """
    hosts: dict[str, Any] = dict(keywords)
    own = {name: hosts.pop(name) for name in _OWN if name in hosts}
    playbook, check, diff = own.get("playbook"), own.get("check", False), own.get("diff", False)
    become = own.get("become", False)
    with quiet_unless(own.get("progress", False)):
        if playbook is not None and not isinstance(playbook, (str, os.PathLike)):
            raise UsageError(
                f"playbook={playbook!r}: expected a path", hint="e.g. playbook='site.yaml'"
            )
        check_switches(check=check, diff=diff, become=become)
        chosen = _tags("tags", own.get("tags", ()))
        skipped = _tags("skip_tags", own.get("skip_tags", ()))
        settled = _become(become, own.get("become_user"), own.get("become_password"))
        target = HostKeywords.of(inventory, hosts, *_OWN).target()  # fmt: skip
        given = os.fspath(playbook) if playbook is not None else None
        play = PlayOptions(check, diff, chosen, skipped, settled)
        prepared = prepare(ProvisionRequest(target, given, play), KEYWORD_FIXES)
        display = Display(ui.stdout(), verbose=ui.verbosity >= 1, diff=diff)
        found = run_playbook(prepared, display)
        display.recap(found.stats, found.seconds)
        return found


def _tags(name: str, value: str | Sequence[str]) -> frozenset[str]:
    if isinstance(value, str):
        return tag_set([value])
    if isinstance(value, Sequence) and all(isinstance(t, str) for t in value):
        return tag_set(value)
    raise UsageError(
        f"{name}={value!r}: expected a tag or a list of tags", hint=f"e.g. {name}=['stack']"
    )


def _become(become: bool, user: str | None, password: str | None) -> CliBecome:
    """``become``, ``become_user`` and ``become_password`` checked as -b, --become-user
    and -K's answer are."""
    if user is not None and not isinstance(user, str):
        raise UsageError(f"become_user={user!r}: expected a login name", hint="e.g. 'root'")
    if user is not None and user_name_problem(user) is not None:
        raise UsageError(f"become_user={user_name_problem(user)}", hint="e.g. become_user='root'")
    if password is not None and not isinstance(password, str):
        raise UsageError(
            "become_password: expected a string",
            hint="give sudo's password as a str (or set ansible_become_password)",
        )
    return CliBecome(become, user, password or None)
