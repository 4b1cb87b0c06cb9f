"""The controller's packages for offline nodes: the self wheel and the wheelhouse.

Everything here is local: pip is pointed at wheels these tests write themselves, with the
machine's pip configuration switched off, so no test depends on (or contacts) an index.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import cpuaccel
from cpuaccel.errors import CpuaccelError
from cpuaccel.playbook import wheels
from cpuaccel.playbook.wheels import (
    WheelhouseError,
    build_self_wheel,
    fill_wheelhouse,
    self_wheel_version,
)

# Ignore /etc/pip.conf and friends: only what a test sets itself is in effect.
ISOLATED = {"PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def test_self_wheel_is_deterministic_and_named_by_its_content(tmp_path: Path) -> None:
    first = build_self_wheel(tmp_path / "a")
    second = build_self_wheel(tmp_path / "b")
    assert first.name == second.name
    assert first.read_bytes() == second.read_bytes()
    version = self_wheel_version()
    assert first.name == f"cpuaccel-{version}-py3-none-any.whl"
    assert "+src." in first.name

    # Same name means same content: an existing file is returned, not rewritten.
    before = first.stat().st_mtime_ns
    os.utime(first, ns=(before - 10**9, before - 10**9))
    assert build_self_wheel(tmp_path / "a") == first
    assert first.stat().st_mtime_ns == before - 10**9

    with zipfile.ZipFile(first) as archive:
        names = archive.namelist()
        info = f"cpuaccel-{version}.dist-info"
        assert names[-1] == f"{info}/RECORD"
        assert "cpuaccel/_data/templates/hostfile.j2" in names
        assert len(names) == len(set(names))
        assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
        assert {i.date_time for i in archive.infolist()} == {(1980, 1, 1, 0, 0, 0)}
        record = archive.read(f"{info}/RECORD").decode().splitlines()
        assert len(record) == len(names)
        assert f"{info}/RECORD,," in record
        metadata = archive.read(f"{info}/METADATA").decode()
        assert f"\nVersion: {version}\n" in metadata
        assert "cpuaccel.cli.main:main" in archive.read(f"{info}/entry_points.txt").decode()


def test_self_wheel_installs_with_pip_into_a_fresh_venv(tmp_path: Path) -> None:
    env = {**os.environ, **ISOLATED}
    wheel = build_self_wheel(tmp_path / "dist")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=env)
    python = venv / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)]
    subprocess.run(pip, check=True, env=env)

    probe = (
        "import cpuaccel, importlib.metadata as m, pathlib; "
        "print(m.version('cpuaccel')); print(pathlib.Path(cpuaccel.__file__).parent)"
    )
    out = subprocess.run(
        [str(python), "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    version, package = out.stdout.split()
    # The wheel's own version: the checkout may change while the test runs.
    assert version == wheel.name.split("-")[1]
    assert version.startswith(f"{cpuaccel.__version__}+src.")
    package_dir = Path(package)
    assert package_dir.is_relative_to(venv)  # the installed copy, not the checkout
    assert (package_dir / "_data" / "templates" / "hostfile.j2").is_file()
    assert (package_dir / "_data" / "playbooks").is_dir()

    script = venv / "bin" / "cpuaccel"
    assert "from cpuaccel.cli.main import main" in script.read_text()
    # --no-deps left click & co. out; borrow them from this venv (appended after the new
    # venv's own site-packages, so the installed cpuaccel still wins) to run the command.
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    import click

    Path(site, "_borrowed_deps.pth").write_text(str(Path(click.__file__).parent.parent) + "\n")
    ran = subprocess.run(
        [str(script), "--version"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == f"cpuaccel, version {cpuaccel.__version__}"


def _tiny_wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> None:
    info = f"{name}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {r}\n" for r in requires)
    files = {
        f"{name}.py": b"",
        f"{info}/METADATA": metadata.encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{n},,\n" for n in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as archive:
        for arcname, data in {**files, f"{info}/RECORD": record.encode()}.items():
            archive.writestr(arcname, data)


@pytest.fixture
def local_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """tinya 1.0 (needs tinyb), tinyb 1.0 and 2.0, found by pip only in a local folder."""
    links = tmp_path / "links"
    links.mkdir()
    _tiny_wheel(links, "tinya", "1.0", ("tinyb",))
    _tiny_wheel(links, "tinyb", "1.0")
    _tiny_wheel(links, "tinyb", "2.0")
    for key, value in {**ISOLATED, "PIP_FIND_LINKS": str(links), "PIP_NO_INDEX": "1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("PIP_CONSTRAINT", raising=False)
    return links


def _no_pip(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("pip ran although nothing changed")

    monkeypatch.setattr(subprocess, "Popen", refuse)  # the module wheels uses


def test_wheelhouse_downloads_once_then_reuses_its_stamp(
    tmp_path: Path, local_index: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dest = tmp_path / "wheelhouse"
    lines: list[str] = []
    first = fill_wheelhouse(dest, ["tinya"], constraints=None, progress=lines.append)
    assert first.changed and first.path == dest
    assert first.files == ("tinya-1.0-py3-none-any.whl", "tinyb-2.0-py3-none-any.whl")
    assert all((dest / name).is_file() for name in first.files)
    assert any("Saved" in line or "tinya" in line for line in lines)
    stamp = json.loads((dest / wheels.STAMP_NAME).read_text())
    assert stamp["requirements"] == ["tinya"]
    assert stamp["constraints_sha256"] is None
    assert stamp["files"] == list(first.files)

    with monkeypatch.context() as patch:
        _no_pip(patch)
        again = fill_wheelhouse(dest, ["tinya"], constraints=None)
    assert not again.changed and again.files == first.files

    # A constraint (and later another constraint) is a new request: pip runs again.
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("tinyb==1.0\n")
    pinned = fill_wheelhouse(dest, ["tinya"], constraints=constraints)
    assert pinned.changed and "tinyb-1.0-py3-none-any.whl" in pinned.files
    with monkeypatch.context() as patch:
        _no_pip(patch)
        assert not fill_wheelhouse(dest, ["tinya"], constraints=constraints).changed
    constraints.write_text("tinyb==2.0\n")
    assert fill_wheelhouse(dest, ["tinya"], constraints=constraints).changed

    # Another requirement list re-runs; so does a wheel that went missing.
    assert fill_wheelhouse(dest, ["tinya", "tinyb"], constraints=constraints).changed
    (dest / "tinya-1.0-py3-none-any.whl").unlink()
    refilled = fill_wheelhouse(dest, ["tinya", "tinyb"], constraints=constraints)
    assert refilled.changed and "tinya-1.0-py3-none-any.whl" in refilled.files


def test_wheelhouse_names_a_missing_package(tmp_path: Path, local_index: Path) -> None:
    with pytest.raises(WheelhouseError) as caught:
        fill_wheelhouse(tmp_path / "wheelhouse", ["tinya", "nosuchpkg"], constraints=None)
    error = caught.value
    assert isinstance(error, CpuaccelError)
    assert (
        error.message == "pip download failed: ERROR: No matching distribution found for nosuchpkg"
    )
    assert error.hint is not None and "--find-links" in error.hint
    assert "\n" not in error.message
    assert not (tmp_path / "wheelhouse" / wheels.STAMP_NAME).exists()


def test_same_as_controller_pins_what_the_controller_has_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.metadata

    from cpuaccel.playbook import actions, wheels

    asked: list[list[str]] = []

    def fill(dest: Path, requirements: list[str], **_: object) -> wheels.WheelhouseResult:
        asked.append(list(requirements))
        return wheels.WheelhouseResult(dest, True, (), 0.0)

    monkeypatch.setattr(wheels, "fill_wheelhouse", fill)
    args = {
        "dest": str(tmp_path / "wh"),
        "requirements": ["mpi4py"],
        "include_self": False,
        "same_as_controller": ["cloudpickle", "no-such-package-here"],
    }
    result = actions._wheelhouse(None, args, {})  # type: ignore[arg-type]
    version = importlib.metadata.version("cloudpickle")
    # The nodes get the controller's own version; a package it lacks is not asked for.
    assert result["pinned"] == [f"cloudpickle=={version}"]
    assert asked == [["mpi4py", f"cloudpickle=={version}"]]
