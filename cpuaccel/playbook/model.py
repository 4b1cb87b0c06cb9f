"""What a playbook is once loaded and validated: plays of tasks, each task one module."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Task:
    """One task: a module with its (not yet rendered) arguments and its keywords."""

    name: str
    module: str
    args: Mapping[str, Any]
    file: str
    line: int
    when: tuple[str, ...] = ()
    register: str | None = None
    changed_when: tuple[str, ...] | None = None
    failed_when: tuple[str, ...] | None = None
    loop: Any = None  # a list, or a Jinja string that renders to one
    loop_var: str = "item"
    tags: frozenset[str] = frozenset()
    ignore_errors: bool = False
    run_once: bool = False
    # Ansible's check_mode: false runs a read-only task even under --check.
    check_mode: bool | None = None
    vars: Mapping[str, Any] = field(default_factory=dict)
    # The become keywords written on the task (become, become_user, become_method).
    become: Mapping[str, Any] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True)
class Play:
    name: str
    hosts: str  # an Ansible host pattern
    tasks: tuple[Task, ...]
    vars: Mapping[str, Any]
    file: str
    line: int
    gather_facts: bool = True
    become: Mapping[str, Any] = field(default_factory=dict)  # as on Task


@dataclass(frozen=True)
class Playbook:
    path: Path
    plays: tuple[Play, ...]

    @property
    def directory(self) -> Path:
        return self.path.parent

    def tasks(self) -> list[Task]:
        return [task for play in self.plays for task in play.tasks]
