"""ansible-core for the benches that compare with Ansible, in a venv of its own.

It is installed into bench/.venv-ansible on first use (from the package index, the
benches' only network use), apart from cpuaccel's venv so neither pins the other.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ANSIBLE_VENV = Path(__file__).resolve().parent / ".venv-ansible"


def ensure_ansible(program: str = "ansible") -> Path:
    """The path of ``program`` (ansible, ansible-playbook) in the bench's venv."""
    path = ANSIBLE_VENV / "bin" / program
    if not path.exists():
        subprocess.run([sys.executable, "-m", "venv", str(ANSIBLE_VENV)], check=True)
        subprocess.run(
            [str(ANSIBLE_VENV / "bin" / "pip"), "install", "--quiet", "ansible-core"], check=True
        )
    return path
