"""become: the keywords, the flags, the variables, sudo's conversation and the masking.

tests/cluster/test_become.py runs it for real with a non-root SSH user whose sudo needs
a password; these run anywhere (the local one needs root and sudo)."""

from __future__ import annotations

import json
import os
import queue
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cpuaccel import node
from cpuaccel.connectors.base import Process
from cpuaccel.errors import EXIT_NODE_FAILED, EXIT_OK, EXIT_USAGE, CpuaccelError, HostError
from cpuaccel.playbook import become, loader
from cpuaccel.playbook.become import Become, BecomeError, CliBecome
from cpuaccel.playbook.session import AgentSession
from testsupport.command import cpuaccel

SECRET = "pw-S3cret-b35"


# -- precedence: command line < play < task < variables --------------------------------


def test_off_unless_asked() -> None:
    assert become.resolve(CliBecome(), ({}, {}), {}) is None


def test_the_command_line_then_play_then_task_then_variables() -> None:
    cli = CliBecome(become=True, user="admin", password="cli-pw")
    assert become.resolve(cli, ({}, {}), {}) == Become("admin", "cli-pw")
    play = {"become": True, "become_user": "postgres"}
    assert become.resolve(CliBecome(), (play, {}), {}) == Become("postgres", None)
    # The task's keyword wins over the play's: become: false turns it off for one task.
    assert become.resolve(cli, (play, {"become": False}), {}) is None
    assert become.resolve(CliBecome(), (play, {"become_user": "www"}), {}).user == "www"  # type: ignore[union-attr]
    # Ansible: a variable wins over any keyword, and the password variable over -K's.
    variables = {"ansible_become": "yes", "ansible_become_user": "svc", "ansible_become_pass": 7}
    assert become.resolve(cli, ({"become": False}, {}), variables) == Become("svc", "7")


def test_the_sudo_plugins_other_names() -> None:
    variables = {
        "ansible_become_method": "ansible.builtin.sudo",
        "ansible_sudo_user": "svc",
        "ansible_sudo_pass": SECRET,
        "ansible_become_flags": "-H -S -n",  # Ansible's default: what cpuaccel does anyway
        "ansible_sudo_exe": "/usr/bin/sudo",
    }
    assert become.resolve(CliBecome(True), ({}, {}), variables) == Become("svc", SECRET)
    with pytest.raises(CpuaccelError, match="ansible_sudo_flags has '-E'"):
        become.resolve(CliBecome(True), ({}, {}), {"ansible_sudo_flags": "-H -E"})


def test_become_user_defaults_to_root_and_templates_render() -> None:
    found = become.resolve(
        CliBecome(),
        ({"become": "{{ use_sudo }}"}, {"become_user": "{{ who }}"}),
        {"use_sudo": True, "who": "nobody"},
    )
    assert found == Become("nobody", None)
    assert become.resolve(CliBecome(become=True), ({}, {}), {}) == Become("root", None)


@pytest.mark.parametrize(
    ("variables", "says"),
    [
        ({"ansible_become_method": "su"}, "become_method 'su' is not supported"),
        ({"ansible_become": "maybe"}, "become must be true or false"),
        ({"ansible_become_user": "a b"}, "become_user is 'a b', not a login name"),
    ],
)
def test_bad_values_from_play_or_task_vars(variables: dict[str, Any], says: str) -> None:
    with pytest.raises(CpuaccelError, match=says):
        become.resolve(CliBecome(become=True), ({}, {}), variables)


def test_a_bad_password_value_is_never_shown() -> None:
    with pytest.raises(CpuaccelError) as caught:
        become.resolve(CliBecome(True), ({}, {}), {"ansible_become_password": [SECRET]})
    assert "must be a plain string" in str(caught.value)
    assert SECRET not in str(caught.value)


# -- sudo's argv and the masking -----------------------------------------------------


def test_the_password_is_never_in_the_argv() -> None:
    argv = become.sudo_argv(Become("root", SECRET), ["python3", "-c", "x"])
    assert argv[:3] == ["sudo", "-H", "-S"]
    assert argv[argv.index("-p") + 1] == become.PROMPT + "\n"
    assert argv[-4:] == ["--", "python3", "-c", "x"]
    assert not any(SECRET in word for word in argv)
    # Without a password sudo must not wait for one: -n fails at once instead.
    assert "-n" in become.sudo_argv(Become("root"), ["true"])
    assert repr(Become("root", SECRET)).count(SECRET) == 0


def test_mask_reaches_nested_results() -> None:
    result = {"stdout": f"x{SECRET}y", "results": [{"msg": SECRET}], "rc": 0}
    assert become.mask(result, [SECRET]) == {
        "stdout": f"x{become.MASK}y",
        "results": [{"msg": become.MASK}],
        "rc": 0,
    }


# -- sudo's conversation, with a scripted process --------------------------------------


class Sudo(Process):
    """sudo as the controller sees it: ``script`` maps what it reads to what it says."""

    def __init__(self, first: list[tuple[str, str]], answers: dict[bytes, list[tuple[str, str]]]):
        self.sent: list[bytes] = []
        self.closed = False
        self._answers = answers
        self._queue: queue.Queue[tuple[str, str] | None] = queue.Queue()
        for item in first:
            self._queue.put(item)

    def lines(self) -> Iterator[tuple[str, str]]:
        while (item := self._queue.get()) is not None:
            yield item

    def wait(self, timeout: float | None = None) -> int:
        return 0

    def send(self, data: bytes) -> None:
        if self.closed:
            raise BrokenPipeError("closed")
        self.sent.append(data)
        for item in self._answers.get(data, []):
            self._queue.put(item)

    def close(self) -> None:
        self.closed = True
        self._queue.put(None)


PROMPT = ("err", become.PROMPT)
OK = ("out", become.SUCCESS)


def test_the_password_is_sent_only_when_sudo_asks() -> None:
    sudo = Sudo([PROMPT], {f"{SECRET}\n".encode(): [OK]})
    become.handshake(sudo, sudo.lines(), "node1", Become("root", SECRET))
    assert sudo.sent == [f"{SECRET}\n".encode()]


def test_no_prompt_no_password() -> None:
    # NOPASSWD, or sudo's cached credentials: the password must not be read as a program.
    sudo = Sudo([OK], {})
    become.handshake(sudo, sudo.lines(), "node1", Become("root", SECRET))
    assert sudo.sent == []


@pytest.mark.parametrize(
    ("after", "says"),
    [
        ([("err", "Sorry, try again."), PROMPT], "the become password is wrong"),
        ([PROMPT], "the become password is wrong"),  # asked again, without the apology
    ],
)
def test_a_wrong_password_is_one_error_naming_the_host(
    after: list[tuple[str, str]], says: str
) -> None:
    sudo = Sudo([PROMPT], {f"{SECRET}\n".encode(): after})
    with pytest.raises(BecomeError) as caught:
        become.handshake(sudo, sudo.lines(), "node7", Become("root", SECRET))
    assert str(caught.value).startswith(f"node7: sudo to root: {says}")
    assert "-K" in str(caught.value) and "ansible_become_password" in str(caught.value)
    assert sudo.sent == [f"{SECRET}\n".encode()]  # tried once, never again


def test_a_missing_password_is_said_at_once() -> None:
    sudo = Sudo([("err", "sudo: a password is required")], {})
    with pytest.raises(BecomeError, match="node2: sudo to root: sudo asks for a password"):
        become.handshake(sudo, sudo.lines(), "node2", Become("root"))


def test_sudo_that_never_answers_is_a_bounded_wait() -> None:
    sudo = Sudo([("err", "Password for the moon:")], {})  # a prompt cpuaccel cannot know
    started = time.monotonic()
    with pytest.raises(BecomeError, match="did not start the agent within"):
        become.handshake(sudo, sudo.lines(), "node3", Become("root", SECRET), timeout=0.3)
    assert time.monotonic() - started < 5
    assert sudo.closed and sudo.sent == []


def test_sudos_own_words_are_masked() -> None:
    sudo = Sudo([("err", f"sudo: weird {SECRET}"), ("err", "sudo: unable to run")], {})
    sudo.close()
    with pytest.raises(HostError) as caught:
        become.handshake(sudo, sudo.lines(), "node1", Become("root", SECRET))
    assert "sudo: unable to run" in str(caught.value) and SECRET not in str(caught.value)


class FakeConnector:
    """A Connector's start() only: what the agent session is given."""

    def __init__(self, process: Sudo) -> None:
        self.process = process
        self.argv: list[str] = []
        self.host = type("H", (), {"name": "node1"})()

    def start(self, argv: list[str]) -> Sudo:
        self.argv = list(argv)
        return self.process


def test_the_agent_program_follows_sudos_success_only() -> None:
    hello = ("out", json.dumps({"ready": True}))
    sudo = Sudo([PROMPT], {f"{SECRET}\n".encode(): [OK]})
    sudo._answers[node.program("agent")] = [hello]
    conn = FakeConnector(sudo)
    session = AgentSession(conn, "python3", Become("root", SECRET))  # type: ignore[arg-type]
    assert sudo.sent == [f"{SECRET}\n".encode(), node.program("agent")]
    assert conn.argv[:2] == ["sudo", "-H"] and become.SUCCESS in conn.argv[-2]
    assert session.info == {"ready": True}


def test_an_agent_line_nested_too_deep_is_set_aside_not_a_recursion() -> None:
    """A line of "[" x 3000 on the agent's channel (a login script, a hostile node):
    json's parser recursed into a RecursionError; now the line is left out, said why."""
    hello = ("out", json.dumps({"ready": True}))
    agent = Sudo([], {node.program("agent"): [("out", "[" * 3000), hello]})
    session = AgentSession(FakeConnector(agent), "python3")  # type: ignore[arg-type]
    assert session.info == {"ready": True}
    assert list(session._stderr) == [
        "(a line of the agent's output refused: values nested more than 200 levels deep)"
    ]


# -- the playbook's keywords -------------------------------------------------------------


def test_keywords_on_plays_and_tasks(tmp_path: Path) -> None:
    path = tmp_path / "site.yaml"
    path.write_text(
        "- hosts: all\n  become: yes\n  become_user: postgres\n  tasks:\n"
        "    - command: id\n      become: false\n"
        "    - command: id\n      become_method: sudo\n"
        "    - command: id\n      become_flags: -H -S -n\n      become_exe: sudo\n"
    )
    play = loader.load(path).plays[0]
    assert play.become == {"become": True, "become_user": "postgres"}
    assert play.tasks[0].become == {"become": False}
    assert play.tasks[1].become == {"become_method": "sudo"}
    assert play.tasks[2].become == {}  # accepted: what cpuaccel's sudo does anyway


# -- the command line ------------------------------------------------------------------


def _playbook(tmp_path: Path) -> Path:
    path = tmp_path / "site.yaml"
    path.write_text("- hosts: all\n  gather_facts: false\n  tasks:\n    - debug: {msg: hi}\n")
    return path


def test_ask_become_pass_without_a_terminal_is_refused(tmp_path: Path) -> None:
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text("all:\n  hosts:\n    here: {ansible_connection: local}\n")
    done = cpuaccel("provision", str(inventory), "--playbook", str(_playbook(tmp_path)), "-K")
    assert done.returncode == EXIT_USAGE, done.stderr
    assert "error: -K (--ask-become-pass) needs a terminal" in done.stderr
    assert "ansible_become_password" in done.stderr


def test_a_bad_become_user_flag_is_refused(tmp_path: Path) -> None:
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text("all:\n  hosts:\n    here: {ansible_connection: local}\n")
    argv = ["provision", str(inventory), "--playbook", str(_playbook(tmp_path))]
    done = cpuaccel(*argv, "-b", "--become-user", "-rf")
    assert done.returncode == EXIT_USAGE, done.stderr
    assert "--become-user '-rf', not a login name" in done.stderr


def test_an_inventory_password_never_shows_in_a_message(tmp_path: Path) -> None:
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(
        "all:\n  hosts:\n    n1:\n      ansible_become_pass: {nested: " + SECRET + "}\n"
    )
    done = cpuaccel("config", "show", "-i", str(inventory))
    assert done.returncode == EXIT_USAGE
    assert f"{inventory}:4" in done.stderr and "ansible_become_pass must be a plain" in done.stderr
    assert SECRET not in done.stdout + done.stderr


# -- for real on this machine: sudo from root to nobody --------------------------------

NEEDS_ROOT_SUDO = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("sudo") is None, reason="needs root and sudo"
)


@NEEDS_ROOT_SUDO
def test_local_tasks_run_as_the_become_user_and_the_password_is_masked(tmp_path: Path) -> None:
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(
        "all:\n  hosts:\n    here: {ansible_connection: local, "
        "ansible_python_interpreter: /usr/bin/python3}\n"
    )
    (tmp_path / "secret.yaml").write_text(f"ansible_become_password: {SECRET}\n")
    playbook = tmp_path / "site.yaml"
    playbook.write_text(
        "- hosts: all\n  gather_facts: false\n  become: true\n  become_user: nobody\n"
        "  tasks:\n"
        "    - {command: id -un, register: who}\n"
        "    - {command: id -un, become: false, register: me}\n"
        "    - {command: 'echo {{ ansible_become_password }}', register: echoed}\n"
        "    - assert: {that: [\"who.stdout == 'nobody'\", \"me.stdout == 'root'\"]}\n"
    )
    done = cpuaccel(
        "provision", str(inventory), "--playbook", str(playbook),
        "-e", f"@{tmp_path / 'secret.yaml'}", "--json",
    )  # fmt: skip
    assert done.returncode == EXIT_OK, done.stdout + done.stderr
    assert SECRET not in done.stdout + done.stderr
    tasks = json.loads(done.stdout)["plays"][0]["tasks"]
    assert tasks[2]["hosts"]["here"]["stdout"] == become.MASK


@NEEDS_ROOT_SUDO
def test_local_become_method_from_an_extra_var_is_refused_per_host(tmp_path: Path) -> None:
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text("all:\n  hosts:\n    here: {ansible_connection: local}\n")
    playbook = tmp_path / "site.yaml"
    playbook.write_text(
        "- hosts: all\n  gather_facts: false\n  tasks:\n"
        "    - command: id\n      become: true\n      vars: {ansible_become_method: doas}\n"
    )
    done = cpuaccel("provision", str(inventory), "--playbook", str(playbook))
    assert done.returncode == EXIT_NODE_FAILED
    assert f"{playbook}:4: become_method 'doas' is not supported" in done.stdout
