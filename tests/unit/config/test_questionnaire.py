"""`cpuaccel config`'s questionnaire driven through a real pseudo-terminal: answers typed
one by one (wrong ones first, which are asked again), files written, then
`cpuaccel run --dry-run` uses them."""

from __future__ import annotations

import os
import select
import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from cpuaccel.config.questionnaire import Answers, Asker, _ask_processes
from cpuaccel.errors import EXIT_USAGE
from tests.unit.config.test_config_files import command, env_of, section
from testsupport.command import cpuaccel, inherited_env, start_cpuaccel


class Terminal:
    """A child process on a pty: wait for text, type a line."""

    def __init__(self, args: list[str], cwd: Path) -> None:
        self.master, slave = os.openpty()
        self.proc = start_cpuaccel(
            *args, cwd=cwd, env=inherited_env(TERM="dumb"),
            stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
        )  # fmt: skip
        os.close(slave)
        self.seen = ""
        self.pos = 0

    def expect(self, text: str, timeout: float = 20.0) -> str:
        """Read until ``text`` appears after what was already matched; returns the gap."""
        deadline = time.monotonic() + timeout
        while text not in self.seen[self.pos :]:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"waited for {text!r}; the terminal shows:\n{self.seen}")
            ready, _, _ = select.select([self.master], [], [], left)
            if ready:
                try:
                    chunk = os.read(self.master, 4096)
                except OSError:  # the child closed the terminal
                    chunk = b""
                if not chunk:
                    raise AssertionError(f"ended before {text!r}:\n{self.seen}")
                self.seen += chunk.decode(errors="replace").replace("\r\n", "\n")
        end = self.seen.index(text, self.pos) + len(text)
        gap, self.pos = self.seen[self.pos : end], end
        return gap

    def answer(self, prompt: str, line: str) -> str:
        gap = self.expect(prompt)
        os.write(self.master, line.encode() + b"\r")
        return gap

    def wait(self, timeout: float = 30.0) -> int:
        try:
            code = self.proc.wait(timeout)
        finally:
            # Drain what is left, so the transcript is whole.
            while select.select([self.master], [], [], 0.2)[0]:
                try:
                    chunk = os.read(self.master, 4096)
                except OSError:
                    break
                if not chunk:
                    break
                self.seen += chunk.decode(errors="replace").replace("\r\n", "\n")
            os.close(self.master)
        return code


def test_questionnaire_on_a_terminal_writes_files_that_run_uses(tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text("print('hi')\n")
    key = tmp_path / "id_test"
    key.write_text("not a real key\n")
    t = Terminal(["config"], proj)
    t.answer("Which type of machine setup?", "triple")  # not an option: asked again
    t.answer("Which type of machine setup?", "multi")
    t.answer("An existing MPI hostfile or inventory", "")  # type the addresses instead
    t.answer("How many machines will you use? [2]", "two")
    assert "whole number" in t.answer("How many machines will you use? [2]", "2")
    t.answer("Address of machine 0 (the main node", "xxx.xxx.xxx.xxx")
    assert "placeholder" in t.answer("Address of machine 0", "192.0.2.10")
    t.answer("Address of machine 1", "192.0.2.10")  # the same machine twice
    assert "already machine 0" in t.answer("Address of machine 1", "192.0.2.11")
    t.answer("SSH user", "train")
    t.answer("SSH port [22]", "")  # the default
    t.answer("SSH private key", str(tmp_path / "missing"))
    assert "no key file" in t.answer("SSH private key", str(key))
    t.answer("How many processes per machine?", "4")
    t.answer("Which machine hosts the main process?", "192.0.2.11")
    t.answer("Port of the main process [29500]", "29501")
    t.answer("Which MPI launches the job?", "mpi")  # a unique prefix: mpich
    t.answer("How many oneCCL worker threads per process? [1]", "")
    t.answer("bf16 mixed precision or fp32?", "bf16")
    t.answer("Python on every node", "/opt/venv/bin/python")
    t.answer("Folder on the nodes", "/srv/work")
    t.expect("next: cpuaccel check")
    assert t.wait() == 0, t.seen
    assert "Traceback" not in t.seen

    inventory = yaml.safe_load((proj / "inventory.yaml").read_text())
    # The chosen main node first; SSH and Python settings for all.
    assert list(inventory["all"]["hosts"]) == ["192.0.2.11", "192.0.2.10"]
    assert inventory["all"]["vars"] == {
        "ansible_user": "train",
        "ansible_ssh_private_key_file": str(key),
        "cpuaccel_python": "/opt/venv/bin/python",
        "cpuaccel_workdir": "/srv/work",
    }
    project = yaml.safe_load((proj / "cpuaccel.yaml").read_text())
    assert project == {
        "inventory": "inventory.yaml", "nodes": 2, "ppn": 4, "launcher": "mpich",
        "master_port": 29501, "mixed_precision": "bf16", "ccl_workers": 1,
    }  # fmt: skip

    run = cpuaccel("run", "--dry-run", "train.py", cwd=proj)
    assert run.returncode == 0, run.stderr
    assert section(run.stdout, "hostfile") == ["192.0.2.11", "192.0.2.10"]
    argv = command(run.stdout)
    assert argv[0] == "mpirun.mpich" and "-launcher-exec" in argv  # MPICH, as answered
    assert argv[argv.index("-n") + 1] == "8" and argv[argv.index("-ppn") + 1] == "4"
    env = env_of(run.stdout)
    assert env["MASTER_ADDR"] == "192.0.2.11" and env["MASTER_PORT"] == "29501"
    assert env["ACCELERATE_MIXED_PRECISION"] == "bf16"
    assert shlex.split(env["CPUACCEL_RUN_DIR"])[0].startswith("/srv/work/runs/")


def test_existing_files_are_kept_unless_the_user_says_yes(tmp_path: Path) -> None:
    (tmp_path / "cpuaccel.yaml").write_text("ppn: 7\n")
    flags = ["--single", "--ppn", "2", "--master-port", "29500", "--launcher", "impi",
             "--ccl-workers", "1", "--mixed-precision", "bf16",
             "--python", "/usr/bin/python3"]  # fmt: skip
    t = Terminal(["config", *flags], tmp_path)
    t.answer("cpuaccel.yaml exists: overwrite it? [y/N]", "n")
    assert t.wait() == EXIT_USAGE
    assert "nothing was written" in t.seen
    assert (tmp_path / "cpuaccel.yaml").read_text() == "ppn: 7\n"
    assert not (tmp_path / "inventory.yaml").exists()

    t = Terminal(["config", *flags], tmp_path)
    t.answer("cpuaccel.yaml exists: overwrite it? [y/N]", "y")
    assert t.wait() == 0, t.seen
    assert yaml.safe_load((tmp_path / "cpuaccel.yaml").read_text())["ppn"] == 2


def test_non_interactive_config_with_flags(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    no_tty = cpuaccel("config", cwd=tmp_path)
    assert (
        no_tty.returncode == EXIT_USAGE and "not one" in no_tty.stderr and "--yes" in no_tty.stderr
    )
    missing = cpuaccel("config", "--yes", "--multi", cwd=tmp_path)
    assert missing.returncode == EXIT_USAGE and "--yes needs --hosts" in missing.stderr
    bad = cpuaccel("config", "--yes", "--hosts", "a,b,a", cwd=tmp_path)
    assert bad.returncode == EXIT_USAGE and "twice" in bad.stderr
    args = ["config", "--yes", "--hosts", "192.0.2.1,192.0.2.2", "--user", "u", "--ppn", "2",
            "--key", "", "--python", "/p/python"]  # fmt: skip
    ok = cpuaccel(*args, cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    again = cpuaccel(*args, cwd=tmp_path)
    assert again.returncode == EXIT_USAGE and "--force" in again.stderr
    assert cpuaccel(*args, "--force", cwd=tmp_path).returncode == 0
    run = cpuaccel("run", "--dry-run", "train.py", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    argv = command(run.stdout)
    assert argv[argv.index("-n") + 1] == "4" and argv[0] == "/p/mpirun"


def test_the_settings_questions_check_as_their_kinds() -> None:
    """Each setting's question is its table entry's: the text, the default, the flag that
    answers it, and the answer checked by its kind's bounds or choices."""
    asked: dict[str, tuple[str, Any, Callable[[str], Any], str]] = {}

    class Recording(Asker):
        def ask(self, question: str, default: Any, check: Callable[[str], Any], flag: str) -> Any:
            asked[flag] = (question, default, check, flag)
            return default

    answers = Answers(ppn=1, hosts=["localhost"])
    _ask_processes(answers, Recording(interactive=True), multi=False)
    assert (answers.master_port, answers.launcher) == (29500, "auto")
    assert (answers.ccl_workers, answers.mixed_precision) == (1, "auto")
    assert list(asked) == ["--master-port", "--launcher", "--ccl-workers", "--mixed-precision"]
    port, workers = asked["--master-port"][2], asked["--ccl-workers"][2]
    assert port("65535") == 65535 and workers("0") == 0
    with pytest.raises(ValueError, match="type a whole number from 1 to 65535"):
        port("65536")
    with pytest.raises(ValueError, match="type a whole number from 0 to 64"):
        workers("65")
    assert asked["--launcher"][2]("mpi") == "mpich"
    with pytest.raises(ValueError, match="type one of: auto, bf16, fp32"):
        asked["--mixed-precision"][2]("no")
