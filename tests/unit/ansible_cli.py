"""Ansible's own command line, for the tests that compare a selection with Ansible's."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ANSIBLE = Path(sys.executable).parent / "ansible"
ANSIBLE_PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"


def ansible_env(home: Path) -> dict[str, str]:
    """Ansible's defaults, whatever this machine's configuration, and nothing written
    outside ``home``."""
    keep = ("PATH", "LANG", "LC_ALL", "PYTHONPATH", "TMPDIR")
    config = home / "ansible.cfg"
    config.write_text("[defaults]\n")
    return {
        **{k: os.environ[k] for k in keep if k in os.environ},
        "HOME": str(home),
        "ANSIBLE_HOME": str(home / ".ansible"),
        "ANSIBLE_LOCAL_TEMP": str(home / "tmp"),
        "ANSIBLE_CONFIG": str(config),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_INVENTORY_ENABLED": "yaml,ini",
        "PYTHONWARNINGS": "ignore",
    }
