"""A module's argument spec, and the checks every spec makes: Ansible's model.

Each module in ``modules.py`` declares its arguments (kind, required, choices, aliases,
defaults), its rules over several arguments (``OneOf``, Ansible's required_one_of) and,
where a rule needs more than a declaration, its own ``check``. ``Module.validate`` runs
them all when the playbook is loaded, so the loader knows no module by name; ``normalise``
runs again for each host on the rendered values.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cpuaccel import templating
from cpuaccel.errors import CpuaccelError, PlaybookError
from cpuaccel.playbook import templar

# Set by the task keyword ``timeout:``; the strategy takes it out of the arguments before
# they are normalised, so no module declares it (and none refuses it).
TIMEOUT = "timeout"


class ArgError(CpuaccelError):
    """An argument has the wrong type or value (the caller adds file, line and task)."""


@dataclass(frozen=True)
class Arg:
    kind: str = "str"  # str | path | bool | int | float | list | dict | mode | raw
    required: bool = False
    choices: tuple[str, ...] = ()
    default: Any = None
    aliases: tuple[str, ...] = ()


@dataclass(frozen=True)
class OneOf:
    """Ansible's required_one_of: at least one of ``names`` is given."""

    names: tuple[str, ...]
    hint: str


@dataclass(frozen=True)
class Where:
    """Where a task's module was written, so that a module's check names file and line."""

    source: str  # the playbook file
    line: int  # the line of the module's key
    label: str  # "task 'name'", or "task 3" when it has none
    directory: Path  # the playbook's folder: templates/ and files/ are found from it
    arg_lines: Mapping[str, int] = field(default_factory=dict)  # each argument's own line

    def error(self, message: str, hint: str, arg: str | None = None) -> PlaybookError:
        line = self.arg_lines.get(arg, self.line) if arg is not None else self.line
        return PlaybookError(f"{self.label}: {message}", source=self.source, line=line, hint=hint)

    def parse(self, check: Callable[[str], None], text: str, what: str, hint: str) -> None:
        """Run a Jinja2 parse check; its error becomes this task's error."""
        try:
            check(text)
        except templating.TemplateError as exc:
            message = f"{what}: {exc.message}" if what else exc.message
            raise self.error(message, hint) from None


Check = Callable[[Mapping[str, Any], Where], None]


@dataclass(frozen=True)
class Module:
    name: str
    args: Mapping[str, Arg]
    # Ansible's free form: `command: echo hi` puts the string into this argument.
    free_form: str | None = None
    # set_fact takes any names: its arguments are the variables it sets.
    any_args: bool = False
    # A module that never touches a node is run by the controller (assert, debug ...).
    on_controller: bool = False
    summary: str = ""
    # Task keywords (environment:, timeout:) that this module takes into its arguments.
    task_keywords: tuple[str, ...] = ()
    one_of: tuple[OneOf, ...] = ()
    # The module's own rule, when a declaration cannot say it (a template must exist).
    check: Check | None = None

    def canonical(self, name: str) -> str | None:
        """The argument's own name for ``name`` or one of its aliases; None if unknown."""
        if name in self.args:
            return name
        for arg_name, arg in self.args.items():
            if name in arg.aliases:
                return arg_name
        return None

    def validate(self, args: Mapping[str, Any], where: Where) -> None:
        """Every check that can be made before anything runs; raises PlaybookError."""
        if not self.any_args:
            self._check_names(args, where)
            # Literal values are checked now; templated ones when rendered for each host.
            literal = {k: v for k, v in args.items() if k != TIMEOUT and not has_template(v)}
            try:
                normalise(self, literal)
            except ArgError as exc:
                raise where.error(exc.message, "fix the argument's value") from None
        for value in walk_strings(args):
            if templar.is_template(value):
                where.parse(templar.check_template, value, "", "fix the {{ }} expression")
        present = {self.canonical(name) for name in args}
        for rule in self.one_of:
            if not present & set(rule.names):
                raise where.error(f"{self.name} needs {' or '.join(rule.names)}", rule.hint)
        if self.check is not None:
            self.check(args, where)

    def _check_names(self, args: Mapping[str, Any], where: Where) -> None:
        for name in args:
            if self.canonical(name) is None and name != TIMEOUT:
                raise where.error(
                    unknown_arg_message(self, name),
                    f"see 'cpuaccel provision --list-modules' for {self.name}'s arguments",
                    arg=name,
                )
        present = {self.canonical(name) for name in args}
        for name, spec in self.args.items():
            if spec.required and name not in present:
                raise where.error(
                    f"{self.name} needs the argument {name!r}",
                    f"add '{name}: ...' under '{self.name}:'",
                )


_TRUE = {"true", "yes", "on", "1", "y"}
_FALSE = {"false", "no", "off", "0", "n", ""}


def coerce(kind: str, value: Any) -> Any:
    """A rendered argument value as its kind; raises ArgError saying what was expected."""
    if value is None or kind == "raw":
        return value
    if kind in ("str", "path"):
        if isinstance(value, dict | list):
            raise ArgError(f"expected a string, got {type(value).__name__}")
        return str(value)
    if kind == "bool":
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise ArgError(f"expected true or false, got {value!r}")
    if kind in ("int", "float"):
        try:
            return int(value) if kind == "int" else float(value)
        except (TypeError, ValueError):
            raise ArgError(f"expected a number, got {value!r}") from None
    if kind == "list":
        if isinstance(value, list | tuple):
            return [str(v) if not isinstance(v, dict | list) else v for v in value]
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return [str(value)]
    if kind == "dict":
        if not isinstance(value, dict):
            raise ArgError(f"expected a mapping, got {value!r}")
        return {str(k): str(v) for k, v in value.items()}
    if kind == "mode":
        # YAML 1.1 already read 0755 as an octal int; a quoted "0755" is octal text.
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        text = str(value).strip()
        try:
            return int(text, 8)
        except ValueError:
            raise ArgError(f"expected an octal mode like '0644', got {value!r}") from None
    raise AssertionError(f"unknown argument kind {kind}")


def normalise(module: Module, args: Mapping[str, Any]) -> dict[str, Any]:
    """Aliases resolved, types coerced, choices checked and defaults filled in."""
    if module.any_args:
        return dict(args)
    out: dict[str, Any] = {}
    for name, value in args.items():
        canonical = module.canonical(name)
        if canonical is None:
            raise ArgError(unknown_arg_message(module, name))
        spec = module.args[canonical]
        try:
            value = coerce(spec.kind, value)
        except ArgError as exc:
            raise ArgError(f"{module.name}: argument {name}: {exc.message}") from None
        if spec.choices and value is not None and value not in spec.choices:
            raise ArgError(
                f"{module.name}: argument {name} must be one of {', '.join(spec.choices)}, "
                f"not {value!r}"
            )
        out[canonical] = value
    for name, spec in module.args.items():
        if name not in out and spec.default is not None:
            out[name] = spec.default
    return out


def unknown_arg_message(module: Module, name: str) -> str:
    known = ", ".join(sorted(module.args))
    return f"{module.name}: unsupported argument {name!r} (known: {known})"


def has_template(value: Any) -> bool:
    return any(templar.is_template(s) for s in walk_strings(value))


def walk_strings(value: Any) -> list[str]:
    """Every string in a value of nested mappings and lists."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in walk_strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in walk_strings(v)]
    return []
