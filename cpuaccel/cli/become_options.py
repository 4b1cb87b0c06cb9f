"""Ansible's become flags on ``provision``: ``-b``, ``--become-user``, ``-K``.

Applied as one decorator, so the verb receives a single ``become`` (BecomeFlags) and asks
for the password only when it is about to contact the nodes (not for --list-tasks).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

from cpuaccel.errors import UsageError
from cpuaccel.inventory.variables import user_name_problem
from cpuaccel.playbook.become import CliBecome


@dataclass(frozen=True)
class BecomeFlags:
    become: bool
    user: str | None
    ask_pass: bool

    def settle(self) -> CliBecome:
        """The command line's become, asking once (no echo) for the password with -K."""
        if self.user is not None and user_name_problem(self.user) is not None:
            raise UsageError(
                f"--become-user {user_name_problem(self.user)}",
                hint="give a login name, e.g. --become-user root",
            )
        password = None
        if self.ask_pass:
            if not sys.stdin.isatty():
                raise UsageError(
                    "-K (--ask-become-pass) needs a terminal to ask for the password on",
                    hint="set ansible_become_password in a file given as -e @secrets.yaml "
                    "(mode 0600), or run cpuaccel from a terminal",
                )
            # getpass underneath: read from the terminal with echo off, never an argv.
            password = click.prompt(
                "BECOME password", hide_input=True, default="", show_default=False, err=True
            )
        return CliBecome(self.become, self.user, password or None)


def become_options(command: Callable[..., Any]) -> Callable[..., Any]:
    @click.option(
        "-b",
        "--become",
        "become_flag",
        is_flag=True,
        help="Run tasks as become_user (default root) through sudo, as 'become: true'.",
    )
    @click.option(
        "--become-user",
        metavar="USER",
        help="The user -b or 'become: true' runs tasks as (default root).",
    )
    @click.option(
        "-K",
        "--ask-become-pass",
        is_flag=True,
        help="Ask once (no echo) for sudo's password; or set ansible_become_password.",
    )
    @functools.wraps(command)
    def wrapper(
        *args: Any, become_flag: bool, become_user: str | None, ask_become_pass: bool, **kw: Any
    ) -> Any:
        flags = BecomeFlags(become_flag, become_user, ask_become_pass)
        return command(*args, become=flags, **kw)

    return wrapper
