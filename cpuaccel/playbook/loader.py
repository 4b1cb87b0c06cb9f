"""Read a playbook file and validate all of it before anything runs on any node.

Every mistake Ansible would only find at run time (an unknown module, an unknown
argument, a task with two modules, a ``when`` that does not parse, a missing template)
is a PlaybookError here, naming the file, the line and the task, with exit code 64.
So is every Ansible keyword outside cpuaccel's subset (playbook/subset.py): nothing in
a playbook is silently ignored.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cpuaccel import templating
from cpuaccel.errors import PlaybookError
from cpuaccel.inventory.variables import parse_bool
from cpuaccel.playbook import become as becoming
from cpuaccel.playbook import modules as catalogue
from cpuaccel.playbook import subset, templar
from cpuaccel.playbook.argspec import Where
from cpuaccel.sourcefile import read_source
from cpuaccel.yamlsource import YamlReader

# become, become_user, become_method: provision's sudo (playbook/become.py).
PLAY_KEYS = subset.PLAY_KEYS | set(becoming.KEYWORDS)
TASK_KEYS = subset.TASK_KEYS | set(becoming.KEYWORDS)


def _line(value: Any, default: int) -> int:
    return int(getattr(value, "line", 0) or default)


def _as_strings(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, list):
        return tuple(str(v) for v in value)
    return (str(value),)


class _Reader:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.source = str(path)

    def error(self, message: str, line: int | None, hint: str) -> PlaybookError:
        return PlaybookError(message, source=self.source, line=line, hint=hint)

    def read(self) -> Playbook:
        text = read_source(self.path, PlaybookError, "playbook", "give a YAML file with --playbook")
        # Mappings and lists keep their lines (.line, .key_lines) for the errors below.
        data = YamlReader(self.source, PlaybookError).load(text, lines=True)
        if not isinstance(data, list) or not data:
            raise self.error(
                "a playbook is a list of plays",
                _line(data, 1),
                "start the file with '- name: ...' / '  hosts: all' / '  tasks: [...]'",
            )
        plays = tuple(self.play(raw, index) for index, raw in enumerate(data, 1))
        return Playbook(self.path, plays)

    def play(self, raw: Any, index: int) -> Play:
        if not isinstance(raw, dict):
            raise self.error(
                f"play {index} is not a mapping", None, "each play is '- hosts: ...' + tasks"
            )
        line = _line(raw, 1)
        self.refuse_outside_subset(raw, line, on_play=True)
        for key in raw:
            if key not in PLAY_KEYS:
                raise self.error(
                    f"unknown play keyword {key!r}",
                    _key_line(raw, key, line),
                    f"a play takes {', '.join(sorted(PLAY_KEYS))}",
                )
        if "hosts" not in raw:
            raise self.error(f"play {index} has no 'hosts:'", line, "add 'hosts: all'")
        name = str(raw.get("name") or f"play {index}")
        play_vars = raw.get("vars") or {}
        if not isinstance(play_vars, dict):
            raise self.error("'vars:' must be a mapping", line, "write 'vars:' as key: value lines")
        tasks_raw = raw.get("tasks") or []
        if not isinstance(tasks_raw, list):
            raise self.error("'tasks:' must be a list", line, "write each task as '- name: ...'")
        play_tags = frozenset(_as_strings(raw.get("tags")))
        tasks = tuple(self.task(t, i, play_tags) for i, t in enumerate(tasks_raw, 1))
        return Play(
            name=name,
            hosts=_pattern(raw["hosts"]),
            tasks=tasks,
            vars=dict(play_vars),
            file=self.source,
            line=line,
            gather_facts=self.flag(raw, "gather_facts", True, f"play {index}", line),
            become=self.become(raw, f"play {name!r}", line),
        )

    def task(self, raw: Any, index: int, play_tags: frozenset[str]) -> Task:
        """Task keywords here; the module's arguments are its own spec's to check."""
        if not isinstance(raw, dict):
            raise self.error(
                f"task {index} is not a mapping",
                _line(raw, 0) or None,
                "write each task as '- name: ...' followed by one module",
            )
        line = _line(raw, 1)
        self.refuse_outside_subset(raw, line, on_play=False)
        name = str(raw.get("name") or "")
        label = f"task {name!r}" if name else f"task {index}"
        module = self.module(raw, label, line)
        args, where = self.module_args(module, raw, label, line)
        module.validate(args, where)
        when, changed_when, failed_when = self.conditions(raw, label, line)
        self.loop_and_register(raw, label, line)
        loop_var = self.loop_var(raw, label, line)
        task_vars = raw.get("vars") or {}
        if not isinstance(task_vars, dict):
            raise self.error(f"{label}: 'vars:' must be a mapping", line, "use key: value lines")
        return Task(
            name=name or module.name,
            module=module.name,
            args=args,
            file=self.source,
            line=line,
            when=when,
            register=str(raw["register"]) if raw.get("register") else None,
            changed_when=changed_when,
            failed_when=failed_when,
            loop=raw.get("loop", raw.get("with_items")),
            loop_var=loop_var,
            tags=play_tags | frozenset(_as_strings(raw.get("tags"))),
            ignore_errors=self.flag(raw, "ignore_errors", False, label, line),
            run_once=self.flag(raw, "run_once", False, label, line),
            check_mode=self.flag(raw, "check_mode", False, label, line)
            if "check_mode" in raw
            else None,
            vars=dict(task_vars),
            become=self.become(raw, label, line),
        )

    def refuse_outside_subset(self, raw: Mapping[str, Any], line: int, *, on_play: bool) -> None:
        """An Ansible keyword cpuaccel does not run is an error at its line, with what to
        write instead: never ignored, never taken for a module."""
        for key in raw:
            refused = subset.refusal(str(key), on_play=on_play)
            if refused is not None:
                raise self.error(refused[0], _key_line(raw, key, line), refused[1])

    def flag(self, raw: Mapping[str, Any], key: str, default: bool, label: str, line: int) -> bool:
        """A boolean keyword read as Ansible reads it; anything else (``maybe``, a
        template) is refused rather than taken as true."""
        if key not in raw:
            return default
        value = parse_bool(raw[key])
        if value is None:
            raise self.error(
                f"{label}: {key}: takes true or false, got {raw[key]!r}",
                _key_line(raw, key, line),
                f"write '{key}: true' or '{key}: false'",
            )
        return value

    def loop_var(self, raw: Mapping[str, Any], label: str, line: int) -> str:
        """``loop_control``: only its ``loop_var`` is supported; any other key is refused."""
        control = raw.get("loop_control")
        if control is None:
            return "item"
        at = _key_line(raw, "loop_control", line)
        if not isinstance(control, dict):
            raise self.error(
                f"{label}: 'loop_control:' must be a mapping", at, "write 'loop_var: NAME' under it"
            )
        for key in control:
            if key not in subset.LOOP_CONTROL_KEYS:
                raise self.error(
                    f"loop_control.{key}: not supported by cpuaccel (only loop_var)",
                    _key_line(control, key, at),
                    f"remove '{key}:' from loop_control",
                )
        name = control.get("loop_var", "item")
        if not (isinstance(name, str) and name.isidentifier()):
            raise self.error(
                f"{label}: loop_control.loop_var: {name!r} is not a variable name",
                _key_line(control, "loop_var", at),
                "name the loop variable with letters, digits and '_'",
            )
        return name

    def become(self, raw: Mapping[str, Any], label: str, line: int) -> dict[str, Any]:
        """become, become_user and become_method (become.check_keywords), at their line."""
        try:
            return becoming.check_keywords(raw)
        except becoming.KeywordError as exc:
            raise self.error(f"{label}: {exc}", _key_line(raw, exc.key, line), exc.hint) from None

    def module(self, raw: Mapping[str, Any], label: str, line: int) -> catalogue.Module:
        """The task's one module: every key that is not a task keyword names it."""
        found = [key for key in raw if key not in TASK_KEYS]
        if not found:
            raise self.error(
                f"{label} has no module",
                line,
                f"add one of: {', '.join(sorted(catalogue.MODULES))}",
            )
        if len(found) > 1:
            known = [k for k in found if k in catalogue.MODULES]
            unknown = [k for k in found if k not in catalogue.MODULES]
            if unknown:
                key = unknown[0]
                raise self.error(
                    f"{label}: unknown module or keyword {key!r}",
                    _key_line(raw, key, line),
                    f"modules: {', '.join(sorted(catalogue.MODULES))}; task keywords: "
                    f"{', '.join(sorted(TASK_KEYS))}",
                )
            raise self.error(
                f"{label} has two modules: {', '.join(known)}",
                _key_line(raw, known[1], line),
                "split it into two tasks, one module each",
            )
        module = catalogue.MODULES.get(found[0])
        if module is None:
            raise self.error(
                f"{label}: unknown module {found[0]!r}",
                _key_line(raw, found[0], line),
                f"modules: {', '.join(sorted(catalogue.MODULES))}",
            )
        return module

    def conditions(
        self, raw: Mapping[str, Any], label: str, line: int
    ) -> tuple[tuple[str, ...], tuple[str, ...] | None, tuple[str, ...] | None]:
        """``when``, ``changed_when`` and ``failed_when``, each expression parsed now."""
        when = _as_strings(raw.get("when"))
        changed_when = _as_strings(raw["changed_when"]) if "changed_when" in raw else None
        failed_when = _as_strings(raw["failed_when"]) if "failed_when" in raw else None
        for key, exprs in (
            ("when", when),
            ("changed_when", changed_when or ()),
            ("failed_when", failed_when or ()),
        ):
            for expr in exprs:
                if expr not in ("True", "False"):
                    self.checked(
                        templar.check_expression,
                        expr.strip().removeprefix("{{").removesuffix("}}"),
                        f"{label}: {key}",
                        _key_line(raw, key, line),
                        "write a Jinja2 expression without {{ }}, e.g. 'when: result is changed'",
                    )
        return when, changed_when, failed_when

    def loop_and_register(self, raw: Mapping[str, Any], label: str, line: int) -> None:
        """What Ansible refuses when it loads a task, refused here too: not at run time,
        after other tasks have changed the nodes."""
        register = raw.get("register")
        if register is not None and not (isinstance(register, str) and register.isidentifier()):
            raise self.error(
                f"{label}: register: {register!r} is not a variable name",
                _key_line(raw, "register", line),
                "register the result under a name of letters, digits and '_', e.g. "
                "'register: result'",
            )
        for key in ("loop", "with_items"):
            value = raw.get(key)
            if value is not None and not isinstance(value, list) and not templar.is_template(value):
                raise self.error(
                    f"{key}: takes a list or a '{{{{ expression }}}}', got {value!r}",
                    _key_line(raw, key, line),
                    f"write '{key}:' followed by '- item' lines, or e.g. "
                    f"'{key}: \"{{{{ names }}}}\"'",
                )

    def checked(
        self, check: Callable[[str], None], text: str, what: str, line: int, hint: str
    ) -> None:
        """Run a Jinja2 parse check; its error becomes this file's error at ``line``."""
        try:
            check(text)
        except templating.TemplateError as exc:
            raise self.error(f"{what}: {exc.message}", line, hint) from None

    def module_args(
        self, module: catalogue.Module, raw: Mapping[str, Any], label: str, line: int
    ) -> tuple[dict[str, Any], Where]:
        """The arguments as written (free form, ``args:``, task keywords), and their lines."""
        value = raw[module.name]
        at = _key_line(raw, module.name, line)
        args: dict[str, Any]
        if value is None:
            args = {}
        elif isinstance(value, str | int | float) and module.free_form:
            # `command: true` is the program true, not YAML's boolean.
            text = str(value).lower() if isinstance(value, bool) else str(value)
            args = {module.free_form: text}
        elif isinstance(value, dict):
            args = dict(value)
        else:
            raise self.error(
                f"{label}: {module.name} takes a mapping of arguments",
                at,
                f"write '{module.name}:' followed by indented 'argument: value' lines",
            )
        extra = raw.get("args")
        if extra is not None:
            if not isinstance(extra, dict):
                raise self.error(f"{label}: 'args:' must be a mapping", at, "use key: value lines")
            args.update(extra)
        for keyword in ("environment", "timeout"):
            if keyword in raw:
                if keyword not in module.task_keywords:
                    raise self.error(
                        f"{label}: '{keyword}:' applies to "
                        f"{catalogue.keyword_takers(keyword)} only",
                        _key_line(raw, keyword, at),
                        f"remove '{keyword}:' from this task",
                    )
                args[keyword] = raw[keyword]
        lines = {name: _key_line(value, name, at) for name in args}
        return args, Where(self.source, at, label, self.path.parent, lines)


def _pattern(hosts: Any) -> str:
    """``hosts:`` as one pattern: Ansible takes a list of patterns too, the same as
    their comma list (str() of the list would be a pattern matching nothing)."""
    return ",".join(map(str, hosts)) if isinstance(hosts, list) else str(hosts)


def _key_line(value: Any, key: str, default: int) -> int:
    key_lines = getattr(value, "key_lines", None)
    return int(key_lines.get(key, default)) if key_lines else default


def load(path: str | Path) -> Playbook:
    """The validated playbook at ``path``; raises PlaybookError with file and line."""
    return _Reader(Path(path)).read()


# ---------------------------------------------------------------- the loaded playbook
# What a playbook is once loaded and validated: plays of tasks, each task one module.
@dataclass(frozen=True)
class Task:
    """One task: a module with its (not yet rendered) arguments and its keywords."""

    name: str
    module: str
    args: Mapping[str, Any]
    file: str
    line: int
    when: tuple[str, ...] = ()
    register: str | None = None
    changed_when: tuple[str, ...] | None = None
    failed_when: tuple[str, ...] | None = None
    loop: Any = None  # a list, or a Jinja string that renders to one
    loop_var: str = "item"
    tags: frozenset[str] = frozenset()
    ignore_errors: bool = False
    run_once: bool = False
    # Ansible's check_mode: false runs a read-only task even under --check.
    check_mode: bool | None = None
    vars: Mapping[str, Any] = field(default_factory=dict)
    # The become keywords written on the task (become, become_user, become_method).
    become: Mapping[str, Any] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True)
class Play:
    name: str
    hosts: str  # an Ansible host pattern
    tasks: tuple[Task, ...]
    vars: Mapping[str, Any]
    file: str
    line: int
    gather_facts: bool = True
    become: Mapping[str, Any] = field(default_factory=dict)  # as on Task


@dataclass(frozen=True)
class Playbook:
    path: Path
    plays: tuple[Play, ...]

    @property
    def directory(self) -> Path:
        return self.path.parent

    def tasks(self) -> list[Task]:
        return [task for play in self.plays for task in play.tasks]
