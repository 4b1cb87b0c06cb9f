"""The playbook agent (cpuaccel/node, program "agent") without nodes: started as the
controller starts it (``python -c BOOT LEN``, source then request lines on stdin), one
test folder each; plus its version and requirement helpers imported directly."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import queue
import shlex
import shutil
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cpuaccel import node
from cpuaccel.connectors import programs
from cpuaccel.node import common, pep440, pip
from tests.unit.node.interpreters import old_python

SOURCE = node.program("agent")


class Agent:
    """A running agent; ``call`` sends one request and returns its reply."""

    def __init__(self, cwd: Path, env: dict[str, str], python: str = sys.executable) -> None:
        self.stderr = (cwd / "agent.stderr").open("wb")
        self.proc = subprocess.Popen(
            [python, "-c", programs.BOOT, str(len(SOURCE))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            cwd=cwd,
            env=env,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.lines: queue.Queue[bytes] = queue.Queue()
        out = self.proc.stdout
        threading.Thread(target=self._pump, args=(out,), daemon=True).start()
        self.send_raw(SOURCE)
        self.ready = self.read()
        self.ids = 0

    def _pump(self, out: Iterator[bytes]) -> None:
        for line in out:
            self.lines.put(line)

    def send_raw(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def read(self) -> dict[str, Any]:
        try:
            line = self.lines.get(timeout=120)
        except queue.Empty:
            raise AssertionError("the agent did not answer") from None
        value = json.loads(line)
        assert isinstance(value, dict)
        return value

    def call(
        self, module: str, check: bool = False, diff: bool = False, **args: Any
    ) -> dict[str, Any]:
        self.ids += 1
        request = {"id": self.ids, "module": module, "args": args, "check": check, "diff": diff}
        self.send_raw(json.dumps(request).encode() + b"\n")
        reply = self.read()
        assert reply["id"] == self.ids
        assert isinstance(reply["changed"], bool) and isinstance(reply["failed"], bool)
        return reply

    def close(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        rc = self.proc.wait(timeout=30)
        self.stderr.close()
        return rc


def agent_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "ONEAPI_ROOT"}
    (tmp_path / "home").mkdir(exist_ok=True)
    env["HOME"] = str(tmp_path / "home")  # for ~ in paths and setvars' search
    env.update(extra)
    return env


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Agent]:
    running = Agent(tmp_path, agent_env(tmp_path))
    yield running
    assert running.close() == 0  # exits cleanly at the end of its input


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def sha1(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()


def copy_args(dest: Path | str, data: bytes, **more: Any) -> dict[str, Any]:
    return {"dest": str(dest), "content_b64": b64(data), "checksum": sha1(data), **more}


def mode_of(path: Path) -> int:
    return path.stat().st_mode & 0o7777


# ---------------------------------------------------------------- protocol


def test_ready_line_and_errors_become_replies(node: Agent, tmp_path: Path) -> None:
    assert node.ready == {
        "ready": True,
        "python": sys.executable,
        "version": ".".join(map(str, sys.version_info[:3])),
    }
    reply = node.call("nope")
    assert reply["failed"] and reply["msg"] == "unknown module nope"
    reply = node.call("file", state="directory")  # a handler's exception: no path
    assert reply == {"id": node.ids, "changed": False, "failed": True, "msg": "KeyError: 'path'"}
    node.send_raw(b"this is not json\n\n")
    assert node.read()["failed"]
    # Nested too deep: json's RecursionError ended the agent; now one refused request.
    node.send_raw(b"[" * 3000 + b"\n")
    assert node.read()["msg"] == "bad request: values nested more than 200 levels deep"
    # Still alive and answering in order.
    assert node.call("command", argv=["true"])["rc"] == 0


def test_module_output_never_reaches_the_protocol(node: Agent) -> None:
    big = node.call("command", argv=[sys.executable, "-c", "print('x' * 1000000)"])
    assert big["stdout"] == "x" * 1000000
    noisy = node.call("command", cmd="echo out; echo err >&2; exec 1>&-; echo more", shell=True)
    assert noisy["stdout"] == "out" and noisy["stderr"].startswith("err")
    assert node.call("stat", path="/")["stat"]["isdir"]


# ---------------------------------------------------------------- command


def test_command_runs_and_reports(node: Agent, tmp_path: Path) -> None:
    reply = node.call("command", argv=["echo", "hello world"])
    assert reply["changed"] and not reply["failed"]
    assert (reply["rc"], reply["stdout"], reply["stderr"]) == (0, "hello world", "")
    assert reply["cmd"] == ["echo", "hello world"]
    assert isinstance(reply["delta"], float) and reply["end"] >= reply["start"]
    shell = node.call("command", cmd="[[ 1 == 1 ]] && echo $0", shell=True, executable="/bin/bash")
    assert shell["stdout"] == "/bin/bash" and shell["cmd"] == "[[ 1 == 1 ]] && echo $0"
    split = node.call("command", cmd="printf '%s|' 'a b' c")  # free form without a shell
    assert split["stdout"] == "a b|c|"


def test_command_failures(node: Agent, tmp_path: Path) -> None:
    reply = node.call("command", cmd="echo oops >&2; exit 3", shell=True)
    assert reply["failed"] and reply["changed"]
    assert (reply["rc"], reply["stderr"], reply["msg"]) == (3, "oops", "non-zero return code")
    missing = node.call("command", argv=[str(tmp_path / "no-such-program")])
    assert missing["failed"] and missing["rc"] == 2 and "No such file" in missing["msg"]
    nowhere = node.call("command", argv=["true"], chdir=str(tmp_path / "nowhere"))
    assert nowhere["failed"] and "Unable to change directory" in nowhere["msg"]


def test_command_environment_chdir_stdin(node: Agent, tmp_path: Path) -> None:
    (tmp_path / "work").mkdir()
    reply = node.call(
        "command",
        argv=["sh", "-c", 'echo "$CPXL_GREETING"; pwd; cat'],
        environment={"CPXL_GREETING": "hi there"},
        chdir=str(tmp_path / "work"),
        stdin="from stdin",
    )
    assert reply["stdout"].splitlines() == ["hi there", str(tmp_path / "work"), "from stdin"]
    # Without stdin the command reads nothing (and never the agent's own requests).
    assert node.call("command", argv=["cat"])["stdout"] == ""
    assert node.call("command", argv=["sh", "-c", "echo ${CPXL_GREETING:-unset}"])["stdout"] == (
        "unset"
    )


def test_command_creates_and_removes(node: Agent, tmp_path: Path) -> None:
    marker = tmp_path / "out-1.txt"
    touch = ["sh", "-c", f"echo ran >> {marker}"]
    first = node.call("command", argv=touch, creates=str(tmp_path / "out-*.txt"))
    assert first["changed"] and marker.read_text() == "ran\n"
    again = node.call("command", argv=touch, creates=str(tmp_path / "out-*.txt"))
    msg = f"skipped, since {tmp_path}/out-*.txt exists"
    assert (again["changed"], again["rc"], again["msg"]) == (False, 0, msg)
    relative = node.call("command", argv=touch, creates="out-1.txt", chdir=str(tmp_path))
    assert not relative["changed"]
    gone = node.call("command", argv=touch, removes=str(tmp_path / "absent"))
    assert not gone["changed"] and gone["msg"] == f"skipped, since {tmp_path}/absent does not exist"
    present = node.call("command", argv=["rm", str(marker)], removes=str(marker))
    assert present["changed"] and not marker.exists()


def test_command_check_mode(node: Agent, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    reply = node.call("command", check=True, argv=["touch", str(marker)])
    assert reply["skipped"] and not reply["changed"] and reply["msg"] == "skipped in check mode"
    assert not marker.exists()
    marker.touch()
    decided = node.call("command", check=True, argv=["false"], creates=str(marker))
    assert not decided["changed"] and "skipped" not in decided
    assert decided["msg"] == f"skipped, since {marker} exists"


def test_command_timeout_kills_the_process_group(node: Agent, tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    started = time.monotonic()
    reply = node.call(
        "command", cmd=f"sleep 30 & echo $! > {pidfile}; wait", shell=True, timeout=0.5
    )
    assert time.monotonic() - started < 10
    assert reply["failed"] and "timed out after 0.5 seconds" in reply["msg"]
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # the background sleep died with its group
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            break
        if state == "Z":
            break
        time.sleep(0.05)
    else:
        pytest.fail("the command's background child outlived the timeout")


# ---------------------------------------------------------------- file


def test_file_directory(node: Agent, tmp_path: Path) -> None:
    path = tmp_path / "a" / "b"
    planned = node.call("file", check=True, diff=True, path=str(path), state="directory")
    assert planned["changed"] and not path.parent.exists()
    assert planned["diff"]["before"]["state"] == "absent"
    assert planned["diff"]["after"]["state"] == "directory"
    made = node.call("file", path=str(path), state="directory", mode=0o750)
    assert made["changed"] and made["state"] == "directory" and made["mode"] == "0750"
    assert mode_of(path) == 0o750 and mode_of(path.parent) == 0o750  # as Ansible: parents too
    assert not node.call("file", path=str(path), state="directory", mode=0o750)["changed"]
    remode = node.call("file", diff=True, path=str(path), state="directory", mode=0o700)
    assert remode["changed"] and mode_of(path) == 0o700
    assert remode["diff"]["before"]["mode"] == "0750" and remode["diff"]["after"]["mode"] == "0700"
    (tmp_path / "f").write_text("x")
    blocked = node.call("file", path=str(tmp_path / "f"), state="directory")
    assert blocked["failed"] and "already exists as a file" in blocked["msg"]


def test_file_absent(node: Agent, tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "f").write_text("x")
    target = tmp_path / "target"
    target.write_text("kept")
    link = tmp_path / "link"
    link.symlink_to(target)
    planned = node.call("file", check=True, path=str(tree), state="absent")
    assert planned["changed"] and tree.exists()
    assert node.call("file", path=str(tree), state="absent")["changed"] and not tree.exists()
    assert not node.call("file", path=str(tree), state="absent")["changed"]
    assert node.call("file", path=str(link), state="absent")["changed"]
    assert not link.is_symlink() and target.read_text() == "kept"
    diff = node.call("file", diff=True, path=str(target), state="absent")["diff"]
    assert diff["before"]["state"] == "file" and diff["after"]["state"] == "absent"


def test_file_touch(node: Agent, tmp_path: Path) -> None:
    path = tmp_path / "t"
    assert node.call("file", check=True, path=str(path), state="touch")["changed"]
    assert not path.exists()
    made = node.call("file", path=str(path), state="touch", mode=0o600)
    assert made["changed"] and path.is_file() and made["mode"] == "0600"
    os.utime(path, (1_000_000, 1_000_000))
    again = node.call("file", path=str(path), state="touch")  # times now: changed each time
    assert again["changed"] and path.stat().st_mtime > 1_000_000
    os.utime(path, (1_000_000, 1_000_000))
    kept = node.call(
        "file", path=str(path), state="touch", access_time="preserve", modification_time="preserve"
    )
    assert not kept["changed"] and path.stat().st_mtime == 1_000_000
    only_mtime = node.call("file", path=str(path), state="touch", access_time="preserve")
    assert only_mtime["changed"] and path.stat().st_atime == 1_000_000
    assert path.stat().st_mtime > 1_000_000
    fresh = tmp_path / "fresh"
    created = node.call(
        "file", path=str(fresh), state="touch", access_time="preserve", modification_time="preserve"
    )
    assert created["changed"] and fresh.exists()


def test_file_state_file(node: Agent, tmp_path: Path) -> None:
    path = tmp_path / "f"
    missing = node.call("file", path=str(path), state="file")
    assert missing["failed"] and missing["msg"] == f"file ({path}) is absent, cannot continue"
    path.write_text("x")
    path.chmod(0o644)
    ok = node.call("file", path=str(path), state="file")
    assert not ok["changed"] and ok["mode"] == "0644" and ok["state"] == "file"
    planned = node.call("file", check=True, path=str(path), state="file", mode=0o600)
    assert planned["changed"] and mode_of(path) == 0o644
    assert node.call("file", path=str(path), state="file", mode=0o600)["changed"]
    assert mode_of(path) == 0o600
    assert not node.call("file", path=str(path), state="file", mode=0o600)["changed"]
    assert node.call("file", path=str(tmp_path), state="file")["failed"]
    home = node.call("file", path="~/made", state="directory")  # ~ is the node user's home
    assert home["path"] == str(tmp_path / "home" / "made") and (tmp_path / "home/made").is_dir()


# ---------------------------------------------------------------- copy


def test_copy_writes_then_is_idempotent(node: Agent, tmp_path: Path) -> None:
    dest = tmp_path / "conf.txt"
    data = b"line one\nline two\n"
    planned = node.call("copy", check=True, diff=True, **copy_args(dest, data))
    assert planned["changed"] and not dest.exists()
    assert planned["diff"] == {
        "before": "",
        "after": data.decode(),
        "before_header": str(dest),
        "after_header": str(dest),
    }
    first = node.call("copy", **copy_args(dest, data))
    umask = os.umask(0)
    os.umask(umask)
    assert first["changed"] and dest.read_bytes() == data
    assert (first["checksum"], first["size"], first["dest"]) == (sha1(data), len(data), str(dest))
    assert first["mode"] == f"{0o666 & ~umask:04o}"
    second = node.call("copy", diff=True, **copy_args(dest, data))
    assert not second["changed"] and "diff" not in second
    assert sorted(p.name for p in tmp_path.iterdir()) == ["agent.stderr", "conf.txt", "home"]


def test_copy_replaces_atomically_keeping_the_mode(node: Agent, tmp_path: Path) -> None:
    dest = tmp_path / "app.cfg"
    dest.write_bytes(b"old\n")
    dest.chmod(0o640)
    witness = tmp_path / "witness"
    os.link(dest, witness)  # a reader holding the old file
    reply = node.call("copy", diff=True, **copy_args(dest, b"new\n"))
    assert reply["changed"] and reply["diff"]["before"] == "old\n"
    assert reply["diff"]["after"] == "new\n"
    # Renamed onto dest, not rewritten in place: the old inode still has the old bytes.
    assert dest.read_bytes() == b"new\n" and witness.read_bytes() == b"old\n"
    assert mode_of(dest) == 0o640 and reply["mode"] == "0640"
    assert not [p for p in os.listdir(tmp_path) if common.TMP_MARK in p]
    mode_only = node.call("copy", **copy_args(dest, b"new\n", mode=0o600))
    assert mode_only["changed"] and mode_of(dest) == 0o600
    assert not node.call("copy", **copy_args(dest, b"new\n", mode=0o600))["changed"]
    with_mode = node.call("copy", **copy_args(tmp_path / "run.sh", b"#!/bin/sh\n", mode=0o755))
    assert with_mode["mode"] == "0755" and mode_of(tmp_path / "run.sh") == 0o755


def test_copy_force_diff_and_errors(node: Agent, tmp_path: Path) -> None:
    dest = tmp_path / "keep"
    dest.write_bytes(b"mine\n")
    kept = node.call("copy", **copy_args(dest, b"theirs\n", force=False))
    assert not kept["changed"] and dest.read_bytes() == b"mine\n"
    binary = node.call("copy", check=True, diff=True, **copy_args(dest, b"\xff\xfe\x00"))
    assert binary["diff"] == {"binary": True} and dest.read_bytes() == b"mine\n"
    big = node.call("copy", check=True, diff=True, **copy_args(dest, b"a" * (64 * 1024 + 1)))
    assert big["diff"] == {"binary": True}
    folder = node.call("copy", **copy_args(tmp_path, b"x"))
    assert folder["failed"] and "is a directory" in folder["msg"]
    orphan = node.call("copy", **copy_args(tmp_path / "no" / "f", b"x"))
    assert (
        orphan["failed"] and orphan["msg"] == f"Destination directory {tmp_path}/no does not exist"
    )
    damaged = node.call("copy", dest=str(dest), content_b64=b64(b"x"), checksum=sha1(b"y"))
    assert damaged["failed"] and dest.read_bytes() == b"mine\n"


def test_copy_probe_asks_for_the_bytes_only_when_dest_differs(node: Agent, tmp_path: Path) -> None:
    """A large source is named by its sha1 and size first: no content in the request."""
    dest = tmp_path / "weights.bin"
    data = os.urandom(3000)

    def probe(check: bool = False, **more: Any) -> dict[str, Any]:
        args = {"dest": str(dest), "probe": True, "checksum": sha1(data), "size": len(data)}
        return node.call("copy", check=check, diff=True, **args, **more)

    asked = probe()
    assert (asked["changed"], asked["wants_content"], asked["failed"]) == (False, True, False)
    planned = probe(check=True)  # a dry run needs no bytes to say it would write
    assert planned["changed"] and planned["diff"] == {"binary": True} and not dest.exists()
    dest.write_bytes(data)
    dest.chmod(0o600)
    same = probe()
    assert not same["changed"] and "wants_content" not in same
    assert (same["checksum"], same["size"], same["mode"]) == (sha1(data), len(data), "0600")
    assert probe(mode=0o640)["changed"] and mode_of(dest) == 0o640  # the mode alone
    dest.write_bytes(b"another\n")
    assert probe()["wants_content"] and dest.read_bytes() == b"another\n"  # untouched
    kept = probe(force=False)
    assert not kept["changed"] and kept["msg"] == "file already exists"


# ---------------------------------------------------------------- stat


def test_stat(node: Agent, tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"data")
    path.chmod(0o640)
    info = node.call("stat", path=str(path))
    assert not info["changed"]
    st = info["stat"]
    assert st["exists"] and st["isreg"] and not st["isdir"] and not st["islnk"]
    assert (st["mode"], st["size"], st["checksum"]) == ("0640", 4, sha1(b"data"))
    assert st["mtime"] == pytest.approx(path.stat().st_mtime)
    assert "checksum" not in node.call("stat", path=str(path), get_checksum=False)["stat"]
    link = tmp_path / "l"
    link.symlink_to(path)
    st = node.call("stat", path=str(link))["stat"]
    assert st["islnk"] and not st["isreg"] and st["lnk_target"] == str(path)
    assert node.call("stat", path=str(tmp_path))["stat"]["isdir"]
    assert node.call("stat", path=str(tmp_path / "nothing"))["stat"]["exists"] is False
    assert node.call("stat", path=str(path / "below-a-file"))["stat"]["exists"] is False


# ---------------------------------------------------------------- setvars

FAKE_SETVARS = """\
# A stand-in for oneAPI's setvars.sh. Sourced with arguments, the real one reads them
# as its own options.
if [ -n "$1" ]; then echo "setvars: unexpected argument $1" >&2; exit 2; fi
export CPXL_ONEAPI_ROOT=/opt/fake
export PATH="/opt/fake/bin:$PATH"
LOCAL_ONLY=1
echo ":: oneAPI environment initialized ::"
"""


def test_setvars_found_checked_and_recorded(node: Agent, tmp_path: Path) -> None:
    script = tmp_path / "oneapi" / "setvars.sh"
    script.parent.mkdir()
    script.write_text(FAKE_SETVARS)
    record = tmp_path / "state" / "setvars"
    args: dict[str, Any] = {"paths": [str(tmp_path / "missing.sh"), str(script)]}
    args["record"] = str(record)
    planned = node.call("setvars", check=True, **args)
    assert planned["changed"] and planned["found"] and not record.exists()
    reply = node.call("setvars", **args)
    assert not reply["failed"], reply
    assert (reply["found"], reply["path"], reply["changed"]) == (True, str(script), True)
    assert reply["sets"] == ["CPXL_ONEAPI_ROOT", "PATH"]
    assert record.read_text() == f"{script}\n"
    assert not node.call("setvars", **args)["changed"]
    assert not node.call("setvars", paths=[str(script)])["changed"]  # no record: nothing to do


def test_setvars_broken_script_fails(node: Agent, tmp_path: Path) -> None:
    script = tmp_path / "setvars.sh"
    script.write_text("echo 'cannot find the compiler' >&2\nexit 1\n")
    reply = node.call("setvars", paths=[str(script)], record=str(tmp_path / "rec"))
    assert reply["failed"] and reply["found"] and reply["path"] == str(script)
    assert "cannot be sourced" in reply["msg"] and "cannot find the compiler" in reply["msg"]
    assert not (tmp_path / "rec").exists()


def test_setvars_not_found(node: Agent, tmp_path: Path) -> None:
    wanted = node.call("setvars", paths=[str(tmp_path / "x.sh")], search=False, required=True)
    assert wanted["failed"] and not wanted["found"] and wanted["path"] is None
    assert str(tmp_path / "x.sh") in wanted["msg"]
    assert "install oneAPI, or set cpuaccel_setvars to the file" in wanted["msg"]
    optional = node.call("setvars", paths=[str(tmp_path / "x.sh")], search=False)
    assert not optional["failed"] and not optional["found"] and optional["sets"] == []


@pytest.mark.skipif(os.path.exists("/opt/intel/oneapi/setvars.sh"), reason="oneAPI installed")
def test_setvars_search_order(tmp_path: Path) -> None:
    home_script = tmp_path / "home" / "intel" / "oneapi" / "setvars.sh"
    prefix_script = tmp_path / "pfx" / "env" / "vars.sh"
    root_script = tmp_path / "root" / "setvars.sh"
    for script in (home_script, prefix_script, root_script):
        script.parent.mkdir(parents=True)
        script.write_text("export CPXL_FROM=1\n")
    node = Agent(tmp_path, agent_env(tmp_path, ONEAPI_ROOT=str(tmp_path / "root")))
    try:
        python = str(tmp_path / "pfx" / "bin" / "python")
        assert node.call("setvars", python=python)["path"] == str(home_script)
        home_script.unlink()
        assert node.call("setvars", python=python)["path"] == str(prefix_script)
        elsewhere = str(tmp_path / "elsewhere" / "bin" / "python")
        assert node.call("setvars", python=elsewhere)["path"] == str(root_script)
        assert not node.call("setvars", python=python, search=False)["found"]
    finally:
        assert node.close() == 0


# ---------------------------------------------------------------- pip: helpers


def test_version_order() -> None:
    ordered = [
        "0.9", "1.0.dev0", "1.0a1.dev1", "1.0a1", "1.0b2", "1.0rc1", "1.0",
        "1.0+abc", "1.0+abc.5", "1.0+5", "1.0.post1.dev0", "1.0.post1", "1.1", "1!0.1",
    ]  # fmt: skip
    keys = [pep440._key(v) for v in map(pep440.parse_version, ordered) if v is not None]
    assert len(keys) == len(ordered) and keys == sorted(keys)
    same = [("1.0", "1.0.0"), ("1.0-1", "1.0.post1"), ("1.0RC1", "1.0c1"), ("v1.0", "1.0"),
            ("1.0alpha1", "1.0a1"), ("1.0.dev", "1.0.dev0")]  # fmt: skip
    for a, b in same:
        va, vb = pep440.parse_version(a), pep440.parse_version(b)
        assert va is not None and vb is not None and pep440._key(va) == pep440._key(vb), (a, b)
    assert pep440.parse_version("not a version") is None
    assert pep440.parse_version("2.13.0+cpu") == (0, (2, 13, 0), None, None, None, ((0, 0, "cpu"),))


@pytest.mark.parametrize(
    ("version", "op", "spec", "expected"),
    [
        ("2.13.0+cpu", "==", "2.13.0", True),  # a public spec ignores the local label
        ("2.13.0+cpu", "==", "2.13.0+cpu", True),
        ("2.13.0+cpu", "==", "2.13.0+cu121", False),
        ("2.13.0", "==", "2.13.0+cpu", False),
        ("2.13.1", "==", "2.13.*", True),
        ("2.13.0+cpu", "==", "2.13.*", True),
        ("2.13.0rc1", "==", "2.13.*", True),
        ("2.13", "==", "2.13.0.*", True),
        ("2.14.0", "==", "2.13.*", False),
        ("1.1", "!=", "1.0.*", True),
        ("1.0", "!=", "1.0.0", False),
        ("1.4.5", "~=", "1.4.2", True),
        ("1.4.1", "~=", "1.4.2", False),
        ("1.5", "~=", "1.4.2", False),
        ("1.9", "~=", "1.4", True),
        ("2.0", "~=", "1.4", False),
        ("1.9", "<", "2.0", True),
        ("2.0rc1", "<", "2.0", False),  # not a pre-release of the version itself
        ("2.0rc1", "<", "2.0rc2", True),
        ("2.1", ">", "2.0", True),
        ("2.0.post1", ">", "2.0", False),
        ("2.0+x", ">", "2.0", False),
        ("2.0.post2", ">", "2.0.post1", True),
        ("2.0", ">=", "2.0", True),
        ("2.0.dev1", ">=", "2.0", False),
        ("2.0+cpu", "<=", "2.0", True),
        ("1!1.0", ">", "2.0", True),
        ("1.0", "===", "1.0", True),
        ("1.0.0", "===", "1.0", False),
        ("weird-version", ">=", "1", False),
    ],
)
def test_version_matches(version: str, op: str, spec: str, expected: bool) -> None:
    assert pep440.version_matches(version, op, spec) is expected


def test_parse_requirement() -> None:
    req = pep440.parse_requirement("Torch_Vision[extra1, x] >=0.18,<1 ; python_version >= '3.8'")
    assert req["name"] == "torch-vision" and req["known"]
    assert req["specs"] == [(">=", "0.18"), ("<", "1")]
    assert req["arg"] == "Torch_Vision[extra1, x] >=0.18,<1 ; python_version >= '3.8'"
    assert pep440.parse_requirement("numpy")["specs"] == []
    assert pep440.parse_requirement("foo (>=1.0, !=1.5)")["specs"] == [(">=", "1.0"), ("!=", "1.5")]
    wheel = pep440.parse_requirement("/w/oneccl_bind_pt-2.13.0+cpu-cp311-cp311-linux_x86_64.whl")
    assert (wheel["name"], wheel["exact"], wheel["known"]) == ("oneccl-bind-pt", "2.13.0+cpu", True)
    url = pep440.parse_requirement("file:///w/my%20dir/pkg_a-1.0-1-py3-none-any.whl")
    assert (url["name"], url["exact"]) == ("pkg-a", "1.0")
    direct = pep440.parse_requirement("pkg @ file:///w/pkg-2.0-py3-none-any.whl")
    assert (direct["name"], direct["exact"], direct["arg"]) == ("pkg", "2.0", direct["text"])
    home = pep440.parse_requirement("~/w/pkg-2.0-py3-none-any.whl")
    assert home["arg"] == os.path.expanduser("~/w/pkg-2.0-py3-none-any.whl")
    for unknown in ("git+https://example.org/x.git#egg=x", "-e .", "./src", "foo>>1", "foo~=1",
                    "foo>=1.*", "bar @ https://example.org/bar.tar.gz"):  # fmt: skip
        assert not pep440.parse_requirement(unknown)["known"], unknown
    assert pep440.parse_requirement("bar @ https://example.org/bar.tar.gz")["name"] == "bar"


def test_read_requirements(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "more.txt").write_text("baz==2.*\n")
    top = tmp_path / "requirements.txt"
    top.write_text(
        "# the training stack\n--index-url https://example.org/simple\nfoo-bar>=1.0  # pinned\n"
        "-r sub/more.txt\n-c constraints.txt\nqux \\\n  ==3.0 --hash=sha256:abc\n-e ./local\n"
    )
    assert pep440.read_requirements(str(top)) == [
        "foo-bar>=1.0",
        "baz==2.*",
        "qux   ==3.0",
        "-e ./local",
    ]


def test_satisfied() -> None:
    versions = {"torch": "2.13.0+cpu", "numpy": "1.26.4"}
    assert pep440.satisfied(pep440.parse_requirement("torch==2.13.0"), versions)
    assert pep440.satisfied(pep440.parse_requirement("numpy>=1.20,<2"), versions)
    assert not pep440.satisfied(pep440.parse_requirement("numpy>=2"), versions)
    assert not pep440.satisfied(pep440.parse_requirement("scipy"), versions)
    exact = "/w/torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl"
    assert pep440.satisfied(pep440.parse_requirement(exact), versions)
    assert not pep440.satisfied(pep440.parse_requirement(exact.replace("+cpu", "")), versions)


def fake_venv(root: Path, dists: dict[str, str]) -> Path:
    """A venv's layout with dist-info folders, and a python that must never be run."""
    site = root / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (root / "bin").mkdir()
    (root / "bin" / "python").write_text("#!/bin/sh\necho 'the fake python ran' >&2; exit 99\n")
    (root / "bin" / "python").chmod(0o755)
    (root / "pyvenv.cfg").write_text("home = /usr/bin\ninclude-system-site-packages = false\n")
    for folder, version in dists.items():
        (site / folder).mkdir()
        (site / folder / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: x\nVersion: {version}\n\nBody\n"
        )
    return site


def test_scan_and_versions(tmp_path: Path) -> None:
    site = fake_venv(
        tmp_path / "v", {"Foo_Bar-1.2.dist-info": "1.2", "torch-2.13.0+cpu.dist-info": "2.13.0+cpu"}
    )
    (site / "old_pkg-0.5-py3.11.egg-info").write_text(
        "Metadata-Version: 1.0\nName: old-pkg\nVersion: 0.5\n"
    )
    (site / "broken-1.0.dist-info").mkdir()
    dirs = pip._site_dirs("unused", str(tmp_path / "v"))
    assert dirs == [str(site)]
    dists, seen = pip.scan(dirs)
    assert set(dists) == {"foo-bar", "torch", "old-pkg", "broken"} and len(seen) == 4
    assert pip.dist_version(dists["torch"]) == "2.13.0+cpu"
    assert pip.dist_version(dists["old-pkg"]) == "0.5"
    assert pip.dist_version(dists["broken"]) is None
    # Outside a venv the interpreter is asked for its import path.
    assert any(p.endswith("site-packages") for p in pip._site_dirs(sys.executable, None))


def test_script_python(tmp_path: Path) -> None:
    script = tmp_path / "pip3"
    script.write_text("#!/opt/py/bin/python3.11\nimport pip\n")
    assert pip.script_python(str(script)) == "/opt/py/bin/python3.11"
    script.write_text("#!/usr/bin/env python3\n")
    assert pip.script_python(str(script)) == shutil.which("python3")
    script.write_text("#!/bin/sh\n'''exec' \"/very/long/path/bin/python\" \"$0\" \"$@\"\n' '''\n")
    assert pip.script_python(str(script)) == "/very/long/path/bin/python"


def test_pip_decides_without_running_pip(node: Agent, tmp_path: Path) -> None:
    venv = tmp_path / "v"
    fake_venv(venv, {"foo_bar-1.2.dist-info": "1.2", "torch-2.13.0+cpu.dist-info": "2.13.0+cpu"})
    base: dict[str, Any] = {"virtualenv": str(venv)}
    ok = node.call("pip", name=["Foo.Bar>=1.0", "torch==2.13.0"], **base)
    assert not ok["failed"], ok
    assert (ok["changed"], ok["cmd"], ok["missing"]) == (False, [], [])
    assert ok["installed"] == {"foo-bar": "1.2", "torch": "2.13.0+cpu"}
    planned = node.call(
        "pip",
        check=True,
        name=["foo-bar>=2", "numpy", "torch"],
        index_url="https://i/simple",
        **base,
    )
    assert planned["changed"] and planned["missing"] == ["foo-bar>=2", "numpy"]
    assert planned["cmd"][:7] == [
        str(venv / "bin/python"),
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "--index-url",
        "https://i/simple",
    ]
    assert planned["cmd"][7:] == ["foo-bar>=2", "numpy"]
    latest = node.call("pip", check=True, name=["torch"], state="latest", **base)
    assert not latest["changed"] and "cannot tell" in latest["msg"]
    assert node.call("pip", check=True, name=["numpy"], state="latest", **base)["changed"]
    absent = node.call(
        "pip", check=True, name=["torch", "numpy", "foo-bar==9"], state="absent", **base
    )
    # foo-bar 1.2 is not foo-bar==9, and numpy is not installed: only torch goes.
    assert absent["changed"] and absent["cmd"][3:] == [
        "uninstall",
        "-y",
        "--disable-pip-version-check",
        "torch",
    ]
    assert not node.call("pip", check=True, name=["numpy"], state="absent", **base)["changed"]
    assert node.call("pip", check=True, name=["torch"], state="forcereinstall", **base)["changed"]
    reqs = tmp_path / "requirements.txt"
    reqs.write_text("foo-bar>=1.0\n")
    assert not node.call("pip", requirements=str(reqs), **base)["changed"]
    reqs.write_text("foo-bar>=1.0\nnumpy\n")
    from_file = node.call("pip", check=True, requirements=str(reqs), name=["torch"], **base)
    assert from_file["changed"] and from_file["cmd"][-2:] == ["-r", str(reqs)]
    assert from_file["missing"] == ["numpy"]
    new_venv = node.call("pip", check=True, name=["torch"], virtualenv=str(tmp_path / "new"))
    assert new_venv["changed"] and new_venv["missing"] == ["torch"]
    assert not (tmp_path / "new").exists()


# ---------------------------------------------------------------- pip: for real


def build_wheel(folder: Path, version: str) -> Path:
    """A minimal valid pure-Python wheel of the distribution cpxl-tiny."""
    dist = f"cpxl_tiny-{version}.dist-info"
    files = {
        "cpxl_tiny.py": f"VERSION = {version!r}\n".encode(),
        f"{dist}/METADATA": (
            f"Metadata-Version: 2.1\nName: cpxl-tiny\nVersion: {version}\n".encode()
        ),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: cpuaccel-tests\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    path = folder / f"cpxl_tiny-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        zf.writestr(f"{dist}/RECORD", "\n".join(record) + "\n")
    return path


def test_pip_in_a_new_virtualenv(node: Agent, tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    build_wheel(wheels, "1.0")
    venv = tmp_path / "venv"
    args: dict[str, Any] = {
        "virtualenv": str(venv),
        "virtualenv_command": f"{shlex.quote(sys.executable)} -m venv",
        "no_index": True,
        "find_links": [str(wheels)],
    }
    first = node.call("pip", name=["cpxl-tiny"], **args)
    assert not first["failed"], first
    assert first["changed"] and first["installed"] == {"cpxl-tiny": "1.0"}
    assert first["missing"] == ["cpxl-tiny"] and first["rc"] == 0
    assert "--no-index" in first["cmd"] and first["cmd"][-1] == "cpxl-tiny"
    python = str(venv / "bin" / "python")
    probe = [python, "-c", "import cpxl_tiny; print(cpxl_tiny.VERSION)"]
    assert subprocess.run(probe, capture_output=True, text=True, check=True).stdout == "1.0\n"
    again = node.call("pip", name=["cpxl-tiny==1.0"], **args)
    assert (again["changed"], again["cmd"], again["missing"]) == (False, [], [])
    newer = build_wheel(wheels, "1.1")
    by_file = node.call("pip", name=[str(newer)], **args)  # a wheel file: its version exactly
    assert by_file["changed"] and by_file["installed"] == {"cpxl-tiny": "1.1"}, by_file
    latest = node.call("pip", name=["cpxl-tiny"], state="latest", **args)
    assert not latest["failed"] and latest["cmd"] and not latest["changed"]
    gone = node.call("pip", name=["cpxl-tiny"], state="absent", **args)
    assert gone["changed"] and gone["installed"] == {} and "uninstall" in gone["cmd"]
    assert subprocess.run(probe, capture_output=True).returncode != 0
    assert not node.call("pip", name=["cpxl-tiny"], state="absent", **args)["changed"]


def test_pip_failure_reports_pip_message(node: Agent, tmp_path: Path) -> None:
    venv = tmp_path / "v"
    fake_venv(venv, {})
    reply = node.call("pip", name=["numpy"], virtualenv=str(venv))
    assert reply["failed"] and reply["rc"] == 99 and reply["msg"] == "the fake python ran"
    assert not reply["changed"] and reply["installed"] == {}


# ---------------------------------------------------------------- Python 3.8


@pytest.mark.skipif(old_python() is None, reason="no Python 3.8 on this machine")
def test_runs_on_python_38(tmp_path: Path) -> None:
    python = old_python()
    assert python is not None
    node = Agent(tmp_path, agent_env(tmp_path), python=python)
    try:
        assert node.ready["version"].startswith("3.8.")
        assert node.call("command", argv=["echo", "hi"])["stdout"] == "hi"
        assert node.call("file", path=str(tmp_path / "d"), state="directory", mode=0o700)["changed"]
        assert node.call("copy", diff=True, **copy_args(tmp_path / "d" / "f", b"x\n"))["changed"]
        assert node.call("stat", path=str(tmp_path / "d" / "f"))["stat"]["checksum"] == sha1(b"x\n")
        venv = tmp_path / "v"
        fake_venv(venv, {"torch-2.13.0+cpu.dist-info": "2.13.0+cpu"})
        assert not node.call("pip", name=["torch~=2.13.0"], virtualenv=str(venv))["changed"]
        script = tmp_path / "setvars.sh"
        script.write_text(FAKE_SETVARS)
        assert node.call("setvars", paths=[str(script)])["sets"] == ["CPXL_ONEAPI_ROOT", "PATH"]
    finally:
        assert node.close() == 0


# ---------------------------------------------------------------- links at the path


def test_file_never_acts_through_a_link_at_the_path(node: Agent, tmp_path: Path) -> None:
    """A link someone left at the path must not have file chmod, touch or time its target."""
    target = tmp_path / "target"
    target.mkdir()
    target.chmod(0o750)
    (tmp_path / "secret").write_text("s")
    (tmp_path / "secret").chmod(0o600)
    (tmp_path / "dirlink").symlink_to(target)
    (tmp_path / "filelink").symlink_to(tmp_path / "secret")
    (tmp_path / "dangling").symlink_to(tmp_path / "created-through-the-link")
    cases = [
        ("dirlink", {"state": "directory", "mode": "0777"}),
        ("filelink", {"state": "file", "mode": "0644"}),
        ("filelink", {"state": "touch"}),
        ("dangling", {"state": "touch"}),
    ]
    for name, args in cases:
        reply = node.call("file", path=str(tmp_path / name), **args)
        assert reply["failed"] and "symbolic link" in reply["msg"], (name, reply)
    assert mode_of(target) == 0o750
    assert mode_of(tmp_path / "secret") == 0o600
    assert not (tmp_path / "created-through-the-link").exists()
    assert (tmp_path / "dirlink").is_symlink() and (tmp_path / "filelink").is_symlink()


def test_copy_replaces_a_link_at_dest_and_leaves_its_target(node: Agent, tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_bytes(b"same\n")
    target.chmod(0o600)
    dest = tmp_path / "conf"
    dest.symlink_to(target)
    reply = node.call("copy", **copy_args(dest, b"same\n", mode="0644"))
    assert reply["changed"] and not dest.is_symlink() and dest.read_bytes() == b"same\n"
    assert mode_of(dest) == 0o644
    assert mode_of(target) == 0o600 and target.read_bytes() == b"same\n"
