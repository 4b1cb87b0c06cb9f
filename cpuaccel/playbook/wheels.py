"""Controller-side packages for offline nodes: a wheel of this cpuaccel, and a wheelhouse.

Cluster nodes have no index, so the controller provides every wheel. The cpuaccel wheel
is built from the code that is running here, with the standard library alone (no build
tool, no network), so an editable checkout ships exactly what it would run.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import importlib.metadata
import io
import json
import os
import re
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cpuaccel
from cpuaccel.errors import CpuaccelError
from cpuaccel.jsonsource import loads
from cpuaccel.resources import data_dir

# A fixed timestamp and mode bits make the same source give a byte-identical wheel.
_EPOCH = (1980, 1, 1, 0, 0, 0)
_DATA_FOLDERS = ("templates", "playbooks")
STAMP_NAME = ".cpuaccel-wheelhouse.json"
LOG_NAME = ".cpuaccel-wheelhouse.log"
_PIP_HINT = (
    "the controller needs the package index or a local --find-links "
    "(pip.conf, PIP_INDEX_URL or PIP_FIND_LINKS); pip's full output: {log}"
)


class WheelhouseError(CpuaccelError):
    """pip could not put the requested wheels into the wheelhouse."""


@dataclass(frozen=True)
class WheelhouseResult:
    path: Path
    changed: bool
    files: tuple[str, ...]
    seconds: float


def _payload() -> dict[str, bytes]:
    """Archive name -> bytes of every file the wheel installs (dist-info aside)."""
    package = Path(cpuaccel.__file__).resolve().parent
    files: dict[str, Path] = {}
    for path in package.rglob("*"):
        rel = path.relative_to(package)
        if "__pycache__" in rel.parts or path.suffix == ".pyc" or not path.is_file():
            continue
        files[f"cpuaccel/{rel.as_posix()}"] = path
    # A wheel install already has cpuaccel/_data; a source checkout keeps the folders at
    # the top of the repo, which resources.data_dir finds.
    if not (package / "_data").is_dir():
        for name in _DATA_FOLDERS:
            root = data_dir(name)
            for path in root.rglob("*"):
                if path.is_file() and "__pycache__" not in path.relative_to(root).parts:
                    files[f"cpuaccel/_data/{name}/{path.relative_to(root).as_posix()}"] = path
    return {arcname: files[arcname].read_bytes() for arcname in sorted(files)}


def _version(payload: dict[str, bytes]) -> str:
    digest = hashlib.sha256()
    for arcname, data in payload.items():  # already sorted by name
        digest.update(f"{arcname}\0{hashlib.sha256(data).hexdigest()}\n".encode())
    # The running code's version, without any local label it had (an earlier self
    # wheel's): the label names this exact code, so pip's "already satisfied" is exact.
    base = cpuaccel.__version__.split("+", 1)[0]
    return f"{base}+src.{digest.hexdigest()[:12]}"


def self_wheel_version() -> str:
    """The version build_self_wheel gives the running cpuaccel (hashes its files)."""
    return _version(_payload())


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return f"sha256={digest.decode()}"


def _dist_info(version: str) -> dict[str, bytes]:
    try:
        dist = importlib.metadata.distribution("cpuaccel")
    except importlib.metadata.PackageNotFoundError as exc:
        raise CpuaccelError(
            "cpuaccel is imported but not installed, so its metadata is unknown",
            hint="install it, e.g. `pip install -e .` in the checkout",
        ) from exc
    metadata = dist.read_text("METADATA") or ""
    # count=1: the header's Version comes before the description, which may quote one.
    metadata, found = re.subn(r"^Version:.*$", f"Version: {version}", metadata, count=1, flags=re.M)
    if not found:
        raise CpuaccelError("cpuaccel's installed METADATA has no Version field")
    wheel = "Wheel-Version: 1.0\nGenerator: cpuaccel\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    entry_points = dist.read_text("entry_points.txt")
    if entry_points is None:  # keep the `cpuaccel` command even if it was lost here
        entry_points = "[console_scripts]\ncpuaccel = cpuaccel.cli.main:main\n"
    return {
        "METADATA": metadata.encode(),
        "WHEEL": wheel.encode(),
        "entry_points.txt": entry_points.encode(),
    }


def build_self_wheel(out_dir: Path) -> Path:
    """Write a wheel of the running cpuaccel into out_dir; same code, same bytes, same name."""
    payload = _payload()
    version = _version(payload)
    # Normalised versions never contain '-'; '+' is allowed in wheel file names.
    target = Path(out_dir) / f"cpuaccel-{version.replace('-', '_')}-py3-none-any.whl"
    if target.is_file():  # the name carries the content hash
        return target
    info = f"cpuaccel-{version}.dist-info"
    entries = dict(payload)
    entries.update({f"{info}/{name}": data for name, data in _dist_info(version).items()})
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for arcname, data in entries.items():
        writer.writerow([arcname, _record_hash(data), len(data)])
    writer.writerow([f"{info}/RECORD", "", ""])
    entries[f"{info}/RECORD"] = record.getvalue().encode()

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as archive:
            # Payload sorted, then dist-info with RECORD last, as the wheel spec advises.
            for arcname, data in entries.items():
                item = zipfile.ZipInfo(arcname, date_time=_EPOCH)
                item.compress_type = zipfile.ZIP_DEFLATED
                item.create_system = 3  # Unix, so that the mode bits below are honoured
                item.external_attr = 0o100644 << 16  # not the checkout's: same on every machine
                archive.writestr(item, data)
        os.replace(tmp, target)  # a killed build never leaves a truncated wheel
    finally:
        tmp.unlink(missing_ok=True)
    return target


def _sha256(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as exc:
        raise WheelhouseError(f"cannot read the constraints file {path}: {exc.strerror}") from exc


def _wheels(dest: Path) -> tuple[str, ...]:
    return tuple(sorted(p.name for p in dest.glob("*.whl") if p.is_file()))


def fill_wheelhouse(
    dest: Path,
    requirements: Sequence[str],
    *,
    constraints: Path | None,
    python: str = sys.executable,
    progress: Callable[[str], None] | None = None,
    extra_index_urls: Sequence[str] = (),
) -> WheelhouseResult:
    """Make dest hold wheels for requirements and all their dependencies (pip download).

    The controller's own pip configuration decides the index; ``extra_index_urls`` are
    added to it (PyTorch's CPU-only wheels: PyPI's torch for Linux is the CUDA build).
    A stamp file records the
    last successful request, so an unchanged one returns at once without running pip.
    """
    started = time.monotonic()
    dest = Path(dest)
    stamp_path = dest / STAMP_NAME
    request = {
        "requirements": sorted(requirements),
        "constraints_sha256": _sha256(constraints) if constraints is not None else None,
        # pip picks wheels for this interpreter's tags: another one may need others.
        "python": python,
        "extra_index_urls": list(extra_index_urls),
    }
    files = _stamped(dest, stamp_path, request)
    if files is not None:
        return WheelhouseResult(dest, False, files, time.monotonic() - started)

    dest.mkdir(parents=True, exist_ok=True)
    _pip_download(python, dest, requirements, constraints, progress, extra_index_urls)

    files = _wheels(dest)
    tmp = stamp_path.with_name(f"{STAMP_NAME}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({**request, "files": list(files)}, indent=1) + "\n")
    os.replace(tmp, stamp_path)  # a torn stamp would only cost a re-run, but is avoidable
    return WheelhouseResult(dest, True, files, time.monotonic() - started)


def _stamped(dest: Path, stamp_path: Path, request: dict[str, Any]) -> tuple[str, ...] | None:
    """The wheels of the last successful request, when it was this one and they are all
    still there; None when pip must run."""
    try:
        stamp = loads(stamp_path.read_text())
    except (OSError, ValueError):
        stamp = None
    if (
        isinstance(stamp, dict)
        and {key: stamp.get(key) for key in request} == request
        and isinstance(stamp.get("files"), list)
        and all((dest / name).is_file() for name in stamp["files"])
    ):
        return tuple(stamp["files"])
    return None


def _pip_download(
    python: str,
    dest: Path,
    requirements: Sequence[str],
    constraints: Path | None,
    progress: Callable[[str], None] | None,
    extra_index_urls: Sequence[str] = (),
) -> None:
    """Run ``pip download`` into dest, its output to the log file there (and progress)."""
    command = [python, "-m", "pip", "download", "--dest", str(dest), "--only-binary=:all:"]
    # No version check (it would contact the index) and no prompt (it would hang).
    command += ["--disable-pip-version-check", "--no-input", "--progress-bar", "off"]
    if constraints is not None:
        command += ["-c", str(constraints)]
    for url in extra_index_urls:
        command += ["--extra-index-url", url]
    command += ["--", *requirements]  # a requirement is never read as an option
    output: list[str] = []
    try:
        with subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
        ) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                output.append(line.rstrip("\n"))
                if progress is not None:
                    progress(output[-1])
        returncode = proc.returncode
    except OSError as exc:
        raise WheelhouseError(f"cannot run {python}: {exc.strerror}") from exc
    log = dest / LOG_NAME
    log.write_text("".join(f"{line}\n" for line in output))
    if returncode != 0:
        # pip's own summary is its last ERROR: line; a crash has only a traceback's end.
        lines = [ln for ln in output if ln.startswith("ERROR:")] or [
            ln for ln in output if ln.strip()
        ]
        reason = lines[-1].strip() if lines else f"exit code {returncode}"
        raise WheelhouseError(f"pip download failed: {reason}", hint=_PIP_HINT.format(log=log))
