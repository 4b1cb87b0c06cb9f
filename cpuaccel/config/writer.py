"""Write the files ``cpuaccel config`` produces: an Ansible-format inventory and the
project file. Never over an existing file unless told (``--force``, or a yes typed)."""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from cpuaccel.config.project import KEYS, PROJECT_FILE
from cpuaccel.errors import UsageError
from cpuaccel.yamlsource import safe_load

INVENTORY_FILE = "inventory.yaml"


def _plain(value: Any) -> str:
    """A value as YAML reads it back: plain when that round-trips, JSON (valid YAML) else."""
    if isinstance(value, str):
        text = value
        try:
            if safe_load(text) == value and "#" not in text and text.strip() == text:
                return text
        except yaml.YAMLError:
            pass
    return json.dumps(value)


def inventory_text(
    hosts: Sequence[str],
    host_vars: Mapping[str, Mapping[str, Any]],
    group_vars: Mapping[str, Any],
    note: str,
) -> str:
    lines = [
        f"# Written by `cpuaccel config` on {time.strftime('%Y-%m-%d')}: {note}",
        "# Ansible's YAML inventory format; the first host is the main node (rank 0, mpirun).",
        "all:",
    ]
    if group_vars:
        lines.append("  vars:")
        lines += [f"    {key}: {_plain(value)}" for key, value in group_vars.items()]
    lines.append("  hosts:")
    for name in hosts:
        own = host_vars.get(name) or {}
        if own:
            inner = ", ".join(f"{k}: {_plain(v)}" for k, v in own.items())
            lines.append(f"    {_plain(name)}: {{{inner}}}")
        else:
            lines.append(f"    {_plain(name)}:")
    return "\n".join(lines) + "\n"


def project_text(values: Mapping[str, Any], note: str) -> str:
    lines = [
        f"# cpuaccel project file, written by `cpuaccel config` on {time.strftime('%Y-%m-%d')}"
        f"{': ' + note if note else ''}.",
        "# `cpuaccel run` and `cpuaccel sync` read it from this folder; flags override it.",
        "# `cpuaccel config show` prints every setting and where it came from.",
    ]
    for key, value in values.items():
        if value is None:
            continue
        lines.append(f"{key}: {_plain(value)}  # {KEYS[key]}")
    return "\n".join(lines) + "\n"


def write_files(
    files: Mapping[Path, str],
    *,
    force: bool,
    confirm: Callable[[Path], bool] | None,
) -> list[Path]:
    """Write each file atomically. An existing file is replaced only with ``force`` or
    when ``confirm`` (asked on a terminal) says yes; without either, nothing is written."""
    existing = [path for path in files if path.exists()]
    if existing and not force:
        if confirm is None:
            names = ", ".join(str(p) for p in existing)
            raise UsageError(
                f"{names} already exist(s); nothing was written",
                hint="pass --force to overwrite, or --dir DIR to write elsewhere",
            )
        for path in existing:
            if not confirm(path):
                raise UsageError(
                    f"{path} kept as it is; nothing was written",
                    hint="pass --force to overwrite, or --dir DIR to write elsewhere",
                )
    written = []
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
            os.replace(tmp, path)  # a killed write never leaves half a file
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        written.append(path)
    return written


def default_paths(folder: Path) -> tuple[Path, Path]:
    return folder / INVENTORY_FILE, folder / PROJECT_FILE
