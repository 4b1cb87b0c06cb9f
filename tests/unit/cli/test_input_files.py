"""Every file cpuaccel reads as input must be a regular file: ``-i /dev/zero``,
``-e @/dev/zero`` and ``-c /dev/zero`` would read forever, a FIFO would block in its open;
so must a file found by name (a project file, an inventory, a hostfile, ignore rules,
metrics) and a sync's source.

The cases run ``python -m cpuaccel`` as a child with a 20 s timeout and a bounded address
space, so that a regression fails (TimeoutExpired, or a MemoryError traceback from
reading /dev/zero) instead of hanging the suite or filling the machine's memory. The
reader itself: tests/unit/test_sourcefile.py."""

from __future__ import annotations

import os
import resource
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from cpuaccel.errors import EXIT_USAGE
from testsupport.command import cpuaccel_argv, inherited_env

TIMEOUT = 20.0
MEMORY = 2 * 1024**3  # far above what a refused input needs, far below the machine's


def _bounded() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


def run_cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    home = cwd / "home"
    home.mkdir(exist_ok=True)
    env = inherited_env(HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"))
    return subprocess.run(
        cpuaccel_argv(*args),
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=TIMEOUT,
        preexec_fn=_bounded,
    )


def special(kind: str, folder: Path, name: str) -> str:
    """A path in folder that is not a regular file: a FIFO, or a link to /dev/zero."""
    path = folder / name
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    return name


def assert_refused(done: subprocess.CompletedProcess[str], names: str, what: str) -> None:
    assert done.returncode == EXIT_USAGE, done.stderr
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr
    assert names in errors[0] and what in errors[0], errors[0]


KINDS = ["fifo", "zero"]
WHAT = {"fifo": "is a FIFO", "zero": "character device (/dev/zero)"}

# flag -> (argv with {f} for the special file's name, what the error calls it)
FLAGS: dict[str, tuple[tuple[str, ...], str]] = {
    "-i": (("check", "-i", "{f}"), "inventory file"),
    "-e": (("config", "show", "-e", "@{f}"), "-e @{f} file"),
    "-c": (("check", "-c", "{f}"), "config file"),
    "--playbook": (("provision", "--playbook", "{f}", "--list-tasks"), "playbook"),
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("flag", list(FLAGS))
def test_a_flag_naming_a_fifo_or_device_is_refused(tmp_path: Path, flag: str, kind: str) -> None:
    name = special(kind, tmp_path, "input.yaml")
    argv, what = FLAGS[flag]
    done = run_cli(tmp_path, *(word.replace("{f}", name) for word in argv))
    assert_refused(done, f"{name}: {what.replace('{f}', name)}", WHAT[kind])


ACCELERATE = (
    "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_CPU\n"
    "mpirun_config:\n  mpirun_hostfile: hostfile\nnum_machines: 1\nnum_processes: 1\n"
)


def _found_project(folder: Path, kind: str) -> tuple[tuple[str, ...], str]:
    return ("config", "show"), f"{special(kind, folder, 'cpuaccel.yaml')}: config file"


def _found_inventory(folder: Path, kind: str) -> tuple[tuple[str, ...], str]:
    return ("config", "show"), f"{special(kind, folder, 'inventory.yaml')}: inventory file"


def _hostfile(folder: Path, kind: str) -> tuple[tuple[str, ...], str]:
    (folder / "acc.yaml").write_text(ACCELERATE)
    return ("config", "show", "-c", "acc.yaml"), f"{special(kind, folder, 'hostfile')}: hostfile"


def _ignore_rules(folder: Path, kind: str) -> tuple[tuple[str, ...], str]:
    (folder / "src").mkdir()
    (folder / "src" / "a.py").write_text("print(1)\n")
    name = special(kind, folder / "src", ".gitignore")
    return ("sync", "--check", "src"), f"src/{name}: .gitignore file"


def _metrics(folder: Path, kind: str) -> tuple[tuple[str, ...], str]:
    (folder / "run").mkdir()
    return ("report", "run"), f"run/{special(kind, folder / 'run', 'metrics.jsonl')}: metrics file"


OTHERS: dict[str, Callable[[Path, str], tuple[tuple[str, ...], str]]] = {
    "./cpuaccel.yaml": _found_project,
    "./inventory.yaml": _found_inventory,
    "accelerate mpirun_hostfile": _hostfile,
    "sync .gitignore": _ignore_rules,
    "report metrics.jsonl": _metrics,
}


@pytest.mark.parametrize("where", list(OTHERS))
def test_a_file_found_by_name_that_is_a_fifo_is_refused(tmp_path: Path, where: str) -> None:
    argv, names = OTHERS[where](tmp_path, "fifo")
    done = run_cli(tmp_path, *argv)
    assert_refused(done, names, WHAT["fifo"])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("how", ["named", "--copy-links"])
def test_a_sync_source_that_is_a_fifo_or_device_is_refused(
    tmp_path: Path, kind: str, how: str
) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("print(1)\n")
    if how == "named":
        name = special(kind, tmp_path, "input")
        argv = ["sync", "--check", "--dest", str(tmp_path / "dst"), "src", name]
        names = f"{tmp_path / name} is "
    else:  # a link out of the tree, to a FIFO or /dev/zero
        (tmp_path / "src" / "input").symlink_to(tmp_path / special(kind, tmp_path, "input"))
        argv = ["sync", "--check", "--copy-links", "--dest", str(tmp_path / "dst"), "src"]
        names = f"{tmp_path / 'src' / 'input'} is "
    done = run_cli(tmp_path, *argv)
    what = "a FIFO" if kind == "fifo" else "a character device"
    assert_refused(done, names + what, "not a file or folder a sync can send")
