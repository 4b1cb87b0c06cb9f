"""Every file cpuaccel reads as input must be a regular file (issue 12: ``-i /dev/zero``,
``-e @/dev/zero`` and ``-c /dev/zero`` read forever, a FIFO blocked in its open).

The CLI cases run ``python -m cpuaccel`` as a child with a 20 s timeout and a bounded
address space, so that a regression fails (TimeoutExpired, or a MemoryError traceback
from reading /dev/zero) instead of hanging the suite or filling the machine's memory.
"""

from __future__ import annotations

import os
import resource
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cpuaccel.errors import EXIT_USAGE, InventoryError, SourceError
from cpuaccel.sourcefile import read_source
from cpuaccel.testing.command import cpuaccel_argv, inherited_env

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


@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        (lambda p: os.mkfifo(p), "is a FIFO (named pipe), not a regular file"),
        (lambda p: p.symlink_to("/dev/null"), "is a character device (/dev/null)"),
        (lambda p: p.mkdir(), "is a directory, not a file"),
        (lambda p: None, "inventory file not found"),
        (lambda p: p.symlink_to(p.parent / "gone"), "inventory file not found"),
    ],
)
def test_read_source_refuses_what_is_not_a_regular_file(
    tmp_path: Path, make: Callable[[Path], object], fragment: str
) -> None:
    path = tmp_path / "inv.yaml"
    make(path)
    with pytest.raises(InventoryError) as info:
        read_source(path, InventoryError, "inventory file", "pass a file")
    assert info.value.source == str(path)
    assert fragment in info.value.message
    assert info.value.hint == "pass a file"


def test_read_source_reads_text_and_names_the_line_of_bad_bytes(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_bytes("a: 1\nb: é\n".encode())
    assert read_source(path, SourceError, "inventory file", "x") == "a: 1\nb: é\n"
    path.write_bytes(b"a: 1\nb: \xe9\n")
    with pytest.raises(SourceError) as info:
        read_source(path, SourceError, "inventory file", "x")
    assert info.value.line == 2
    assert "cannot read the inventory file" in info.value.message


def test_read_source_stops_past_its_limit(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_bytes(b"#" * (3 * 1024 * 1024))
    with pytest.raises(SourceError, match="larger than 2 MiB"):
        read_source(path, SourceError, "inventory file", "x", limit=2 * 1024 * 1024)
    assert len(read_source(path, SourceError, "inventory file", "x", limit=None)) == 3 << 20


def test_read_source_names_an_unreadable_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text("a: 1\n")
    path.chmod(0)
    if os.geteuid() == 0:  # root reads any file (CI runs as root): the OS's answer instead
        real_open = os.open

        def denied(name: Any, *args: Any, **kwargs: Any) -> int:
            if str(name) == str(path):
                raise PermissionError(13, "Permission denied", str(name))
            return real_open(name, *args, **kwargs)

        monkeypatch.setattr(os, "open", denied)
    with pytest.raises(SourceError, match="cannot read the inventory file: Permission denied"):
        read_source(path, SourceError, "inventory file", "x")


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
