"""What a playbook run prints: a compact line per task as it ends, then Ansible's recap.

One line per task keeps a 40-task run on one screen: the counts, then the hosts that
changed or failed (failures with their message). ``-v`` lists every host with its
result's message (-vv and -vvv add the connectors' lines, see ui.py); ``--diff``
prints the text diff of copy and template. On a terminal a bar shows the hosts that
have finished the current task.
"""

from __future__ import annotations

import difflib
import json
import shlex
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack

from rich.console import Console

from cpuaccel import ui
from cpuaccel.playbook.actions import Result
from cpuaccel.playbook.loader import Play, Task
from cpuaccel.playbook.strategy import HostStats, Listener, status_of
from cpuaccel.ui import escape

_STYLE = {
    "ok": "green",
    "changed": "yellow",
    "failed": "bold red",
    "unreachable": "bold red",
    "skipped": "cyan",
    "ignored": "magenta",
}
_ORDER = ("ok", "changed", "skipped", "ignored", "failed", "unreachable")


def _diff_text(result: Result) -> list[str]:
    diff = result.get("diff")
    if not isinstance(diff, dict):
        return []
    if diff.get("binary"):
        return ["(binary or large file: no text diff)"]
    before, after = diff.get("before"), diff.get("after")
    if isinstance(before, str) and isinstance(after, str):
        header = str(diff.get("after_header") or "")
        return list(
            difflib.unified_diff(
                before.splitlines(),
                after.splitlines(),
                f"before: {header}",
                f"after: {header}",
                lineterm="",
            )
        )
    if isinstance(before, dict) and isinstance(after, dict) and before != after:
        return [f"- {json.dumps(before, sort_keys=True)}", f"+ {json.dumps(after, sort_keys=True)}"]
    return []


def _message(result: Result) -> str:
    msg = str(result.get("msg") or "").strip()
    stderr = str(result.get("stderr") or "").strip()
    if stderr and (not msg or msg == "non-zero return code"):
        msg = f"{msg}: {stderr.splitlines()[-1]}" if msg else stderr.splitlines()[-1]
    if result.get("hint"):
        msg += f" (fix: {result['hint']})"
    return msg or "failed"


class ProgressBar(Listener):
    """A bar on a terminal's stderr while a task runs, and nothing else (--json)."""

    def __init__(self) -> None:
        self._stack: ExitStack | None = None
        self._tracker: ui.Tracker | None = None

    def task_start(self, task: Task | None, title: str, hosts: Sequence[str]) -> None:
        self._stack = ExitStack()
        self._tracker = self._stack.enter_context(ui.progress(f"TASK [{title}]", len(hosts)))

    def host_progress(self, host: str) -> None:
        if self._tracker is not None:
            self._tracker.advance(host)

    def transfer(self, description: str) -> Callable[[int, int], None]:
        if self._tracker is None:
            return super().transfer(description)
        return self._tracker.transfer(description)

    def task_end(self, task: Task | None, title: str, results: Mapping[str, Result]) -> None:
        if self._stack is not None:
            self._stack.close()
            self._stack = self._tracker = None


def _command_text(result: Result) -> str | None:
    """-vv: the command a command/shell/pip task ran on the node, and its exit code."""
    cmd = result.get("cmd")
    if not cmd:
        return None
    text = shlex.join(str(word) for word in cmd) if isinstance(cmd, list) else str(cmd)
    rc = result.get("rc")
    return f"$ {text}" + (f"  (exit {rc})" if rc is not None else "")


class Display(ProgressBar):
    def __init__(
        self, console: Console, *, verbose: bool = False, diff: bool = False, commands: bool = False
    ) -> None:
        super().__init__()
        self.console = console
        self.verbose = verbose
        self.diff = diff
        self.commands = commands  # -vv
        self._notes: list[str] = []

    def note(self, text: str) -> None:
        self._notes.append(text)  # printed under the task's line, once the bar is gone

    def play_start(self, play: Play, hosts: Sequence[str]) -> None:
        self.console.print(
            f"[bold]{escape(f'PLAY [{play.name}]')}[/] {len(hosts)} host{'s' * (len(hosts) != 1)}"
        )

    def task_end(self, task: Task | None, title: str, results: Mapping[str, Result]) -> None:
        super().task_end(task, title, results)  # the bar goes before the line is printed
        statuses = {host: status_of(r) for host, r in results.items()}
        counts = Counter(statuses.values())
        worst = next((s for s in reversed(_ORDER) if counts.get(s)), "ok")
        summary = " ".join(f"[{_STYLE[s]}]{s}={counts[s]}[/]" for s in _ORDER if counts.get(s))
        self.console.print(
            f"  [{_STYLE[worst]}]{worst:<11}[/] {escape(f'TASK [{title}]')}  {summary}", markup=True
        )
        for text in self._notes:
            self.console.print(f"      [yellow]note[/]: {escape(text)}")
        self._notes.clear()
        for host, result in results.items():
            status = statuses[host]
            if status in ("failed", "unreachable", "ignored"):
                style, why = _STYLE[status], escape(_message(result))
                self.console.print(f"      [{style}]{status}: {escape(host)}[/]: {why}")
            elif status == "changed" or self.verbose:
                detail = ""
                # -v: the result's message, else the last line a command printed.
                output = str(result.get("stdout") or "").strip().splitlines()
                said = str(result.get("msg") or "") or (output[-1] if output else "")
                if self.verbose and said:
                    detail = f": {said}"
                self.console.print(f"      {status}: {escape(host)}{escape(str(detail))}")
            command = _command_text(result) if self.commands else None
            if command:
                self.console.print(f"        [dim]{escape(command)}[/]")
            if self.diff and result.get("changed"):
                for line in _diff_text(result):
                    style = (
                        "green" if line.startswith("+") else "red" if line.startswith("-") else ""
                    )
                    text = escape(line)
                    self.console.print(
                        f"        [{style}]{text}[/]" if style else f"        {text}"
                    )

    def recap(self, stats: Mapping[str, HostStats], seconds: float) -> None:
        self.console.print("\n[bold]PLAY RECAP[/]")
        width = max((len(name) for name in stats), default=0)
        for name, s in stats.items():
            style = "red" if not s.succeeded else "yellow" if s.changed else "green"
            self.console.print(f"[{style}]{escape(f'{name:<{width}}')}[/] : {s.line()}")
        self.console.print(f"({seconds:.1f} s)")
