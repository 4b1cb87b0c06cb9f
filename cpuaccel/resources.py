"""Where the shipped templates and playbooks are: in the wheel, or at the repo's top."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def data_dir(name: str) -> Path:
    """``templates`` or ``playbooks``: inside the wheel, else the source checkout's."""
    for candidate in (_PACKAGE / "_data" / name, _PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"cpuaccel's {name}/ folder is missing from this installation")
