"""The interpreters the node programs are tried on: this one, and the oldest a node may
have (Python 3.8) where the machine holds one."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess


def old_python() -> str | None:
    """A working Python 3.8 on this machine (on PATH or in pyenv), or None."""
    candidates = [shutil.which("python3.8")]
    candidates += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.8*/bin/python3.8")))
    for candidate in candidates:
        if (
            candidate
            and subprocess.run([candidate, "-c", "pass"], capture_output=True).returncode == 0
        ):
            return candidate
    return None
