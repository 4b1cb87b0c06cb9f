"""What each rank runs when it is not a Python script: ``-m MODULE`` or ``--no-python``.

As ``python -m``, ``torchrun -m`` and ``accelerate launch -m``: a module name, run from
the synced project folder as ``__main__``. As ``torchrun --no-python``: a program run
as each rank, with the rank's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
...) derived by the worker first. Both are checked here, on the controller, so that a
mistake is one line before any node is contacted.
"""

from __future__ import annotations

import os
from pathlib import Path

from cpuaccel.errors import UsageError
from cpuaccel.jobs.plan import EXECUTABLE, MODULE, Script


def module_script(name: str, args: tuple[str, ...], project: Path) -> Script:
    """``-m pkg.train``: dotted identifiers only (it reaches the nodes as one word, and
    anything else could not be imported)."""
    parts = name.split(".")
    if not all(part.isidentifier() for part in parts):
        raise UsageError(
            f"-m {name}: not a module name",
            hint="give a dotted module name, e.g. -m pkg.train (as python -m takes it); "
            "a script file is run without -m",
        )
    return Script(name, args, project.name, MODULE)


def program_script(program: str, args: tuple[str, ...], project: Path) -> Script:
    """``--no-python PROGRAM``: a path (relative to the project, or absolute on the nodes)
    or a bare command name. A bare name of a file in the project is that file (run as
    ./NAME, as torchrun runs it from its folder); any other bare name is looked up on
    the node's PATH."""
    if "/" not in program and not (project / program).is_file():
        if not program or program.startswith("-"):
            raise UsageError(
                f"--no-python {program!r}: not a program",
                hint="give the program to run, e.g. --no-python ./train.sh",
            )
        return Script(program, args, project.name, EXECUTABLE)  # on the node's PATH
    if program.startswith("/") and not Path(program).resolve().is_relative_to(project):
        return Script(program, args, project.name, EXECUTABLE)  # the node's own program
    path = (project / program).resolve()
    if not path.is_file():
        raise UsageError(
            f"--no-python {program}: no such file in the project folder {project}",
            hint="give a path relative to the project folder, or a command on the nodes' PATH",
        )
    if not path.is_relative_to(project):
        raise UsageError(
            f"--no-python {program} is outside the project folder {project}",
            hint="run cpuaccel from the folder that holds it (it is what gets synced)",
        )
    if not os.access(path, os.X_OK):
        raise UsageError(
            f"--no-python {program} is not executable",
            hint=f"chmod +x {program} (the nodes run it as it is synced)",
        )
    return Script(f"./{path.relative_to(project).as_posix()}", args, project.name, EXECUTABLE)
