"""A run id given from outside: ``CPUACCEL_RUN_ID`` in the environment of ``cpuaccel run``.

``cpuaccel submit`` prints a run id and returns; its batch script later runs
``CPUACCEL_RUN_ID=<id> cpuaccel run ...`` so that the run keeps that id (its folder,
``ps``, ``logs``, ``stop``). The id must have the form of a generated one.

The controller must not carry ``CPUACCEL_RUN_ID=<id>`` itself: that exact entry in a
process's environment is what the sweep ends (node/jobctl.py), and the sweep of a node
that sees this process (the batch host; every node of a test bed sharing one process
table) would end the controller. So ``main()`` hands the id over first: it starts
the same entry point afresh, the id under another name (:data:`HANDED`), which leaves
``/proc/<pid>/environ`` without the marker (renaming it in ``os.environ`` alone would not).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from cpuaccel.errors import UsageError

ENV_VAR = "CPUACCEL_RUN_ID"
HANDED = "CPUACCEL_GIVEN_RUN_ID"  # the id after the hand-over, unseen by the sweep
FORM = re.compile(r"\d{8}-\d{6}-[0-9a-f]{6}")  # as plan.new_run_id makes them
STATUS = "status.json"  # a folder with one has held a run: the id is taken


def check_form(value: str, origin: str = f"${ENV_VAR}") -> str:
    """``value`` when it has the form of a generated run id; UsageError (64) otherwise."""
    if FORM.fullmatch(value) is None:
        raise UsageError(
            f"{origin} is {value[:80]!r}, which is not a run id",
            hint="give the form cpuaccel makes, e.g. 20260130-211500-a1b2c3, or unset it",
        )
    return value


def hand_over(argv: Sequence[str]) -> None:
    """Before ``cpuaccel run`` starts: a valid CPUACCEL_RUN_ID is passed on as
    :data:`HANDED` to a fresh start of ``cpuaccel`` (this process is replaced); a bad
    one is a UsageError. Other verbs, and runs without it, return at once."""
    value = os.environ.get(ENV_VAR)
    if value is None or list(argv[1:2]) != ["run"]:
        return
    check_form(value)
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    env[HANDED] = value
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-c", _RESTART, *argv], env)


# The entry point again, as the console script runs it: the current folder (the user's
# project, whose modules may shadow a library) is taken off sys.path, and argv[0] kept
# for click's usage lines.
_RESTART = (
    "import sys; del sys.path[0]; sys.argv = sys.argv[1:]; "
    "from cpuaccel.cli.main import main; main()"
)


def given(runs: Path) -> str | None:
    """The run id given from outside (after :func:`hand_over`, or CPUACCEL_RUN_ID
    itself when ``run`` was called in-process), checked; None when none was given.

    Its folder below ``runs`` may exist (``cpuaccel submit`` wrote the batch script
    there), but must not have held a run (a ``status.json``) nor be a link. The
    variables are taken out of this process's environment, so that nothing it starts
    (a nested ``cpuaccel run`` in a rank) inherits the id."""
    handed = os.environ.pop(HANDED, None)
    direct = os.environ.pop(ENV_VAR, None)
    value = handed if handed is not None else direct
    if value is None:
        return None
    run_id = check_form(value)
    folder = runs / run_id
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise UsageError(
            f"${ENV_VAR} is {run_id}, and {folder} is not a folder",
            hint="remove it, or give another run id",
        )
    if (folder / STATUS).exists():
        raise UsageError(
            f"${ENV_VAR} is {run_id}, a run that has already started ({folder / STATUS})",
            hint="give a new run id (or unset CPUACCEL_RUN_ID for a generated one)",
        )
    return run_id
