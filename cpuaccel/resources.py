"""Where the shipped templates and playbooks are: in the wheel, or at the repo's top."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from cpuaccel.errors import UsageError

if TYPE_CHECKING:
    import jinja2

_PACKAGE = Path(__file__).resolve().parent


def data_dir(name: str) -> Path:
    """``templates`` or ``playbooks``: inside the wheel, else the source checkout's."""
    for candidate in (_PACKAGE / "_data" / name, _PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"cpuaccel's {name}/ folder is missing from this installation")


def template_environment(custom: str | None, *, setting: str, hint: str) -> jinja2.Environment:
    """The shipped templates, under a user's folder of copies (``custom``) when given.

    ``setting`` names where ``custom`` came from for the error when it is no folder.
    Plain text out (no autoescape), an undefined name an error; callers add their
    filters (``quote``: the one quoting of every word a shell reads).
    """
    import jinja2  # only the verbs that render pay for it

    folders = [str(data_dir("templates"))]
    if custom:
        custom = os.path.expanduser(custom)
        if not os.path.isdir(custom):
            raise UsageError(f"{setting} is {custom}, which is not a folder", hint=hint)
        folders.insert(0, custom)
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(folders),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
