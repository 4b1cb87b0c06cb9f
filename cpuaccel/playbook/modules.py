"""The modules a task may use, with their arguments: names and meanings are Ansible's.

Each module's spec carries its own rules (see ``argspec``): the loader calls
``Module.validate`` before anything runs (an unknown argument, a missing one, a bad
value is a playbook error with its line), and the strategy coerces rendered values to
the types the module code expects. A new module declares its rules here, not in the
loader. How each module runs is in ``actions.py``; what runs on the node is
``cpuaccel.node`` (its agent).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cpuaccel.playbook import templar
from cpuaccel.playbook.argspec import (
    Arg,
    ArgError,
    Module,
    OneOf,
    Where,
    coerce,
    normalise,
    unknown_arg_message,
)
from cpuaccel.resources import data_dir

# The spec's machinery lives in argspec; callers know it as the catalogue's.
__all__ = ["MODULES", "Arg", "ArgError", "Module", "coerce", "normalise", "unknown_arg_message"]

# Ansible's task keywords for a process: they become the module's arguments.
_PROCESS_KEYWORDS = ("environment", "timeout")


def _template_exists(args: Mapping[str, Any], where: Where) -> None:
    """A literal template source must exist now: a missing one fails no host later."""
    src = args["src"]
    if not templar.is_template(src) and find_source(str(src), where.directory, "templates") is None:
        raise where.error(
            f"template {src!r} not found",
            f"put it in {where.directory / 'templates'} or next to the playbook, "
            "or give an absolute path",
        )


def _that_parses(args: Mapping[str, Any], where: Where) -> None:
    that = args.get("that")
    for expr in that if isinstance(that, list) else [] if that is None else [that]:
        where.parse(
            templar.check_expression,
            str(expr),
            "that",
            "each 'that' item is a Jinja2 expression without {{ }}",
        )


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
            task_keywords=_PROCESS_KEYWORDS,
            summary="run a program (no shell); changed unless creates/removes say it is done",
        ),
        Module(
            "shell",
            {"cmd": Arg("str", required=True), "executable": Arg("path"), **_PROCESS},
            free_form="cmd",
            task_keywords=_PROCESS_KEYWORDS,
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
            one_of=(
                OneOf(("src", "content"), "add 'src: FILE' (on the controller) or 'content: TEXT'"),
            ),
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
            check=_template_exists,
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
            task_keywords=_PROCESS_KEYWORDS,
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
            check=_that_parses,
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
                # pip download's --extra-index-url: e.g. PyTorch's CPU-only wheel index
                "extra_index_url": Arg("list"),
                # packages pinned at the controller's installed version (result: pinned)
                "same_as_controller": Arg("list"),
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


def keyword_takers(keyword: str) -> str:
    """The modules that take a task keyword, for the message when another has it."""
    names = [m.name for m in MODULES.values() if keyword in m.task_keywords]
    return f"{', '.join(names[:-1])} and {names[-1]}" if len(names) > 1 else names[0]


# ---------------------------------------------------------------- where a task's src is looked for
# Where a task's ``src`` is looked for on the controller, in Ansible's order.
def search_path(name: str, playbook_dir: Path, kind: str) -> list[Path]:
    """Candidates for ``src: name``: ``kind`` is "templates" (template) or "files" (copy).

    Like Ansible: the playbook's own ``templates/`` or ``files/`` folder, then the
    playbook's folder; then the current directory; templates also fall back to
    cpuaccel's shipped ones, so the default playbook works from an installed wheel.
    """
    path = Path(name).expanduser()
    if path.is_absolute():
        return [path]
    candidates = [playbook_dir / kind / path, playbook_dir / path, Path.cwd() / path]
    if kind == "templates":
        candidates.append(data_dir("templates") / path)
    return candidates


def find_source(name: str, playbook_dir: Path, kind: str) -> Path | None:
    for candidate in search_path(name, playbook_dir, kind):
        if candidate.exists():
            return candidate
    return None
