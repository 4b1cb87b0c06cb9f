"""``become``: a task's agent runs as another user, through ``sudo`` on the node.

Provisioning system packages needs root while SSH as root is often forbidden, so a play or
task says ``become: true`` (Ansible's keywords: ``become``, ``become_user``, default root,
``become_method``, only ``sudo``). The agent itself is started under sudo: one agent per
(host, become user), so tasks with and without become each talk to the right one and a
task under become costs a message, not a sudo and an interpreter start.

The password is fed to sudo on stdin (``sudo -S``), never in an argv, and only once sudo
has asked for it with cpuaccel's own prompt: what sudo does not read would otherwise be
read by the agent's boot as its program. The agent's boot prints ``SUCCESS`` first, so
the controller knows sudo let it through before it sends the program (Ansible's
``BECOME-SUCCESS`` marker). A wrong password, sudo asking again, or sudo needing a
password that was not given, is one error naming the host, never a hang: every wait is
bounded.

Ansible's precedence: the command line (``-b``, ``--become-user``, ``-K``) < the play's
keywords < the task's < the variables (``ansible_become*``, from the inventory, play or
task ``vars`` or ``-e``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cpuaccel.connectors.base import Process
from cpuaccel.errors import CpuaccelError, HostError
from cpuaccel.inventory import variables as types
from cpuaccel.playbook import templar

# On plays and tasks. become_flags and become_exe only as cpuaccel runs sudo anyway.
KEYWORDS = ("become", "become_user", "become_method", "become_flags", "become_exe")
METHODS = ("sudo", "ansible.builtin.sudo")
DEFAULT_USER = "root"
# Ansible's sudo plugin's variables, the first set one wins.
PASSWORD_VARS = ("ansible_become_password", "ansible_become_pass", "ansible_sudo_pass")
USER_VARS = ("ansible_become_user", "ansible_sudo_user")
FLAG_VARS = {
    "ansible_become_flags": types.sudo_flags,
    "ansible_sudo_flags": types.sudo_flags,
    "ansible_become_exe": types.sudo_exe,
    "ansible_sudo_exe": types.sudo_exe,
}
# sudo -p: a prompt of our own on a line of its own, told apart from anything else sudo
# or PAM prints; SUCCESS is what the agent's boot prints once sudo has started it.
PROMPT = "cpuaccel-become-password:"
SUCCESS = "CPUACCEL-BECOME-SUCCESS"
HANDSHAKE_SECONDS = 30.0
MASK = "********"
PASSWORD_HINT = (
    "give the become password with -K (--ask-become-pass), or set ansible_become_password "
    "(e.g. in a file passed as -e @secrets.yaml)"
)


class BecomeError(HostError):
    """sudo on the node refused (wrong or missing password): the host is reachable but
    failed, so the play counts it failed, not unreachable."""


@dataclass(frozen=True)
class CliBecome:
    """The command line's ``-b``, ``--become-user`` and ``-K``'s password."""

    become: bool = False
    user: str | None = None
    password: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class Become:
    """Run as ``user`` through sudo; ``password`` fed to sudo when it asks."""

    user: str
    password: str | None = field(default=None, repr=False)

    @property
    def secrets(self) -> tuple[str, ...]:
        return (self.password,) if self.password else ()


def _typed(name: str, value: Any, check: types.Check) -> Any:
    try:
        return check(value)
    except types.BadValue as exc:
        # A password's value never reaches a message; other values help the user.
        said = "must be a plain string" if name in PASSWORD_VARS else str(exc)
        raise CpuaccelError(f"{name} {said}", hint=types.hint_for(name)) from None


def _rendered(value: Any, variables: Mapping[str, Any]) -> Any:
    return templar.render(value, variables) if templar.is_template(value) else value


def resolve(
    cli: CliBecome,
    keywords: Sequence[Mapping[str, Any]],
    variables: Mapping[str, Any],
) -> Become | None:
    """The become of one task on one host, or None: the command line, then each
    ``keywords`` mapping (the play's, then the task's: later wins), then the variables.

    Raises CpuaccelError for a value of the wrong type (the password is never shown).
    """
    on: Any = cli.become
    user: Any = cli.user
    method: Any = None
    for given in keywords:
        on = given.get("become", on)
        user = given.get("become_user", user)
        method = given.get("become_method", method)
    on = variables.get("ansible_become", on)
    user = next((variables[n] for n in USER_VARS if variables.get(n) is not None), user)
    method = variables.get("ansible_become_method", method)
    if not _typed("become", _rendered(on, variables), types.boolean):
        return None
    for name, check in FLAG_VARS.items():  # play or task vars: the inventory's are checked
        if variables.get(name) is not None:
            _typed(name, _rendered(variables[name], variables), check)
    method = _rendered(method, variables)
    if method is not None and method not in METHODS:
        raise CpuaccelError(
            f"become_method {method!r} is not supported",
            hint="cpuaccel becomes another user with sudo only: become_method: sudo",
        )
    user = _typed("become_user", _rendered(user, variables) or DEFAULT_USER, types.user_name)
    password = next((variables[n] for n in PASSWORD_VARS if variables.get(n) is not None), None)
    if password is not None:
        password = _typed("ansible_become_password", _rendered(password, variables), types.secret)
    return Become(str(user), password or cli.password)


def check_keywords(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The become keywords of a play or task, checked when the playbook loads.

    Raises KeywordError naming the keyword. A ``{{ template }}`` is checked once rendered.
    """
    given = {key: raw[key] for key in KEYWORDS if key in raw}
    for key, value in given.items():
        if templar.is_template(value) and key != "become_method":
            continue
        if key == "become" and types.parse_bool(value) is None:
            raise KeywordError(key, f"must be true or false, got {value!r}", "write 'become: true'")
        if key == "become_user" and types.user_name_problem(value) is not None:
            raise KeywordError(
                key, f"is {types.user_name_problem(value)}", "write e.g. 'become_user: root'"
            )
        if key in ("become_flags", "become_exe"):
            check = types.sudo_flags if key == "become_flags" else types.sudo_exe
            try:
                check(value)
            except types.BadValue as exc:
                raise KeywordError(key, str(exc), f"remove '{key}:'") from None
        if key == "become_method" and value not in METHODS:
            raise KeywordError(
                key,
                f"{value!r} is not supported",
                "cpuaccel becomes another user with sudo only: write 'become_method: sudo' "
                "or leave it out",
            )
    if "become" in given and not templar.is_template(given["become"]):
        given["become"] = types.parse_bool(given["become"])
    return {key: value for key, value in given.items() if key in KEYWORDS[:3]}


class KeywordError(ValueError):
    def __init__(self, key: str, message: str, hint: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key
        self.hint = hint


def remember(known: set[str], *values: Any) -> list[str]:
    """Add the set ``values`` to ``known``; all of them, longest first, for :func:`mask`."""
    known.update(str(v) for v in values if v not in (None, ""))
    return sorted(known, key=len, reverse=True)


def mask(value: Any, secrets: Sequence[str]) -> Any:
    """``value`` with every occurrence of a secret replaced by MASK (strings in lists
    and mappings too): task output that echoes a password shows the mask instead."""
    if not secrets:
        return value
    if isinstance(value, str):
        for one in secrets:
            value = value.replace(one, MASK)
        return value
    if isinstance(value, dict):
        return {k: mask(v, secrets) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [mask(v, secrets) for v in value]
    return value


def sudo_argv(become: Become, command: Sequence[str]) -> list[str]:
    """``command`` run as the become user. Without a password ``-n``: sudo then fails
    at once with "a password is required" instead of waiting for one."""
    if become.password is None:
        return ["sudo", "-H", "-n", "-u", become.user, "--", *command]
    return ["sudo", "-H", "-S", "-p", PROMPT + "\n", "-u", become.user, "--", *command]


def marked_boot(boot: str) -> str:
    """The agent's boot, printing SUCCESS before it reads its program from stdin."""
    return f"import sys;sys.stdout.write({SUCCESS!r}+chr(10));sys.stdout.flush();{boot}"


def handshake(
    process: Process,
    lines: Iterator[tuple[str, str]],
    host: str,
    become: Become,
    *,
    timeout: float = HANDSHAKE_SECONDS,
) -> None:
    """Wait until sudo has started the agent as the become user, feeding it the password
    when it asks; raise BecomeError or HostError (with sudo's words, masked) otherwise.

    The wait is bounded: past ``timeout`` the process is closed, which ends ``lines``.
    """
    fired = threading.Event()

    def expire() -> None:
        fired.set()
        process.close()

    timer = threading.Timer(timeout, expire)
    timer.daemon = True
    timer.start()
    told: list[str] = []
    try:
        reason = _converse(process, lines, host, become, told)
    finally:
        timer.cancel()
    if reason is None:
        return
    if fired.is_set():
        reason = "timeout"
    raise _failure(host, become, reason, told)


def _converse(
    process: Process,
    lines: Iterator[tuple[str, str]],
    host: str,
    become: Become,
    told: list[str],
) -> str | None:
    """None once the agent runs, else why not: "wrong", "needs", "ended"."""
    asked = False
    for stream, line in lines:
        text = line.strip()
        if stream == "out" and text == SUCCESS:
            return None
        if stream == "err" and text == PROMPT:
            if asked or become.password is None:
                return "wrong"  # sudo asks again: the password it was given is wrong
            asked = True
            try:
                process.send(become.password.encode() + b"\n")
            except (OSError, ValueError):
                return "ended"
            continue
        if "Sorry, try again" in text or "incorrect password" in text:
            return "wrong"
        if "a password is required" in text:
            return "needs"
        if text:
            told.append(mask(text, become.secrets))
    return "ended"


def _failure(host: str, become: Become, reason: str, told: list[str]) -> HostError:
    to = f"sudo to {become.user}"
    if reason == "wrong":
        return BecomeError(host, f"{to}: the become password is wrong", hint=PASSWORD_HINT)
    if reason == "needs":
        return BecomeError(
            host, f"{to}: sudo asks for a password and none was given", hint=PASSWORD_HINT
        )
    if reason == "timeout":
        return BecomeError(
            host,
            f"{to}: sudo did not start the agent within {HANDSHAKE_SECONDS:g} s",
            hint="check sudo on the node (a passprompt_override or requiretty in sudoers "
            "keeps cpuaccel from answering it)",
        )
    last = told[-1] if told else "no message"
    if "not found" in last and "sudo" in last:
        return BecomeError(host, f"{to}: sudo is not installed on the node", hint="install sudo")
    return BecomeError(
        host, f"{to} failed: {last}", hint="check the user's sudo rights on the node"
    )
