"""Read a playbook file and validate all of it before anything runs on any node.

Every mistake Ansible would only find at run time (an unknown module, an unknown
argument, a task with two modules, a ``when`` that does not parse, a missing template)
is a PlaybookError here, naming the file, the line and the task, with exit code 2.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from cpuaccel.errors import PlaybookError
from cpuaccel.playbook import modules as catalogue
from cpuaccel.playbook import templar
from cpuaccel.playbook.model import Play, Playbook, Task
from cpuaccel.playbook.sources import find_source
from cpuaccel.yamlsource import YamlReader

PLAY_KEYS = {"name", "hosts", "vars", "tasks", "gather_facts", "tags"}
TASK_KEYS = {
    "name",
    "when",
    "register",
    "changed_when",
    "failed_when",
    "loop",
    "with_items",
    "loop_control",
    "tags",
    "ignore_errors",
    "run_once",
    "vars",
    "args",
    "environment",
    "timeout",
    "check_mode",
}


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
        try:
            text = self.path.read_text()
        except OSError as exc:
            raise PlaybookError(
                f"cannot read the playbook: {exc.strerror}",
                source=self.source,
                hint="give an existing file with --playbook",
            ) from None
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
            hosts=str(raw["hosts"]),
            tasks=tasks,
            vars=dict(play_vars),
            file=self.source,
            line=line,
            gather_facts=bool(raw.get("gather_facts", True)),
        )

    def task(self, raw: Any, index: int, play_tags: frozenset[str]) -> Task:
        if not isinstance(raw, dict):
            raise self.error(
                f"task {index} is not a mapping",
                _line(raw, 0) or None,
                "write each task as '- name: ...' followed by one module",
            )
        line = _line(raw, 1)
        found = [key for key in raw if key not in TASK_KEYS]
        name = str(raw.get("name") or "")
        label = f"task {name!r}" if name else f"task {index}"
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
        module_name = found[0]
        module = catalogue.MODULES.get(module_name)
        if module is None:
            raise self.error(
                f"{label}: unknown module {module_name!r}",
                _key_line(raw, module_name, line),
                f"modules: {', '.join(sorted(catalogue.MODULES))}",
            )
        args = self.module_args(module, raw, label, line)
        if not name:
            name = module_name
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
        at = _key_line(raw, module_name, line)
        for value in _walk_strings(args):
            if templar.is_template(value):
                self.checked(templar.check_template, value, label, at, "fix the {{ }} expression")
        if module_name == "assert":
            for expr in _as_strings(args.get("that")):
                self.checked(
                    templar.check_expression,
                    expr,
                    f"{label}: that",
                    at,
                    "each 'that' item is a Jinja2 expression without {{ }}",
                )
        if (
            module_name == "template"
            and not templar.is_template(args.get("src"))
            and find_source(str(args["src"]), self.path.parent, "templates") is None
        ):
            raise self.error(
                f"{label}: template {args['src']!r} not found",
                _key_line(raw, module_name, line),
                f"put it in {self.path.parent / 'templates'} or next to the playbook, "
                "or give an absolute path",
            )
        if module_name == "copy" and "src" not in args and "content" not in args:
            raise self.error(
                f"{label}: copy needs src or content",
                _key_line(raw, module_name, line),
                "add 'src: FILE' (on the controller) or 'content: TEXT'",
            )
        loop = raw.get("loop", raw.get("with_items"))
        loop_control = raw.get("loop_control") or {}
        loop_var = (
            str(loop_control.get("loop_var", "item")) if isinstance(loop_control, dict) else "item"
        )
        task_vars = raw.get("vars") or {}
        if not isinstance(task_vars, dict):
            raise self.error(f"{label}: 'vars:' must be a mapping", line, "use key: value lines")
        return Task(
            name=name,
            module=module_name,
            args=args,
            file=self.source,
            line=line,
            when=when,
            register=str(raw["register"]) if raw.get("register") else None,
            changed_when=changed_when,
            failed_when=failed_when,
            loop=loop,
            loop_var=loop_var,
            tags=play_tags | frozenset(_as_strings(raw.get("tags"))),
            ignore_errors=bool(raw.get("ignore_errors", False)),
            run_once=bool(raw.get("run_once", False)),
            check_mode=bool(raw["check_mode"]) if "check_mode" in raw else None,
            vars=dict(task_vars),
        )

    def checked(
        self, check: Callable[[str], None], text: str, what: str, line: int, hint: str
    ) -> None:
        """Run a Jinja2 parse check; its error becomes this file's error at ``line``."""
        try:
            check(text)
        except templar.TemplateError as exc:
            raise self.error(f"{what}: {exc.message}", line, hint) from None

    def module_args(
        self, module: catalogue.Module, raw: Mapping[str, Any], label: str, line: int
    ) -> dict[str, Any]:
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
                if module.name not in ("command", "shell", "pip"):
                    raise self.error(
                        f"{label}: '{keyword}:' applies to command, shell and pip only",
                        _key_line(raw, keyword, at),
                        f"remove '{keyword}:' from this task",
                    )
                args[keyword] = raw[keyword]
        if module.any_args:
            return args
        for name in args:
            if module.canonical(name) is None and name != "timeout":
                raise self.error(
                    f"{label}: {catalogue.unknown_arg_message(module, name)}",
                    _key_line(value, name, at),
                    f"see 'cpuaccel provision --list-modules' for {module.name}'s arguments",
                )
        present = {module.canonical(n) for n in args}
        for name, spec in module.args.items():
            if spec.required and name not in present:
                raise self.error(
                    f"{label}: {module.name} needs the argument {name!r}",
                    at,
                    f"add '{name}: ...' under '{module.name}:'",
                )
        # Literal values are checked now; templated ones when rendered for each host.
        literal = {k: v for k, v in args.items() if k != "timeout" and not _has_template(v)}
        try:
            catalogue.normalise(module, literal)
        except catalogue.ArgError as exc:
            raise self.error(f"{label}: {exc.message}", at, "fix the argument's value") from None
        return args


def _key_line(value: Any, key: str, default: int) -> int:
    key_lines = getattr(value, "key_lines", None)
    return int(key_lines.get(key, default)) if key_lines else default


def _has_template(value: Any) -> bool:
    return any(templar.is_template(s) for s in _walk_strings(value))


def _walk_strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _walk_strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _walk_strings(v)]
    return []


def load(path: str | Path) -> Playbook:
    """The validated playbook at ``path``; raises PlaybookError with file and line."""
    return _Reader(Path(path)).read()
