"""``run``'s job options that ``submit`` also takes and hands to the run inside the job:
one declaration each, so the two commands cannot drift apart (a type, a bound, a name).

The world-size ones (--master-port, --mixed-precision, --max-restarts) live with their
aliases in ``launch_aliases.OWN_OPTIONS``; ``--launcher`` and ``--env`` differ on
purpose between the two (inside a Slurm job, and no secret's value in a batch script),
so each command declares its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from cpuaccel.cli.options import Seconds

JOB_OPTIONS: dict[str, Callable[[Any], Any]] = {
    "job_timeout": click.option(
        "--timeout",
        "job_timeout",
        type=Seconds(0.1),
        metavar="SECONDS",
        help="End the job after this long.",
    ),
    "hang_timeout": click.option(
        "--hang-timeout",
        "hang_timeout",
        type=Seconds(1),
        metavar="SECONDS",
        help="End the job as hung (exit 124) when no rank made progress (a step, an output "
        "line) for this long; stacks go to runs/<id>/hang-R.txt where py-spy is.  "
        "[default: off]",
    ),
    "restart_delay": click.option(
        "--restart-delay",
        type=Seconds(0, 3600),
        metavar="SECONDS",
        help="Wait this long before a restart (--max-restarts).  [default: 3]",
    ),
    "as_module": click.option(
        "-m",
        "--module",
        "as_module",
        is_flag=True,
        help="SCRIPT is a module name, run as `python -m SCRIPT` from the project folder.",
    ),
    "no_python": click.option(
        "--no-python",
        is_flag=True,
        help="SCRIPT is a program (in the project, or on the nodes' PATH) run as each rank, "
        "with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR... set.",
    ),
    "launcher_args": click.option(
        "--launcher-args",
        metavar="'WORDS'",
        help="Extra mpirun options, split as a shell would, placed before the program.",
    ),
}


def job_options(func: Any) -> Any:
    """Declare every option of :data:`JOB_OPTIONS` on a command, in that order."""
    for declare in reversed(JOB_OPTIONS.values()):
        func = declare(func)
    return func
