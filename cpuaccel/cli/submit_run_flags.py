"""``cpuaccel run``'s options that ``submit`` takes and hands to the run inside the job.

Each is checked here, when the job is queued, with the same types ``run`` uses: a typo
found only when Slurm starts the job (hours later, perhaps) would cost the user the wait.
The values are written as single argv words into the batch script (every word quoted by
the template), so nothing the user typed is read by a shell twice.

A secret's value never enters the batch script (it is a run record, and sbatch's files
are readable by Slurm's admins): ``--env NAME`` passes it by name instead, and the job
reads it from the environment sbatch hands it (sbatch's default ``--export=ALL``).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from typing import Any, TypeVar

import click

from cpuaccel.cli.launch_aliases import OWN_OPTIONS
from cpuaccel.cli.options import SECRET_NAME, parse_env
from cpuaccel.cli.run_options import JOB_OPTIONS
from cpuaccel.errors import UsageError

F = TypeVar("F", bound=Callable[..., Any])

# click's parameter name -> run's flag. Flags without a value are booleans.
FORWARDED: dict[str, str] = {
    "mixed_precision": "--mixed-precision",
    "max_restarts": "--max-restarts",
    "master_port": "--master-port",
    "launcher": "--launcher",
    "job_timeout": "--timeout",
    "hang_timeout": "--hang-timeout",
    "restart_delay": "--restart-delay",
    "launcher_args": "--launcher-args",
    "as_module": "--module",
    "no_python": "--no-python",
}
SWITCHES = ("as_module", "no_python")


def run_flag_options(func: F) -> F:
    """Declare the forwarded options on ``submit``: run's own declarations
    (launch_aliases.OWN_OPTIONS, run_options.JOB_OPTIONS), and submit's --launcher
    (inside the job: auto is srun) and --env (a secret only by NAME)."""
    declarations = [
        OWN_OPTIONS["mixed_precision"],
        OWN_OPTIONS["max_restarts"],
        OWN_OPTIONS["master_port"],
        click.option(
            "--launcher",
            type=click.Choice(["auto", "impi", "slurm"]),
            help="As run (inside the job: auto is srun).",
        ),
        *JOB_OPTIONS.values(),
        click.option(
            "--env",
            "env_items",
            multiple=True,
            metavar="KEY=VALUE|NAME",
            help="As run; a secret (TOKEN, KEY, SECRET, PASSWORD) only by NAME.",
        ),
    ]
    for declare in reversed(declarations):
        func = declare(func)
    return func


def pop_run_words(kwargs: dict[str, Any]) -> list[str]:
    """Pop the forwarded options from click's keyword arguments; return them as the
    inner run's argv words (``--flag=value``, one word each), checked."""
    words: list[str] = []
    for name, flag in FORWARDED.items():
        value = kwargs.pop(name, None)
        if name in SWITCHES:
            words += [flag] if value else []
        elif value is not None:
            words.append(f"{flag}={_checked(flag, value)}")
    for item in kwargs.pop("env_items", ()) or ():
        words.append(f"--env={_env_item(item)}")
    return words


def _checked(flag: str, value: Any) -> str:
    if flag == "--launcher-args":
        try:
            shlex.split(str(value))
        except ValueError as exc:
            raise UsageError(
                f"--launcher-args {value!r}: {exc}",
                hint="quote it as one shell word, e.g. --launcher-args '-genv X 1'",
            ) from None
    return str(value).lower() if flag == "--mixed-precision" else str(value)


def _env_item(item: str) -> str:
    key, sep, _ = item.partition("=")
    parse_env((item,))  # the name's form, and NAME set here: run's own rules
    if sep and SECRET_NAME.search(key):
        raise UsageError(
            f"--env {key}=...: a secret's value would be written into the batch script",
            hint=f"export {key} here and pass --env {key}: the job reads it from the "
            "environment sbatch hands it",
        )
    return item
