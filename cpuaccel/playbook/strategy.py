"""Run a playbook with Ansible's linear strategy.

Each task runs on every remaining host in parallel (up to ``forks``, through the
executor's fan-out), then the next task starts. A host that fails drops out of the rest
of the playbook; the others go on. Variables, lowest first: inventory, play vars,
gathered facts, registered results and set_fact, task vars, then ``-e`` over everything.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cpuaccel import __version__, templating
from cpuaccel.connectors.base import Connector
from cpuaccel.errors import CpuaccelError, HostError
from cpuaccel.executor import ConnectionPool, fan_out
from cpuaccel.inventory.host import Host
from cpuaccel.inventory.inventory import EXTRA_VARS_SOURCE, Inventory
from cpuaccel.playbook import become as becoming
from cpuaccel.playbook import copy_broadcast, synchronize_broadcast, templar
from cpuaccel.playbook import modules as catalogue
from cpuaccel.playbook.actions import ACTIONS, FINISHERS, HostContext, Result
from cpuaccel.playbook.loader import Play, Playbook, Task
from cpuaccel.playbook.preparing import Caster

FACTS_VAR = "cpuaccel_facts"

# A module's step across all of a task's hosts, before each host's own run: given the
# hosts ready to run it (with their rendered arguments), and how to broadcast to them.
Preparer = Callable[[Sequence[tuple[HostContext, dict[str, Any]]], Caster], None]
PREPARERS: dict[str, Preparer] = {
    "synchronize": synchronize_broadcast.prepare,
    "copy": copy_broadcast.prepare,
}


# ---------------------------------------------------------------- the recap's counts
# Per-host counts for the recap, in Ansible's shape.
@dataclass
class HostStats:
    # Ansible counts a changed task under ok too: ok=12 changed=3 is 12 tasks that
    # ended well, 3 of which changed something.
    ok: int = 0
    changed: int = 0
    unreachable: int = 0
    failed: int = 0
    skipped: int = 0
    rescued: int = 0
    ignored: int = 0

    def count(self, status: str, changed: bool) -> None:
        if status in ("ok", "changed"):
            self.ok += 1
            self.changed += int(changed)
        elif status == "ignored":
            self.ignored += 1
        else:
            setattr(self, status, getattr(self, status) + 1)

    @property
    def succeeded(self) -> bool:
        return self.failed == 0 and self.unreachable == 0

    def line(self) -> str:
        return " ".join(f"{k}={v}" for k, v in asdict(self).items())

    def to_json(self) -> dict[str, int]:
        return asdict(self)


@dataclass
class HostState:
    host: Host
    ctx: HostContext
    facts: dict[str, Any] = field(default_factory=dict)  # registered and set_fact
    extra_vars: dict[str, Any] = field(default_factory=dict)  # -e: over everything
    failed: bool = False
    unreachable: bool = False
    stats: HostStats = field(default_factory=HostStats)
    # Every become password the host used (a later task without become may print one too).
    secrets: set[str] = field(default_factory=set)

    @property
    def active(self) -> bool:
        return not (self.failed or self.unreachable)


class Listener:
    """What the display hears; every method may be left as is."""

    def play_start(self, play: Play, hosts: Sequence[str]) -> None: ...

    def task_start(self, task: Task | None, title: str, hosts: Sequence[str]) -> None: ...

    def host_progress(self, host: str) -> None:
        """A host finished the current step (called from the strategy's thread)."""

    def note(self, text: str) -> None:
        """A line about the task as a whole (a node a broadcast cut out)."""

    def transfer(self, description: str) -> Callable[[int, int], None]:
        """A meter for bytes on their way: called with (bytes so far, of total)."""
        return lambda done, total: None

    def task_end(self, task: Task | None, title: str, results: Mapping[str, Result]) -> None: ...


def _status(result: Result) -> str:
    if result.get("unreachable"):
        return "unreachable"
    if result.get("failed"):
        return "ignored" if result.get("ignored") else "failed"
    if result.get("skipped"):
        return "skipped"
    return "changed" if result.get("changed") else "ok"


def status_of(result: Result) -> str:
    return _status(result)


def selected(task: Task, tags: frozenset[str], skip_tags: frozenset[str]) -> bool:
    """Ansible's tag rules: 'always' runs unless skipped by name, 'never' only on request."""
    if task.tags & skip_tags:
        return False
    if "never" in task.tags and not (task.tags & tags):
        return False
    if not tags or "all" in tags:
        return True
    return bool(task.tags & (tags | {"always"}))


@dataclass(frozen=True)
class PlayOptions:
    """How a playbook runs, as ansible-playbook's flags say: ``check`` changes nothing
    and reports what would change, ``diff`` shows the text changes of copy and template,
    ``tags`` and ``skip_tags`` choose the tasks (``selected``), ``become`` is -b,
    --become-user and -K's password."""

    check: bool = False
    diff: bool = False
    tags: frozenset[str] = frozenset()
    skip_tags: frozenset[str] = frozenset()
    become: becoming.CliBecome = field(default_factory=becoming.CliBecome)


class LinearStrategy:
    def __init__(
        self,
        playbook: Playbook,
        inventory: Inventory,
        hosts: Sequence[Host],
        pool: ConnectionPool,
        *,
        forks: int,
        play: PlayOptions | None = None,
        controller_vars: Mapping[str, Any] | None = None,
        listener: Listener | None = None,
    ) -> None:
        play = play or PlayOptions()
        self.playbook = playbook
        self.inventory = inventory
        self.limit = {h.name for h in hosts}
        self.pool = pool  # it connects with the run's ConnectOptions
        self.forks = forks
        self.check, self.diff = play.check, play.diff
        self.tags, self.skip_tags = play.tags, play.skip_tags
        self.controller_vars = dict(controller_vars or {})
        self.listener = listener or Listener()
        self.become = play.become
        self.states: dict[str, HostState] = {}
        # Neither the inventory nor -e changes during a run: derived once, not per task.
        every = inventory.every_group_hosts()
        self.groups = {name: list(every[name]) for name in inventory.groups}
        self._selected: dict[str, list[str]] = {}
        for host in hosts:
            ctx = HostContext(
                host=host,
                connect=self._connector(host),
                playbook_dir=playbook.directory,
                check=play.check,
                diff=play.diff,
            )
            self.states[host.name] = HostState(host, ctx, extra_vars=self._extra_vars(host))
        self.log: list[dict[str, Any]] = []  # per play and task, for --json

    def _connector(self, host: Host) -> Callable[[], Connector]:
        return lambda: self.pool.get(host)

    # -- variables -------------------------------------------------------------------

    def _extra_vars(self, host: Host) -> dict[str, Any]:
        return {
            name: value
            for name, value in host.vars.items()
            if (origin := self.inventory.origin(host.name, name)) is not None
            and origin.source == EXTRA_VARS_SOURCE
        }

    def variables(self, state: HostState, play: Play, task: Task | None) -> dict[str, Any]:
        host = state.host
        merged: dict[str, Any] = {
            **self.controller_vars,
            "inventory_hostname": host.name,
            "inventory_hostname_short": host.name.split(".")[0],
            "group_names": [g for g in host.groups if g != "all"],
            "groups": self.groups,
            "playbook_dir": str(self.playbook.directory),
            "ansible_check_mode": self.check,
            "ansible_diff_mode": self.diff,
            "ansible_play_hosts": [s.host.name for s in self._play_states(play) if s.active],
            "cpuaccel_version": __version__,
            **host.vars,
        }
        merged.update(self._render_vars(play.vars, merged))
        merged.update(state.facts)
        if task is not None and task.vars:
            merged.update(self._render_vars(task.vars, merged))
        merged.update(state.extra_vars)
        return merged

    @staticmethod
    def _render_vars(raw: Mapping[str, Any], base: Mapping[str, Any]) -> dict[str, Any]:
        # Lazily, in order: a play var may use an inventory var or an earlier play var.
        out: dict[str, Any] = {}
        for name, value in raw.items():
            out[name] = templar.render(value, {**base, **out})
        return out

    def _play_states(self, play: Play) -> list[HostState]:
        # Asked for every host of every task: the pattern is resolved once per play.
        names = self._selected.get(play.hosts)
        if names is None:
            names = self._selected[play.hosts] = [
                h.name for h in self.inventory.select_pattern(play.hosts) if h.name in self.limit
            ]
        return [self.states[name] for name in names]

    # -- running ---------------------------------------------------------------------

    def run(self) -> dict[str, HostStats]:
        try:
            for play in self.playbook.plays:
                self.run_play(play)
        finally:
            for state in self.states.values():
                state.ctx.close()
        return {name: s.stats for name, s in self.states.items()}

    def run_play(self, play: Play) -> None:
        try:
            states = self._play_states(play)
        except CpuaccelError as exc:
            raise CpuaccelError(
                f"{play.file}:{play.line}: play {play.name!r}: {exc.message}"
            ) from None
        self.listener.play_start(play, [s.host.name for s in states])
        entry: dict[str, Any] = {
            "play": play.name,
            "hosts": [s.host.name for s in states],
            "tasks": [],
        }
        self.log.append(entry)
        try:  # a play var that cannot render stops the play before any task runs
            for state in states:
                self.variables(state, play, None)
        except templating.TemplateError as exc:
            raise CpuaccelError(
                f"{play.file}:{play.line}: play {play.name!r}: vars: {exc.message}",
                hint="define the variable in the inventory, the play's vars, or with -e",
            ) from None
        if play.gather_facts:
            self._run_step(play, None, "Gathering Facts", entry)
        for task in play.tasks:
            if not selected(task, self.tags, self.skip_tags):
                continue
            self._run_step(play, task, task.name, entry)

    def _run_step(self, play: Play, task: Task | None, title: str, entry: dict[str, Any]) -> None:
        states = [s for s in self._play_states(play) if s.active]
        if not states:
            return
        self.listener.task_start(task, title, [s.host.name for s in states])
        started = time.monotonic()
        targets = states[:1] if task is not None and task.run_once else states
        notes: list[str] = []
        if task is not None and task.module in PREPARERS and len(targets) >= 2:
            self._prepare(play, task, targets, notes)

        def one(state: HostState) -> tuple[str, Result]:
            result = (
                self._gather(state, play) if task is None else self._run_task(state, play, task)
            )
            # A become password never reaches the display, --json or a registered result.
            return state.host.name, becoming.mask(result, self._secrets(state))

        # The executor's fan-out, not run_on_hosts: a task connects only when it needs
        # the node (through its HostContext and the pool), so assert, debug and set_fact
        # never open a connection, and an unreachable host is this task's result.
        done = fan_out(
            targets,
            one,
            forks=max(1, self.forks),
            on_done=lambda pair: self.listener.host_progress(pair[0]),
        )
        results: dict[str, Result] = dict(done)
        if task is not None and task.module in FINISHERS:
            FINISHERS[task.module](results, {n: task.args for n in results})
        if task is not None and task.run_once:
            only = results[targets[0].host.name]
            results = {s.host.name: dict(only) for s in states}
        for state in states:
            result = results[state.host.name]
            self._settle(state, task, result)
        self.listener.task_end(task, title, results)
        entry["tasks"].append(
            {
                "task": title,
                "module": task.module if task else "gather_facts",
                "where": task.where if task else None,
                "seconds": round(time.monotonic() - started, 3),
                "hosts": {name: _for_json(r) for name, r in results.items()},
                **({"notes": notes} if notes else {}),
            }
        )

    def _prepare(
        self, play: Play, task: Task, states: Sequence[HostState], notes: list[str]
    ) -> None:
        """The module's step across the hosts (PREPARERS), for those whose task is ready
        to run as it stands; a host whose arguments do not render, or that skips, is left
        to its own run, which says why."""
        if task.loop is not None:
            return
        ready: list[tuple[HostContext, dict[str, Any]]] = []
        for state in states:
            check = task.check_mode if task.check_mode is not None else state.ctx.check
            if check:
                continue
            try:
                variables = self.variables(state, play, task)
                if not all(templar.condition(expr, variables) for expr in task.when):
                    continue
                become = becoming.resolve(self.become, (play.become, task.become), variables)
                rendered = templar.render(dict(task.args), variables)
                rendered.pop("timeout", None)
                args = catalogue.normalise(catalogue.MODULES[task.module], rendered)
            except CpuaccelError:
                continue
            if become is None:
                state.ctx.become = None  # its requests go to the SSH user's agent, as the task's
                ready.append((state.ctx, args))

        def note(text: str) -> None:
            notes.append(text)
            self.listener.note(text)

        meters: list[Callable[[int, int], None]] = []

        def moved(done: int, total: int) -> None:
            if not meters:  # a bar only once bytes move
                meters.append(self.listener.transfer("broadcast"))
            meters[0](done, total)

        PREPARERS[task.module](ready, Caster(self.pool, note, moved))

    def _settle(self, state: HostState, task: Task | None, result: Result) -> None:
        """Count the result, register it, and drop the host if it failed."""
        if task is not None:
            if task.register:
                state.facts[task.register] = result
            facts = result.get("ansible_facts")
            if isinstance(facts, dict) and not result.get("failed"):
                state.facts.update(facts)
        if result.get("failed") and task is not None and task.ignore_errors:
            result["ignored"] = True
        status = _status(result)
        state.stats.count(status, bool(result.get("changed")))
        if status == "unreachable":
            state.unreachable = True
        elif status == "failed":
            state.failed = True

    def _secrets(self, state: HostState) -> list[str]:
        now = state.ctx.become.password if state.ctx.become else None
        found = [state.host.vars.get(name) for name in becoming.PASSWORD_VARS]
        return becoming.remember(state.secrets, self.become.password, now, *found)

    def _gather(self, state: HostState, play: Play) -> Result:
        """Facts from the host's agent (the play's become's), which runs the probe in its
        own process."""
        from cpuaccel.facts.gather import settle

        host = state.host
        request: dict[str, Any] = {"workdir": host.workdir, "setvars": host.setvars, "resolve": []}
        args = {"request": request}
        try:
            variables = self.variables(state, play, None)
            state.ctx.become = becoming.resolve(self.become, (play.become,), variables)
        except CpuaccelError as exc:
            msg = f"{play.file}:{play.line}: {exc.message}"
            return {"failed": True, "changed": False, "msg": msg, "hint": exc.hint}
        try:
            state.ctx.agent()  # started first: its start-up is no clock skew
            sent = time.time()
            reply = state.ctx.request("facts", args)
        except HostError as exc:
            return _host_error(exc)
        if reply.get("failed") or not isinstance(reply.get("facts"), dict):
            return {"failed": True, "changed": False, "msg": f"facts: {reply.get('msg')}"}
        state.facts[FACTS_VAR] = settle(reply["facts"], sent, time.time())
        return {"changed": False, "failed": False}

    def _run_task(self, state: HostState, play: Play, task: Task) -> Result:
        try:
            return self._run_task_items(state, play, task)
        finally:  # what a preparer left for this task is this task's, whatever became of it
            state.ctx.broadcast, state.ctx.recheck = [], False

    def _run_task_items(self, state: HostState, play: Play, task: Task) -> Result:
        try:
            variables = self.variables(state, play, task)
            state.ctx.become = becoming.resolve(self.become, (play.become, task.become), variables)
            if task.loop is None:
                return self._run_item(state, task, variables)
            items = templar.render(task.loop, variables)
            if not isinstance(items, list):
                return {"failed": True, "msg": f"loop must be a list, got {templar.to_text(items)}"}
            results = [
                self._run_item(state, task, {**variables, task.loop_var: item}) for item in items
            ]
            return {
                "results": results,
                "changed": any(r.get("changed") for r in results),
                "failed": any(r.get("failed") for r in results),
                "skipped": bool(results) and all(r.get("skipped") for r in results),
                "msg": next((r["msg"] for r in results if r.get("failed") and r.get("msg")), ""),
            }
        except HostError as exc:
            return _host_error(exc)
        except CpuaccelError as exc:
            failed = {"failed": True, "changed": False, "msg": f"{task.where}: {exc.message}"}
            return {**failed, "hint": exc.hint} if exc.hint else failed

    def _run_item(self, state: HostState, task: Task, variables: dict[str, Any]) -> Result:
        for expr in task.when:
            if not templar.condition(expr, variables):
                return {"skipped": True, "changed": False, "skip_reason": f"when: {expr} was false"}
        module = catalogue.MODULES[task.module]
        rendered = templar.render(dict(task.args), variables)
        timeout = rendered.pop("timeout", None)
        try:
            args = catalogue.normalise(module, rendered)
        except catalogue.ArgError as exc:
            return {"failed": True, "changed": False, "msg": exc.message}
        if timeout is not None:
            args["timeout"] = timeout
        check = state.ctx.check
        if task.check_mode is not None:
            state.ctx.check = task.check_mode  # one task at a time per host: no race
        try:
            result = ACTIONS[task.module](state.ctx, args, variables)
        finally:
            state.ctx.check = check
        result.setdefault("changed", False)
        result.setdefault("failed", False)
        if task.register:
            variables = {**variables, task.register: result}
        if task.changed_when is not None and not result.get("skipped"):
            result["changed"] = all(templar.condition(e, variables) for e in task.changed_when)
        if task.failed_when is not None and not result.get("skipped"):
            failed = any(templar.condition(e, variables) for e in task.failed_when)
            if failed and not result.get("failed"):
                result["msg"] = result.get("msg") or f"failed_when: {' or '.join(task.failed_when)}"
            result["failed"] = failed
        return result


def _host_error(exc: HostError) -> Result:
    return {
        # sudo refusing the password: the host answered, so it failed, not unreachable.
        "unreachable": not isinstance(exc, becoming.BecomeError),
        "failed": True,
        "changed": False,
        "msg": exc.reason,
        "hint": exc.hint,
    }


def _for_json(result: Result) -> Result:
    out = {k: v for k, v in result.items() if k not in ("content_b64",)}
    out["status"] = _status(result)
    return out


def default_playbook() -> Path:
    from cpuaccel.resources import data_dir

    return data_dir("playbooks") / "provision.yaml"
