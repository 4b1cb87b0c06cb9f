"""Run ``python -m cpuaccel`` as a user does, for tests and benchmarks: always a child process
(:func:`cpuaccel` forks most of them from a server that has the CLI imported).

The one place that knows how the command line is started, so that every test exercises the
same entry point (``cpuaccel/__main__.py``) with one of two environments:

- :func:`inherited_env`: this session's environment (the venv, PATH) without
  ``CPUACCEL_INVENTORY``, so that a developer's default inventory never leaks into a test;
- :func:`clean_env`: what a user's login shell would pass and nothing of this session, for
  tests against the namespace cluster, where the controller must not rely on the venv's PATH.

Both set ``NO_COLOR=1`` so that assertions see plain text.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from testsupport import forkserver

CLEAN_PATH = "/usr/bin:/bin"


def cpuaccel_argv(*args: str, prelude: str | None = None) -> list[str]:
    """The argv of ``cpuaccel ARGS``; with `prelude`, that Python code runs first.

    A prelude (e.g. one that hides a module from the import system) needs ``python -c``;
    it names the program ``cpuaccel`` as the console script would.
    """
    if prelude is None:
        return [sys.executable, "-m", "cpuaccel", *args]
    code = f"{prelude}\nimport sys\nfrom cpuaccel.cli.main import main\n"
    code += "sys.argv[0] = 'cpuaccel'\nmain()\n"
    return [sys.executable, "-c", code, *args]


def inherited_env(**extra: str) -> dict[str, str]:
    """This process's environment without CPUACCEL_INVENTORY, plus NO_COLOR=1 and `extra`.

    Safe from a thread: pytest sets and removes PYTEST_CURRENT_TEST in the main thread
    meanwhile, and ``os.environ.items()`` raises KeyError for a key gone between its
    listing and its lookup. The keys are listed once, and a vanished one is left out.
    """
    base: dict[str, str] = {}
    for key in list(os.environ):
        value = os.environ.get(key)
        if value is not None and key != "CPUACCEL_INVENTORY":
            base[key] = value
    return {**base, "NO_COLOR": "1", **extra}


def clean_env(*, path: str = CLEAN_PATH, **extra: str) -> dict[str, str]:
    """A user's plain shell: NO_COLOR=1, PATH (system dirs by default), HOME, and `extra`;
    and this session's PYTHONPATH, if any, so that a checkout under test is what runs."""
    base = {"NO_COLOR": "1", "PATH": path, "HOME": str(Path.home())}
    if os.environ.get("PYTHONPATH"):
        base["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return {**base, **extra}


def cpuaccel(
    *args: str,
    cwd: Path | str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = 60.0,
    prelude: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """``cpuaccel ARGS`` to its end, output captured as text (env: :func:`inherited_env`).

    Forked from a server that has the CLI imported where that is the same as a fresh
    interpreter (:mod:`testsupport.forkserver`), else started afresh."""
    argv = cpuaccel_argv(*args, prelude=prelude)
    environ = dict(env) if env is not None else inherited_env()
    if prelude is None:
        done = forkserver.run("cpuaccel", args, cwd=cwd, env=environ, timeout=timeout)
        if done is not None:
            return done
    return subprocess.run(
        argv, capture_output=True, text=True, cwd=cwd, env=environ, timeout=timeout
    )


def start_cpuaccel(
    *args: str,
    cwd: Path | str | None = None,
    env: Mapping[str, str] | None = None,
    **popen: Any,
) -> subprocess.Popen[str]:
    """``cpuaccel ARGS`` in the background, in text mode; `popen` keywords pass through."""
    return subprocess.Popen(
        cpuaccel_argv(*args),
        cwd=cwd,
        env=dict(env) if env is not None else inherited_env(),
        text=True,
        **popen,
    )


def output_section(text: str, title: str) -> list[str]:
    """The lines of the ``## title`` section of a command's output (``run --dry-run``,
    ``config show``), up to the next ``## `` heading, without trailing blank lines."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"## {title}"))
    body: list[str] = []
    for line in lines[start + 1 :]:
        if line.startswith("## "):
            break
        body.append(line)
    while body and not body[-1].strip():
        body.pop()
    return body
