"""The wheel users install: the package, its templates and playbooks, and the test bed a
user can try cpuaccel on; not this repository's test support. Built with hatchling as
`pip install .` would, offline, and imported from the unpacked wheel alone."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# What serves only this repository's tests and benches (testsupport/).
TEST_ONLY = {"command", "forkserver", "fake_run", "runs", "browser", "netfaults", "shaping"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(out)],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    (built,) = out.glob("cpuaccel-*.whl")
    return built


def test_the_wheel_holds_every_module_of_the_package_and_no_test_support(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {
        str(path.relative_to(REPO))
        for path in (REPO / "cpuaccel").rglob("*.py")
        if "__pycache__" not in path.parts
    }
    assert modules - names == set()
    assert [n for n in names if n.startswith(("testsupport/", "tests/"))] == []
    assert [n for n in names if Path(n).stem in TEST_ONLY] == []
    assert not any(n.endswith(".pyc") for n in names)
    assert "cpuaccel/testbed/cluster.py" in names
    assert any(n.startswith("cpuaccel/_data/templates/") for n in names)
    assert any(n.startswith("cpuaccel/_data/playbooks/") for n in names)


def test_the_test_bed_command_runs_from_the_wheel_alone(wheel: Path, tmp_path: Path) -> None:
    unpacked = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(unpacked)
    # -S: no .pth files, so neither this checkout (the editable install) nor anything but
    # the unpacked wheel and the venv's third-party packages is importable.
    probe = (
        "import sys; sys.path[:0] = sys.argv[1:]\n"
        "import cpuaccel, cpuaccel.testbed.__main__, cpuaccel.cli.main\n"
        "print(cpuaccel.__file__)\n"
        "try:\n"
        "    import testsupport\n"
        "except ImportError:\n"
        "    print('no testsupport')\n"
    )
    done = subprocess.run(
        [sys.executable, "-S", "-c", probe, str(unpacked), sysconfig.get_paths()["purelib"]],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()
    assert Path(first).is_relative_to(unpacked)
    assert second == "no testsupport"
