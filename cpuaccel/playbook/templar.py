"""Jinja2 as Ansible uses it: ``{{ }}`` in argument strings, bare expressions in when.

Undefined variables are errors (StrictUndefined): a typo in a variable name must stop the
task with its name, not render an empty path. The tests and filters are the handful of
Ansible's that playbooks use most (``is changed``, ``| default``, ``| bool``, ``| quote``).
"""

from __future__ import annotations

import functools
import json
import posixpath
import re
from collections.abc import Mapping
from typing import Any

import jinja2
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from cpuaccel.connectors.commandline import quote
from cpuaccel.errors import CpuaccelError
from cpuaccel.inventory.variables import parse_bool


class TemplateError(CpuaccelError):
    """An expression or template failed to parse or render (undefined variable ...)."""


def _bool(value: Any) -> bool:
    """Ansible's ``| bool``, strict: a word that is no boolean spelling is an error, not
    False (``ture`` must not quietly turn something off)."""
    if value is None:
        return False
    parsed = parse_bool(value)
    if parsed is None:
        raise TemplateError(f"bool: {value!r} is not a boolean (true/false, yes/no, on/off, 1/0)")
    return parsed


def _truth(value: Any) -> bool:
    """A condition's result: strings as ``| bool`` reads them (``"false"`` is False, an
    unknown word an error), anything else as Jinja's truth (``2``, ``[1]`` are true)."""
    return _bool(value) if isinstance(value, str) else bool(value)


def _result_test(key: str) -> Any:
    def test(result: Any) -> bool:
        if not isinstance(result, Mapping):
            raise TemplateError(f"'is {key}' needs a registered result, got {result!r}")
        if key == "succeeded":
            return not result.get("failed", False)
        return bool(result.get(key, False))

    return test


def _regex_replace(value: Any, pattern: str, replacement: str = "") -> str:
    return re.sub(pattern, replacement, str(value))


def _mandatory(value: Any, msg: str | None = None) -> Any:
    if isinstance(value, jinja2.Undefined):
        raise TemplateError(msg or "a mandatory variable is not defined")
    return value


@functools.cache
def environment() -> jinja2.Environment:
    # Sandboxed: playbooks are data a user may have been handed; expressions must not
    # reach Python internals. Immutable: templates read variables, never change them.
    env = ImmutableSandboxedEnvironment(
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        bool=_bool,
        quote=quote,  # the same filter as run's job templates
        basename=lambda v: posixpath.basename(str(v)),
        dirname=lambda v: posixpath.dirname(str(v)),
        to_json=lambda v: json.dumps(v, sort_keys=True),
        regex_replace=_regex_replace,
        mandatory=_mandatory,
    )
    for key in ("changed", "failed", "skipped", "succeeded"):
        env.tests[key] = _result_test(key)
    env.tests["success"] = env.tests["succeeded"]
    return env


def _describe(exc: Exception) -> str:
    if isinstance(exc, jinja2.UndefinedError):
        return f"undefined variable: {exc.message}"
    if isinstance(exc, jinja2.TemplateSyntaxError):
        return f"syntax error: {exc.message}"
    return f"{type(exc).__name__}: {exc}"


def check_expression(expr: str) -> None:
    """Parse (not evaluate) a ``when``-style expression: for errors at load time."""
    try:
        tree = environment().parse("{{ " + expr + " }}")
        _refuse_unsupported(tree, expr)
        environment().compile_expression(expr)
        _refuse_private(tree, expr)
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(f"cannot parse {expr!r}: {exc.message}") from None


def check_template(text: str) -> None:
    try:
        tree = environment().parse(text)
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(f"cannot parse {text!r}: line {exc.lineno}: {exc.message}") from None
    _refuse_unsupported(tree, text)
    _refuse_private(tree, text)


# Ansible's functions for reading outside data: no counterpart in the sandbox.
_LOOKUPS = ("lookup", "query", "q")
_ANSIBLE = {
    "filter": "bool, quote, basename, dirname, to_json, regex_replace, mandatory",
    "test": "changed, failed, skipped, succeeded, success",
}


def _refuse_unsupported(tree: jinja2.nodes.Template, text: str) -> None:
    """A filter or test outside Jinja2's own and the few of Ansible's defined above, or a
    lookup, is refused when the playbook loads, not when a task renders it on a node
    (Jinja2 checks a filter's name only when it compiles the template)."""
    env = environment()
    for node in tree.find_all((jinja2.nodes.Filter, jinja2.nodes.Test, jinja2.nodes.Call)):
        if isinstance(node, jinja2.nodes.Filter) and node.name not in env.filters:
            kind, name = "filter", node.name
        elif isinstance(node, jinja2.nodes.Test) and node.name not in env.tests:
            kind, name = "test", node.name
        elif (
            isinstance(node, jinja2.nodes.Call)
            and isinstance(node.node, jinja2.nodes.Name)
            and node.node.name in _LOOKUPS
        ):
            raise TemplateError(
                f"{text!r}: {node.node.name}() is not supported by cpuaccel (no lookups); "
                "pass the value with -e NAME=VALUE or vars:"
            )
        else:
            continue
        raise TemplateError(
            f"{text!r}: the {kind} {name!r} is not supported by cpuaccel (it has "
            f"Jinja2's built-in {kind}s and Ansible's {_ANSIBLE[kind]})"
        )


def _refuse_private(tree: jinja2.nodes.Template, text: str) -> None:
    """An attribute starting with '_' (``x.__class__``, ``x['__globals__']``) is what every
    sandbox escape reaches for, and the sandbox refuses it when rendering: refused at load
    time too, so that the playbook stops before any task has run on any node."""
    for node in tree.find_all((jinja2.nodes.Getattr, jinja2.nodes.Getitem)):
        name = node.attr if isinstance(node, jinja2.nodes.Getattr) else None
        if isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Const):
            name = node.arg.value
        if isinstance(name, str) and name.startswith("_"):
            raise TemplateError(
                f"{text!r} reaches for the private attribute {name!r}: unsafe, refused by "
                "the sandbox"
            )


def is_template(value: Any) -> bool:
    return isinstance(value, str) and ("{{" in value or "{%" in value)


def evaluate(expr: str, variables: Mapping[str, Any]) -> Any:
    """The value of a bare expression (``when``, ``that``, ``changed_when``)."""
    try:
        compiled = environment().compile_expression(expr, undefined_to_none=False)
        value = compiled(**variables)
        if isinstance(value, jinja2.Undefined):
            value._fail_with_undefined_error()
        return value
    except TemplateError:
        raise
    except Exception as exc:
        raise TemplateError(f"in {expr!r}: {_describe(exc)}") from None


def condition(expr: str | bool, variables: Mapping[str, Any]) -> bool:
    if isinstance(expr, bool):
        return expr
    # Ansible accepts `when: "{{ x }}"` too, with a warning; we take the bare form.
    text = expr.strip()
    if text.startswith("{{") and text.endswith("}}"):
        text = text[2:-2]
    return _truth(evaluate(text, variables))


def to_text(value: Any) -> str:
    """A value as Ansible prints it: strings as they are, the rest as JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, default=str)


def render_text(text: str, variables: Mapping[str, Any]) -> str:
    try:
        return environment().from_string(text).render(**variables)
    except Exception as exc:
        raise TemplateError(_describe(exc)) from None


def render(value: Any, variables: Mapping[str, Any]) -> Any:
    """Render every string inside ``value``.

    A string that is a single ``{{ expr }}`` keeps the expression's type (a list stays a
    list), as Ansible does, so ``loop: "{{ packages }}"`` loops over the list.
    """
    if isinstance(value, str):
        if not is_template(value):
            return value
        stripped = value.strip()
        if (
            stripped.startswith("{{")
            and stripped.endswith("}}")
            and stripped.count("{{") == 1
            and "{%" not in stripped
        ):
            return evaluate(stripped[2:-2], variables)
        return render_text(value, variables)
    if isinstance(value, Mapping):
        return {k: render(v, variables) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [render(v, variables) for v in value]
    return value
