"""The one place where a remote command line is built.

Remote commands travel to sshd as a single string that the node's login shell parses, so
every word is quoted here with shlex.quote and nowhere else (the ``quote`` filter of the
Jinja templates is this module's ``quote`` too). Environment values are
passed as quoted words of ``env``, never interpolated into the line, which is where
Fabric's inline ``export`` goes wrong (fabric#2364).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def shell_line(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
) -> str:
    """Render argv (plus env and cwd) as one shell-safe command line.

    The result runs argv literally whatever its words contain: ``$(...)``, quotes,
    newlines and globs all arrive as written.
    """
    if not argv:
        raise ValueError("empty command")
    words = [quote(word) for word in argv]
    if env:
        for name in env:
            if not _ENV_NAME.match(name):
                raise ValueError(f"not a valid environment variable name: {name!r}")
        assignments = [quote(f"{k}={v}") for k, v in env.items()]
        words = ["env", *assignments, *words]
    line = " ".join(words)
    if cwd is not None:
        # `cd` goes first so a missing directory fails the command instead of running
        # it somewhere else; `~` is left for the shell when it leads the path.
        line = f"cd {quote_path(cwd)} && exec {line}"
    return line


def shown_line(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
) -> str:
    """The line ``shell_line`` sends, for -vv's eyes: environment values are hidden
    (``NAME=***``), as any of them may be a secret; argv itself never holds one
    (secrets travel on stdin or in 0600 files)."""
    hidden = {name: "***" for name in env} if env else None
    return shell_line(argv, env=hidden, cwd=cwd)


def quote_path(path: str) -> str:
    """Quote a path, keeping a leading ``~/`` for the remote shell to expand."""
    if path == "~":
        return "~"
    if path.startswith("~/"):
        return "~/" + shlex.quote(path[2:])
    return shlex.quote(path)


def quote(value: Any) -> str:
    """One word for sh, whatever it contains.

    Also the ``quote`` filter of every Jinja environment (Ansible's name for it): the
    playbook templar and run's job templates register this function, so a playbook and
    a job file quote alike.
    """
    return shlex.quote(str(value))
