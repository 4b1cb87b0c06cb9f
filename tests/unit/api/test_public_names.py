"""The public names: ``cpuaccel.launch``, ``runs`` and ``sync`` are the functions
whatever was imported before them, ``import cpuaccel`` stays light, and a user's code
calling the API type-checks under mypy --strict (py.typed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import cpuaccel

FUNCTIONS = ("launch", "runs", "check", "sync", "provision")


@pytest.mark.parametrize(
    "first",
    [
        "cpuaccel.jobs.launch",
        "cpuaccel.history.records",
        "cpuaccel.projectsync.engine",
        "cpuaccel.cli.main",
        "cpuaccel.notebook",
    ],
)
def test_the_api_functions_are_functions_whatever_was_imported_first(first: str) -> None:
    code = (
        f"import {first}\nimport cpuaccel, inspect\n"
        f"print(all(inspect.isfunction(getattr(cpuaccel, n)) for n in {FUNCTIONS!r}))\n"
        "import cpuaccel.jobs.launch, cpuaccel.projectsync.engine, cpuaccel.history.records\n"
        f"print(all(inspect.isfunction(getattr(cpuaccel, n)) for n in {FUNCTIONS!r}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["True", "True"], done.stderr


def test_import_cpuaccel_loads_neither_torch_nor_the_controller() -> None:
    heavy = ("torch", "cpuaccel.", "click", "rich")
    code = f"import sys, cpuaccel; print(sorted(m for m in sys.modules if m.startswith({heavy})))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "[]", done.stdout


def test_errors_is_reachable_from_the_package_alone() -> None:
    code = "import cpuaccel; print(cpuaccel.errors.UsageError.exit_code)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "64", done.stderr


USER_CODE = """\
import cpuaccel
from cpuaccel.errors import CpuaccelError

def main() -> int:
    try:
        run = cpuaccel.launch("train.py", "--epochs", "3", inventory="inventory.yaml",
                              nodes=4, ppn=4, detach=True, max_restarts=2)
    except CpuaccelError as exc:
        print(exc.message, exc.hint)
        return exc.exit_code
    state: str = run.status()["state"]
    for line in run.logs(follow=True, rank=0):
        text: str = line.text
    result = run.wait(timeout=3600)
    code: int | None = result.exit_code
    ranks: dict[int, int | None] = result.ranks
    run.stop()
    run.fetch(checkpoints=True)
    ids = [row["id"] for row in cpuaccel.runs()]
    return 0 if result.ok else 1
"""


def test_a_users_code_type_checks_strictly(tmp_path: Path) -> None:
    (tmp_path / "user.py").write_text(USER_CODE)
    package = Path(cpuaccel.__file__).parent
    assert (package / "py.typed").is_file()
    # Incremental, with a cache of its own beside `make lint`'s (whose options differ): a
    # rerun checks again only what changed, cpuaccel's modules and torch's included.
    cache = Path(__file__).parents[3] / ".mypy_cache" / "user-code"
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(cache), "user.py"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "MYPYPATH": str(package.parent), "HOME": str(tmp_path)},
    )
    assert done.returncode == 0, done.stdout
