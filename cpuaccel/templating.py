"""Jinja2, sandboxed, for every template cpuaccel renders.

Playbook arguments and conditions (playbook/templar.py), sync's ``--dest``
(sync/location.py), and the job files of ``run`` and ``submit`` (templates/*.j2, or the
user's copies) all render here. Templates are data a user may have been handed, so
every environment is Jinja2's immutable sandbox: an expression cannot reach Python's
internals (``cycler.__init__.__globals__``) nor change a variable. Undefined names are
errors (StrictUndefined): a typo must stop with its name, not render an empty path.
``quote`` is the one shell quoting of every word a template writes for a shell.

The expression dialect is Ansible's: its most used filters (``| bool``, ``| default``,
``| quote``, ``| basename``...) and tests (``is changed``).
"""

from __future__ import annotations

import functools
import json
import os
import posixpath
import re
from collections.abc import Mapping
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from cpuaccel.connectors.commandline import quote
from cpuaccel.errors import CpuaccelError, UsageError
from cpuaccel.inventory.variables import parse_bool
from cpuaccel.resources import data_dir


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


def truth(value: Any) -> bool:
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


def describe(exc: Exception) -> str:
    if isinstance(exc, jinja2.UndefinedError):
        return f"undefined variable: {exc.message}"
    if isinstance(exc, jinja2.TemplateSyntaxError):
        return f"syntax error: {exc.message}"
    return f"{type(exc).__name__}: {exc}"


def render_text(text: str, variables: Mapping[str, Any]) -> str:
    try:
        return environment().from_string(text).render(**variables)
    except Exception as exc:
        raise TemplateError(describe(exc)) from None


def file_environment(custom: str | None, *, setting: str, hint: str) -> jinja2.Environment:
    """The shipped templates, under a user's folder of copies (``custom``) when given:
    sandboxed as every template, plain text out (no autoescape), ``quote`` registered.

    ``setting`` names where ``custom`` came from for the error when it is no folder.
    """
    folders = [str(data_dir("templates"))]
    if custom:
        custom = os.path.expanduser(custom)
        if not os.path.isdir(custom):
            raise UsageError(f"{setting} is {custom}, which is not a folder", hint=hint)
        folders.insert(0, custom)
    env = ImmutableSandboxedEnvironment(
        loader=jinja2.FileSystemLoader(folders),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["quote"] = quote
    return env
