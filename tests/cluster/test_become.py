"""``become`` on the real namespace cluster: a non-root SSH user whose sudo needs a password.

The nodes share the machine's /etc/passwd and /etc/sudoers.d (one filesystem), so the
fixture creates one uniquely named user for all of them, with a sudoers drop-in that asks
for the password every time (timestamp_timeout=0: a cached sudo would hide a wrong one),
and removes user, home and drop-in afterwards, also when a test fails. Every node's sshd
takes the cluster's key for any user (its AuthorizedKeysFile; no AllowUsers).
"""

from __future__ import annotations

import json
import os
import pty
import secrets
import select
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cpuaccel.errors import EXIT_NODE_FAILED, EXIT_OK
from cpuaccel.testbed.cluster import Cluster
from testsupport.command import cpuaccel, cpuaccel_argv, inherited_env

pytestmark = pytest.mark.cluster

PLAYBOOK = """\
- name: root's file, as a user who may only sudo
  hosts: all
  become: true
  tasks:
    - name: as the SSH user
      command: id -un
      become: false
      register: plain
    - name: a file only root may write
      copy:
        content: "made by become\\n"
        dest: "{{ dest }}/{{ inventory_hostname }}.txt"
        mode: "0644"
    - name: as root
      command: id -un
      register: rooted
    - name: the password never shows, even printed
      debug: {msg: "{{ ansible_become_password | default('none') }}"}
"""


@dataclass(frozen=True)
class Sudoer:
    name: str
    password: str
    base: Path  # everything the tests write: home, inventory, dest, secrets

    @property
    def dest(self) -> Path:
        return self.base / "dest"

    @property
    def inventory(self) -> Path:
        return self.base / "inventory.yaml"

    @property
    def playbook(self) -> Path:
        return self.base / "site.yaml"

    def secrets_file(self, password: str) -> Path:
        path = self.base / f"secrets-{secrets.token_hex(4)}.yaml"
        path.write_text(f"ansible_become_password: {password}\n")
        path.chmod(0o600)
        return path


def _remove(name: str) -> None:
    subprocess.run(["userdel", "-f", name], capture_output=True, check=False)
    Path(f"/etc/sudoers.d/{name}").unlink(missing_ok=True)


def _run(argv: list[str], stdin: str | None = None) -> None:
    subprocess.run(argv, input=stdin, text=True, capture_output=True, check=True, timeout=30)


@pytest.fixture(scope="module")
def sudoer(cluster: Cluster) -> Iterator[Sudoer]:
    if shutil.which("sudo") is None or shutil.which("useradd") is None:
        pytest.fail("sudo and useradd are needed (tools/system-deps.sh installs sudo)")
    name = f"cpuaccel-b{cluster.cluster_id}"
    _remove(name)  # a leftover of a run that was killed
    base = Path(tempfile.mkdtemp(prefix=f"{name}-"))  # in /tmp: the user can reach it
    password = f"pw-{secrets.token_hex(12)}"
    try:
        base.chmod(0o755)
        home = base / "home"
        _run(["useradd", "-M", "-d", str(home), "-s", "/bin/sh", name])
        (home / ".ssh").mkdir(parents=True)
        shutil.copy(f"{cluster.key_path}.pub", home / ".ssh" / "authorized_keys")
        shutil.chown(home, name)
        _run(["chpasswd"], stdin=f"{name}:{password}\n")
        drop_in = Path(f"/etc/sudoers.d/{name}")
        drop_in.write_text(f"Defaults:{name} timestamp_timeout=0\n{name} ALL=(ALL:ALL) ALL\n")
        drop_in.chmod(0o440)
        _run(["visudo", "-cf", str(drop_in)])
        made = Sudoer(name, password, base)
        made.dest.mkdir(mode=0o755)  # root's: the user cannot write here without become
        made.playbook.write_text(PLAYBOOK)
        cluster.write_inventory(
            made.inventory,
            ansible_user=name,
            ansible_python_interpreter="/usr/bin/python3",  # the tests' venv is root's
            cpuaccel_workdir=str(base / "work"),
            dest=str(made.dest),
        )
        yield made
    finally:
        _remove(name)
        shutil.rmtree(base, ignore_errors=True)


class ArgvSampler:
    """Every process's argv (what ps shows: /proc/PID/cmdline), sampled while it runs."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            for entry in os.scandir("/proc"):
                if entry.name.isdigit():
                    try:
                        raw = Path(entry.path, "cmdline").read_bytes()
                    except OSError:
                        continue
                    self.seen.add(raw.replace(b"\0", b" ").decode(errors="replace"))
            time.sleep(0.01)

    def __enter__(self) -> ArgvSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _files_holding(text: str, roots: list[Path], skip: set[Path]) -> list[Path]:
    found = []
    for root in roots:
        for path in root.rglob("*"):
            regular = path.is_file() and not path.is_symlink() and path not in skip
            if regular and text.encode() in path.read_bytes():
                found.append(path)
    return found


def test_become_with_the_password_from_extra_vars(cluster: Cluster, sudoer: Sudoer) -> None:
    """The SSH user writes a root-owned file on every node; the password is nowhere."""
    secret_file = sudoer.secrets_file(sudoer.password)
    argv = ["provision", "-i", str(sudoer.inventory), "--playbook", str(sudoer.playbook)]
    with ArgvSampler() as sampler:
        done = cpuaccel(*argv, "-e", f"@{secret_file}", "--json", timeout=120)
    assert done.returncode == EXIT_OK, done.stdout + done.stderr
    for node in cluster.names:
        made = sudoer.dest / f"{node}.txt"
        assert made.read_text() == "made by become\n"
        assert made.stat().st_uid == 0
    tasks = json.loads(done.stdout)["plays"][0]["tasks"]
    by_name = {t["task"]: t["hosts"] for t in tasks}
    assert {r["stdout"] for r in by_name["as the SSH user"].values()} == {sudoer.name}
    assert {r["stdout"] for r in by_name["as root"].values()} == {"root"}
    printed = by_name["the password never shows, even printed"].values()
    assert {r["msg"] for r in printed} == {"********"}
    # The sampler saw sudo run (it would be blind otherwise), and no argv held the password.
    assert any("sudo -H -S -p" in argv for argv in sampler.seen)
    assert not [a for a in sampler.seen if sudoer.password in a]
    assert sudoer.password not in done.stdout + done.stderr
    roots = [sudoer.base, cluster.state_dir]
    assert _files_holding(sudoer.password, roots, skip={secret_file}) == []
    # No agent is left running as root (or as the user) once the playbook is over.
    assert [(node, cluster.wait_idle(node)) for node in cluster.names] == [
        (node, []) for node in cluster.names
    ]


def test_become_with_ask_become_pass_on_a_terminal(cluster: Cluster, sudoer: Sudoer) -> None:
    """-K asks once on the terminal, echoes nothing, and the task runs as root."""
    node = cluster.names[0]
    argv = cpuaccel_argv(
        "provision", "-i", str(sudoer.inventory), "--playbook", str(sudoer.playbook),
        "--limit", node, "-K",
    )  # fmt: skip
    (sudoer.dest / f"{node}.txt").unlink(missing_ok=True)
    master, terminal = pty.openpty()
    # A session of its own: no controlling terminal, so getpass asks on stdin (the pty).
    proc = subprocess.Popen(
        argv, stdin=terminal, stdout=subprocess.PIPE, stderr=terminal,
        env=inherited_env(), start_new_session=True,
    )  # fmt: skip
    os.close(terminal)
    seen = b""
    try:
        seen = _read_until(master, b"BECOME password", 30)
        os.write(master, sudoer.password.encode() + b"\n")
        out, _ = proc.communicate(timeout=120)
        seen += _drain(master)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    assert seen.count(b"BECOME password") == 1  # asked once
    assert proc.returncode == EXIT_OK, out.decode() + seen.decode(errors="replace")
    assert sudoer.password.encode() not in seen + out  # not echoed, not printed
    assert (sudoer.dest / f"{node}.txt").stat().st_uid == 0


def _read_until(fd: int, marker: bytes, timeout: float) -> bytes:
    got = b""
    deadline = time.monotonic() + timeout
    while marker not in got:
        if time.monotonic() > deadline:
            raise AssertionError(f"no {marker!r} on the terminal; got {got!r}")
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            got += os.read(fd, 4096)
    return got


def _drain(fd: int) -> bytes:
    got = b""
    while select.select([fd], [], [], 0.2)[0]:
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # the other end is closed
            break
        if not chunk:
            break
        got += chunk
    return got


def test_a_wrong_password_is_one_clear_error_per_host(cluster: Cluster, sudoer: Sudoer) -> None:
    wrong = f"wrong-{secrets.token_hex(8)}"
    argv = ["provision", "-i", str(sudoer.inventory), "--playbook", str(sudoer.playbook)]
    started = time.monotonic()
    done = cpuaccel(*argv, "-e", f"@{sudoer.secrets_file(wrong)}", timeout=90)
    assert time.monotonic() - started < 60  # sudo's retries are not waited for
    assert done.returncode == EXIT_NODE_FAILED, done.stdout + done.stderr
    for node in cluster.names:
        lines = [line for line in done.stdout.splitlines() if f"failed: {node}:" in line]
        assert len(lines) == 1, done.stdout
        assert "sudo to root: the become password is wrong" in lines[0]
        assert "-K" in lines[0] and "ansible_become_password" in lines[0]
    assert "Traceback" not in done.stderr
    assert wrong not in done.stdout + done.stderr and sudoer.password not in done.stdout
    # sudo, refused, did not stay waiting for another try.
    assert [(node, cluster.wait_idle(node)) for node in cluster.names] == [
        (node, []) for node in cluster.names
    ]


def test_become_without_a_password_says_so_at_once(cluster: Cluster, sudoer: Sudoer) -> None:
    node = cluster.names[0]
    argv = ["provision", "-i", str(sudoer.inventory), "--playbook", str(sudoer.playbook)]
    done = cpuaccel(*argv, "--limit", node, timeout=60)
    assert done.returncode == EXIT_NODE_FAILED, done.stdout + done.stderr
    assert f"failed: {node}: sudo to root: sudo asks for a password and none was given" in (
        done.stdout
    )
