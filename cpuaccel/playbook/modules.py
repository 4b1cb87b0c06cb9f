"""The modules a task may use, with their arguments: names and meanings are Ansible's.

This is the declared catalogue that the loader validates against before anything runs
(an unknown module or argument is a playbook error with its line), and that coerces
rendered values to the types the module code expects. How each module runs is in
``actions.py``; what runs on the node is ``cpuaccel.node`` (its agent).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cpuaccel.errors import CpuaccelError


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

    def canonical(self, name: str) -> str | None:
        """The argument's own name for ``name`` or one of its aliases; None if unknown."""
        if name in self.args:
            return name
        for arg_name, arg in self.args.items():
            if name in arg.aliases:
                return arg_name
        return None


_PROCESS = {
    "creates": Arg("path"),
    "removes": Arg("path"),
    "chdir": Arg("path"),
    "environment": Arg("dict"),
    "stdin": Arg("str"),
}

MODULES: dict[str, Module] = {
    m.name: m
    for m in (
        Module(
            "command",
            {"cmd": Arg("str"), "argv": Arg("list"), **_PROCESS},
            free_form="cmd",
            summary="run a program (no shell); changed unless creates/removes say it is done",
        ),
        Module(
            "shell",
            {"cmd": Arg("str", required=True), "executable": Arg("path"), **_PROCESS},
            free_form="cmd",
            summary="run a command line through /bin/sh",
        ),
        Module(
            "file",
            {
                "path": Arg("path", required=True, aliases=("dest", "name")),
                "state": Arg("str", choices=("file", "directory", "absent", "touch")),
                "mode": Arg("mode"),
                "modification_time": Arg("str"),
                "access_time": Arg("str"),
            },
            summary="a directory, an empty file, or nothing at a path, with its mode",
        ),
        Module(
            "copy",
            {
                "src": Arg("path"),
                "content": Arg("raw"),
                "dest": Arg("path", required=True),
                "mode": Arg("mode"),
                "force": Arg("bool", default=True),
            },
            summary="a file from the controller (or content) at dest; skipped when the "
            "checksums match",
        ),
        Module(
            "template",
            {
                "src": Arg("path", required=True),
                "dest": Arg("path", required=True),
                "mode": Arg("mode"),
                "force": Arg("bool", default=True),
            },
            summary="a Jinja2 template rendered per host on the controller, then as copy",
        ),
        Module(
            "pip",
            {
                "name": Arg("list"),
                "version": Arg("str"),
                "requirements": Arg("path"),
                "state": Arg("str", choices=("present", "latest", "absent", "forcereinstall")),
                "virtualenv": Arg("path"),
                "virtualenv_command": Arg("str"),
                "virtualenv_site_packages": Arg("bool"),
                "executable": Arg("path"),
                "extra_args": Arg("str"),
                "index_url": Arg("str"),
                "extra_index_url": Arg("list"),
                "find_links": Arg("list"),
                "no_index": Arg("bool"),
                "environment": Arg("dict"),
            },
            summary="Python packages; installed versions are compared first, ok when "
            "nothing would change",
        ),
        Module(
            "stat",
            {"path": Arg("path", required=True), "get_checksum": Arg("bool", default=True)},
            summary="facts about a path, for register and when",
        ),
        Module(
            "setvars",
            {
                "paths": Arg("list"),
                "search": Arg("bool", default=True),
                "required": Arg("bool", default=False),
                "record": Arg("path"),
                "python": Arg("path"),
            },
            summary="find oneAPI's setvars.sh / Intel MPI's vars.sh, check that it sources, "
            "record it for run",
        ),
        Module(
            "synchronize",
            {
                "src": Arg("path", required=True),
                "dest": Arg("path", required=True),
                "delete": Arg("bool", default=False),
                "rsync_opts": Arg("list"),
            },
            summary="a folder of the controller pushed with rsync (e.g. a wheelhouse)",
        ),
        Module(
            "assert",
            {
                "that": Arg("list", required=True),
                "fail_msg": Arg("str", aliases=("msg",)),
                "success_msg": Arg("str"),
                "quiet": Arg("bool"),
            },
            on_controller=True,
            summary="fail the host unless every expression is true",
        ),
        Module(
            "fail",
            {"msg": Arg("str", default="Failed as requested from task")},
            on_controller=True,
            summary="fail the host with a message",
        ),
        Module(
            "debug",
            {"msg": Arg("raw"), "var": Arg("str")},
            on_controller=True,
            summary="print a message or a variable",
        ),
        Module(
            "set_fact",
            {},
            any_args=True,
            on_controller=True,
            summary="set variables for the rest of the play on this host",
        ),
        Module(
            "wheelhouse",
            {
                "dest": Arg("path", required=True),
                "requirements": Arg("list"),
                "constraints": Arg("path"),
                "include_self": Arg("bool", default=True),
            },
            on_controller=True,
            summary="fill a folder on the controller with wheels for offline nodes (pip "
            "download), plus a wheel of this cpuaccel; use with run_once",
        ),
        Module(
            "alike",
            {"python": Arg("path"), "packages": Arg("list")},
            summary="re-gather facts and fail every host whose Python, torch, MPI or "
            "cpuaccel differs from the others (cpuaccel check's drift rules)",
        ),
    )
}

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
