"""SCRIPT: is it a Python script, and where is it in the project?"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from cpuaccel.errors import UsageError
from cpuaccel.jobs import plan as entry
from cpuaccel.jobs.plan import Script

# Is SCRIPT a Python script?
#
# `cpuaccel run inventory.yaml train.py` (the inventory named as `provision` takes it)
# used to launch the YAML file as the script on every rank. A SCRIPT that is a config or
# inventory file, or not Python at all, is refused with the spelling that was meant,
# unless the ranks are told to run it as an executable (``no_python``).
PYTHON_SUFFIXES = (".py", ".pyw", ".pyz")
# Files users keep beside their code that are never run: what each one usually is.
CONFIG_SUFFIXES = {
    ".yaml": "YAML",
    ".yml": "YAML",
    ".ini": "INI",
    ".cfg": "INI",
    ".toml": "TOML",
    ".json": "JSON",
}
_HEAD_BYTES = 256


def check_script_kind(script: str, *, no_python: bool = False, api: bool = False) -> None:
    """Refuse a SCRIPT that is not a Python file; with ``no_python`` (the ranks run it as
    an executable) anything goes. A missing file is left to the caller's own error."""
    if no_python:
        return
    path = Path(script)
    kind = CONFIG_SUFFIXES.get(path.suffix.lower())
    if kind is not None:
        hint = (
            f"an inventory goes in inventory={script!r}, a cpuaccel.yaml or Accelerate "
            f"config in config={script!r}"
            if api
            else f"an inventory goes with -i (cpuaccel run -i {script} train.py), a "
            f"cpuaccel.yaml or Accelerate config with --config {script}"
        )
        raise UsageError(f"{script}: SCRIPT is a {kind} file, not a Python script", hint=hint)
    if path.suffix.lower() in PYTHON_SUFFIXES:
        return
    first = _first_line(path)
    if first is None or (first.startswith(b"#!") and b"python" in first):
        return
    raise UsageError(
        f"{script}: SCRIPT is not a Python file (no .py suffix, no python #! line)",
        hint=f"to run it as every rank's program: cpuaccel run --no-python {script}; "
        "else name the Python script (train.py)",
    )


def _first_line(path: Path) -> bytes | None:
    """The file's first bytes up to a newline; None when it is not a regular file (the
    caller says "no such script"). Read without blocking: a FIFO is never opened."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except (OSError, ValueError):
        return None
    try:
        head = os.read(fd, _HEAD_BYTES) if stat.S_ISREG(os.fstat(fd).st_mode) else None
    except OSError:
        return None
    finally:
        os.close(fd)
    return None if head is None else head.split(b"\n", 1)[0]


def _script_in_project(script: str, project: Path) -> str:
    path = Path(script).resolve()
    if not path.is_file():
        raise UsageError(f"{script}: no such script", hint="check the path to your training script")
    try:
        return path.relative_to(project).as_posix()
    except ValueError:
        raise UsageError(
            f"{script} is outside the project folder {project}",
            hint="run cpuaccel from the folder that holds your script (it is what gets synced)",
        ) from None


def script_entry(
    script: str, args: tuple[str, ...], project: Path, as_module: bool, no_python: bool
) -> Script:
    if as_module and no_python:
        raise UsageError(
            "-m and --no-python together",
            hint="-m runs a Python module, --no-python a program: keep the one you mean",
        )
    if as_module:
        what = entry.module_script(script, args, project)
    elif no_python:
        what = entry.program_script(script, args, project)
    else:
        what = Script(_script_in_project(script, project), args, project.name)
    entry.compile_here(what, project, script)
    return what
