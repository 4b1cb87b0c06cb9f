"""First contact: `make demo` on a fresh Debian without python3-venv installs it as `make
test` installs its packages (tools/system-deps.sh), and the torch index is a setting of
the Makefile (TORCH_INDEX_URL) and of provision (cpuaccel_torch_index_url)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from cpuaccel.playbook import templar
from cpuaccel.playbook.loader import load
from cpuaccel.playbook.strategy import default_playbook
from cpuaccel.playbook.wheels import STAMP_NAME, WheelhouseError, fill_wheelhouse

REPO = Path(__file__).resolve().parents[2]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="no make")


def stub(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


@pytest.fixture
def fresh_debian(tmp_path: Path) -> dict[str, Path]:
    """A python3 without ensurepip (until apt-get installs python3-venv), apt-get and id
    stand-ins on PATH that record what they were asked."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    marker, log = tmp_path / "python3-venv-installed", tmp_path / "apt.log"
    stub(
        bin_dir,
        "python3",
        f'case "$*" in *ensurepip*) [ -e {marker} ] || exit 1;; esac\nexec {sys.executable} "$@"\n',
    )
    stub(
        bin_dir,
        "apt-get",
        f'echo "$*" >> {log}\ncase "$*" in *"install"*python3-venv*) touch {marker};; esac\n',
    )
    return {"bin": bin_dir, "marker": marker, "log": log}


def system_deps(fresh: dict[str, Path], uid: int) -> subprocess.CompletedProcess[str]:
    stub(fresh["bin"], "id", f"echo {uid}\n")
    env = {**os.environ, "PATH": f"{fresh['bin']}:{os.environ['PATH']}", "PYTHON": "python3"}
    return subprocess.run(
        ["bash", str(REPO / "tools" / "system-deps.sh"), "--venv"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_venv_prerequisite_is_installed_as_root(fresh_debian: dict[str, Path]) -> None:
    done = system_deps(fresh_debian, uid=0)
    assert done.returncode == 0, done.stderr
    calls = fresh_debian["log"].read_text().splitlines()
    assert calls[0] == "update -qq"
    assert calls[1] == "install -y -qq --no-install-recommends python3-venv"
    assert fresh_debian["marker"].exists()


def test_venv_prerequisite_is_named_in_one_line_without_root(
    fresh_debian: dict[str, Path],
) -> None:
    done = system_deps(fresh_debian, uid=1000)
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "apt-get install python3-venv" in lines[0], done.stderr
    assert not fresh_debian["log"].exists()  # nothing was attempted


def test_a_python_that_can_make_venvs_needs_nothing(fresh_debian: dict[str, Path]) -> None:
    fresh_debian["marker"].touch()
    done = system_deps(fresh_debian, uid=0)
    assert done.returncode == 0 and not fresh_debian["log"].exists()


def make_dry_run(*args: str) -> list[str]:
    """`make -n ARGS` in a copy of the Makefile's folder state: the commands it would run."""
    done = subprocess.run(
        ["make", "-n", "-C", str(REPO), "VENV=/nonexistent/venv", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


@needs_make
def test_make_demo_installs_the_venv_prerequisite_first() -> None:
    lines = make_dry_run("demo")
    first = next(i for i, line in enumerate(lines) if "system-deps.sh --venv" in line)
    venv = next(i for i, line in enumerate(lines) if " -m venv " in line)
    assert first < venv
    demo = next(line for line in lines if "cpuaccel run" in line)
    assert "--precision" not in demo and "--mixed-precision" not in demo  # auto, the default


@needs_make
def test_make_torch_index_url_reaches_pip_and_the_wheelhouse() -> None:
    plain = [line for line in make_dry_run("demo") if "pip install" in line and "-e" in line]
    assert len(plain) == 1 and "--extra-index-url" not in plain[0]
    lines = make_dry_run("demo", "wheelhouse", f"TORCH_INDEX_URL={CPU_INDEX}")
    install = next(line for line in lines if "pip install" in line and "-e '.[dev]'" in line)
    assert f"--extra-index-url {CPU_INDEX}" in install
    wheelhouse = next(line for line in lines if "provision --tags wheelhouse" in line)
    assert wheelhouse.endswith(f"-e cpuaccel_torch_index_url={CPU_INDEX}")


def task_args(name: str) -> dict[str, object]:
    play = load(default_playbook()).plays[0]
    return next(t.args for t in play.tasks if t.name == name)


@pytest.mark.parametrize(
    ("variables", "wheelhouse", "nodes"),
    [
        ({}, [], []),
        ({"cpuaccel_torch_index_url": CPU_INDEX}, [CPU_INDEX], [CPU_INDEX]),
        (
            {"cpuaccel_torch_index_url": CPU_INDEX, "cpuaccel_ipex_index_url": "https://i/"},
            [CPU_INDEX],
            ["https://i/", CPU_INDEX],
        ),
    ],
)
def test_provision_default_playbook_uses_the_torch_index_when_set(
    variables: dict[str, str], wheelhouse: list[str], nodes: list[str]
) -> None:
    filled = task_args("Fill the wheelhouse on the controller")["extra_index_url"]
    assert templar.render(filled, variables) == wheelhouse
    pip = task_args("Install the stack and cpuaccel")["extra_index_url"]
    assert templar.render(pip, variables) == nodes


def _wheel(folder: Path, name: str) -> None:
    """A wheel in a simple index's project folder, with the page pip reads there."""
    info = f"{name}-1.0.dist-info"
    wheel = f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(folder / wheel, "w") as archive:
        archive.writestr(f"{name}/__init__.py", "")
        archive.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        archive.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nTag: py3-none-any\n")
        archive.writestr(f"{info}/RECORD", "")
    (folder / "index.html").write_text(f'<a href="{wheel}">{wheel}</a>\n')


def test_wheelhouse_downloads_from_the_extra_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A package only the extra index has (as torch's CPU build is only on PyTorch's)."""
    main, extra = tmp_path / "main", tmp_path / "extra"
    (main / "simple").mkdir(parents=True)
    (extra / "simple" / "tinytorch").mkdir(parents=True)
    _wheel(extra / "simple" / "tinytorch", "tinytorch")
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", (main / "simple").as_uri())
    for name in ("PIP_FIND_LINKS", "PIP_NO_INDEX", "PIP_EXTRA_INDEX_URL", "PIP_CONSTRAINT"):
        monkeypatch.delenv(name, raising=False)
    dest = tmp_path / "wheelhouse"
    extra_url = (extra / "simple").as_uri()
    filled = fill_wheelhouse(dest, ["tinytorch"], constraints=None, extra_index_urls=[extra_url])
    assert filled.files == ("tinytorch-1.0-py3-none-any.whl",)
    assert STAMP_NAME in os.listdir(dest)
    # Without the extra index the same request is another one, and finds nothing.
    with pytest.raises(WheelhouseError, match="tinytorch"):
        fill_wheelhouse(tmp_path / "other", ["tinytorch"], constraints=None)
