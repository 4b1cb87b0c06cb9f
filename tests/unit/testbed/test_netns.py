"""``python -m cpuaccel.testbed up`` on a machine without a tool the namespace cluster
needs says which, and the command that installs it (cpuaccel.testbed.netns)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cpuaccel.testbed.netns import SSHD
from testsupport.command import inherited_env

# In a mount namespace of its own: /usr/sbin as it is, but for sshd (a tmpfs over it,
# holding links to every other program there). The machine's own /usr/sbin is untouched.
WITHOUT_SSHD = """\
set -e
mount --make-rprivate /
mount --bind /usr/sbin "$1"
mount -t tmpfs none /usr/sbin
for f in "$1"/*; do [ "${f##*/}" = sshd ] || ln -s "$f" /usr/sbin/; done
[ ! -e /usr/sbin/sshd ] || exit 99
shift
exec "$@"
"""


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None or not Path(SSHD).exists(),
    reason="needs root, unshare and sshd to take sshd away in a mount namespace",
)
def test_up_without_sshd_names_the_command_that_installs_it(tmp_path: Path) -> None:
    view = tmp_path / "sbin"
    view.mkdir()
    up = [sys.executable, "-m", "cpuaccel.testbed", "up", "--nodes", "1", "--id", "255"]
    argv = ["unshare", "--mount", "sh", "-c", WITHOUT_SSHD, "sh", str(view), *up]
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=60, env=inherited_env(), check=False
    )
    assert proc.returncode == 1, proc.stderr
    text = " ".join(proc.stderr.split())
    assert f"missing tools for the namespace cluster: {SSHD}" in text
    assert "make system-deps" in text and "apt-get install openssh-server" in text
    assert "Traceback" not in text
