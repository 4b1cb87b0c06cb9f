"""Jinja2 as Ansible uses it: ``{{ }}`` in argument strings, bare expressions in when.

Undefined variables are errors (StrictUndefined): a typo in a variable name must stop the
task with its name, not render an empty path. The tests and filters are the handful of
Ansible's that playbooks use most (``is changed``, ``| default``, ``| bool``, ``| quote``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import jinja2
import jinja2.nodes

from cpuaccel.templating import (
    RenderLimit,
    TemplateError,
    describe,
    environment,
    evaluate_bounded,
    render_text,
    truth,
)


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
        value = evaluate_bounded(compiled, variables)
        if isinstance(value, jinja2.Undefined):
            value._fail_with_undefined_error()
        return value
    except TemplateError:
        raise
    except RenderLimit as exc:
        raise TemplateError(f"in {expr!r}: {exc}", hint=exc.hint) from None
    except Exception as exc:
        raise TemplateError(f"in {expr!r}: {describe(exc)}") from None


def condition(expr: str | bool, variables: Mapping[str, Any]) -> bool:
    if isinstance(expr, bool):
        return expr
    # Ansible accepts `when: "{{ x }}"` too, with a warning; we take the bare form.
    text = expr.strip()
    if text.startswith("{{") and text.endswith("}}"):
        text = text[2:-2]
    return truth(evaluate(text, variables))


def to_text(value: Any) -> str:
    """A value as Ansible prints it: strings as they are, the rest as JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, default=str)


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
