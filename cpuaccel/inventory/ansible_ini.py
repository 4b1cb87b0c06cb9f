"""An Ansible INI inventory (Ansible's default format), read line by line into an
InventoryBuilder.

The rules are those of Ansible's ``ini`` inventory plugin
(lib/ansible/plugins/inventory/ini.py), so that an inventory written for Ansible gives
the same hosts, groups and variables here:

- hosts before any section are in group ``ungrouped``; ``[group]`` lists hosts, each
  ``name``, ``name:port``, a range (``node[01:20]``, ``rack[a:f]``, ``n[0:10:2]``), then
  ``key=value`` words split as a shell would (quotes keep spaces, ``#`` ends the line);
- ``[group:vars]`` holds one ``key = value`` a line (everything after the first ``=``);
- ``[group:children]`` names child groups, which must be declared somewhere in the file
  by a ``[child]`` or ``[child:children]`` section, as must a ``[group:vars]``'s group;
- every value is read as a Python literal where it is one (``8080``, ``True``,
  ``[1, 2]``, ``'a b'``), else kept as the text written (``FALSE``, ``0755``): Ansible's
  ``ast.literal_eval``; lines starting with ``#`` or ``;`` are comments.

Where Ansible refuses a line, so does this reader, naming file:line. Unlike Ansible, a
host listed twice with different values for one variable is an error (as in a YAML
inventory, see ``InventoryBuilder.add_host``): Ansible keeps the last silently.
"""

from __future__ import annotations

import ast
import re
import shlex
import warnings
from dataclasses import dataclass, field
from typing import Any

from cpuaccel.errors import InventoryError
from cpuaccel.inventory.builder import GroupDraft, InventoryBuilder, Origin
from cpuaccel.inventory.patterns import parse_host_key
from cpuaccel.inventory.variables import host_name_problem

COMMENT_MARKERS = ("#", ";")
SECTION_KINDS = ("hosts", "vars", "children")
PRIORITY_VAR = "ansible_group_priority"
# Ansible's own patterns: a section is [name] or [name:kind], a comment may follow.
SECTION = re.compile(r"^\[([^:\]\s]+)(?::(\w+))?\]\s*(?:#.*)?$")
GROUP_NAME = re.compile(r"^([^:\]\s]+)\s*(?:#.*)?$")
# Literal types Ansible keeps that a YAML inventory cannot hold: refused, not misread.
_FOREIGN = (bytes, complex, set, frozenset)
_HOST_HINT = (
    "write a host as NAME, NAME:PORT or a range such as node[01:20], followed by "
    "key=value words (quote a value holding spaces: key='a b')"
)


def first_line(text: str) -> str:
    """The first line that is neither blank nor a comment."""
    for raw in text.splitlines():
        line = raw.strip()
        if line and line[0] not in COMMENT_MARKERS:
            return line
    return ""


def starts_with_section(text: str) -> bool:
    """True when the first significant line is an INI ``[section]`` (no YAML inventory
    starts so: its top level is a mapping)."""
    return SECTION.match(first_line(text)) is not None


def parse_value(raw: str) -> Any:
    """A value as Ansible reads it: a Python literal where ``raw`` is one, else the text."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            return ast.literal_eval(raw)
    except (ValueError, SyntaxError, TypeError):
        return raw
    except (RecursionError, MemoryError):
        return _TOO_DEEP


_TOO_DEEP = object()


def read_ini(text: str, source: str | None) -> InventoryBuilder:
    """The groups and hosts of an Ansible INI inventory, ready to be merged."""
    return _IniReader(source).read(text)


@dataclass
class _Pending:
    """A group a [x:vars] or [x:children] section needs declared, and where."""

    line: int
    message: str
    hint: str


@dataclass
class _IniReader:
    source: str | None
    built: InventoryBuilder = field(init=False)
    declared: set[str] = field(default_factory=lambda: {"all", "ungrouped"})
    pending: dict[str, _Pending] = field(default_factory=dict)
    # Child groups named before any section of theirs: the parents (and the lines naming
    # them) that take each as a child once it is declared, as Ansible adds them then.
    waiting: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    lineno: int = 0

    def __post_init__(self) -> None:
        self.built = InventoryBuilder(self.source)

    def error(self, message: str, hint: str, line: int | None = None) -> InventoryError:
        at = self.lineno if line is None else line
        return InventoryError(message, source=self.source, line=at, hint=hint)

    def read(self, text: str) -> InventoryBuilder:
        group, kind = "ungrouped", "hosts"
        for self.lineno, raw in enumerate(text.splitlines(), start=1):
            line = raw.strip()
            if not line or line[0] in COMMENT_MARKERS:
                continue
            section = SECTION.match(line)
            if section is not None:
                group, kind = self.section(section.group(1), section.group(2) or "hosts")
            elif line.startswith("[") and line.endswith("]"):
                raise self.error(
                    f"invalid section {line!r}",
                    "write a section as [group], [group:vars] or [group:children], with no "
                    "spaces inside the brackets",
                )
            elif kind == "hosts":
                self.host_line(self.built.group(group, self.lineno), line)
            elif kind == "vars":
                self.vars_line(self.built.group(group, self.lineno), line)
            else:
                self.child_line(self.built.group(group, self.lineno), line)
        self.reconcile_ungrouped()
        if self.pending:
            first = min(self.pending.values(), key=lambda p: p.line)
            raise self.error(first.message, first.hint, first.line)
        if not self.built.hosts:
            raise self.error(
                "the inventory defines no hosts",
                "list hosts one a line, under a [group] section or before any section",
                1,
            )
        return self.built

    def reconcile_ungrouped(self) -> None:
        """As Ansible: a host listed before the sections and in a group too is not in
        ``ungrouped`` (whose vars then do not apply to it)."""
        ungrouped = self.built.groups.get("ungrouped")
        if ungrouped is None:
            return
        for name in list(ungrouped.hosts):
            host = self.built.hosts[name]
            if set(host.groups) - {"all", "ungrouped"}:
                ungrouped.hosts.remove(name)
                host.groups.remove("ungrouped")

    def section(self, name: str, kind: str) -> tuple[str, str]:
        if kind not in SECTION_KINDS:
            raise self.error(
                f"section [{name}:{kind}] has unknown type {kind!r}",
                f"write [{name}] for its hosts, [{name}:vars] for its variables or "
                f"[{name}:children] for its child groups",
            )
        draft = self.built.group(name, self.lineno)
        if draft.line is None:  # "all" exists before it is written
            draft.line = self.lineno
        if kind == "vars":
            if name not in self.declared:
                self.pending.setdefault(
                    name,
                    _Pending(
                        self.lineno,
                        f"section [{name}:vars] is for group {name!r}, which is not declared",
                        f"add a [{name}] section listing its hosts (or [{name}:children]), "
                        "or fix the group's name",
                    ),
                )
        else:
            self.declared.add(name)
            self.pending.pop(name, None)
            for parent, line in self.waiting.pop(name, []):
                self.built.groups[parent].children.setdefault(name, line)
        return name, kind

    def host_line(self, group: GroupDraft, line: str) -> None:
        try:
            words = shlex.split(line, comments=True)
        except ValueError as exc:
            raise self.error(f"cannot read host line {line!r}: {exc}", _HOST_HINT) from None
        if not words:  # "node1" hidden behind a comment start: nothing to add
            return
        names, port = self.host_names(words[0])
        host_vars: dict[str, Any] = {}
        origins: dict[str, Origin] = {}
        if port is not None:
            host_vars["ansible_port"] = port
            origins["ansible_port"] = Origin(self.source, self.lineno)
        for word in words[1:]:
            key, sep, raw = word.partition("=")
            if not sep:
                raise self.error(
                    f"expected key=value after host {words[0]!r}, got {word!r}", _HOST_HINT
                )
            host_vars[self.var_name(key)] = self.value(key, raw)
            origins[key] = Origin(self.source, self.lineno)
        for name in names:
            self.built.add_host(group, name, host_vars, origins)

    def host_names(self, pattern: str) -> tuple[list[str], int | None]:
        if pattern == "---":
            raise self.error(
                "'---' is not a host: this looks like a YAML file",
                "name the file .yaml (an INI inventory has no '---' line)",
            )
        try:
            names, port = parse_host_key(pattern)
        except InventoryError as exc:
            raise self.error(exc.message, exc.hint or _HOST_HINT) from None
        if pattern.endswith(":") and port is None:
            raise self.error(
                f"host {pattern!r} ends in ':' with no port",
                "write NAME:PORT (e.g. node1:2222), or the name alone",
            )
        for name in names:
            problem = host_name_problem(name)
            if problem is not None:
                raise self.error(
                    f"host {problem}",
                    "name each host as ssh knows it (node1, node1.example.org, 10.0.0.2), "
                    "or give it an alias here and its address in ansible_host=",
                )
        return names, port

    def vars_line(self, group: GroupDraft, line: str) -> None:
        key, sep, raw = line.partition("=")
        if not sep:
            raise self.error(
                f"expected key=value in [{group.name}:vars], got {line!r}",
                "write one NAME=value a line in a :vars section",
            )
        key = self.var_name(key.strip())
        value = self.value(key, raw.strip())
        at = Origin(self.source, self.lineno)
        if key == PRIORITY_VAR:
            if isinstance(value, bool) or not isinstance(value, int):
                raise self.error(
                    f"{PRIORITY_VAR} must be an integer, got {value!r}",
                    f"write e.g. {PRIORITY_VAR}=10 (higher wins among groups of the same depth)",
                )
            group.priority = value
            return
        group.vars[key] = value
        group.origins[key] = at

    def child_line(self, group: GroupDraft, line: str) -> None:
        match = GROUP_NAME.match(line)
        if match is None:
            raise self.error(
                f"expected a group name in [{group.name}:children], got {line!r}",
                "write one child group name a line (hosts belong in a [group] section)",
            )
        child = match.group(1)
        if child == "all":
            raise self.error(
                f"'all' cannot be a child group of {group.name!r}",
                "'all' contains every group already",
            )
        if child in self.built.groups or child == "ungrouped":
            group.children.setdefault(child, self.lineno)
            self.built.group(child, self.lineno)
        else:
            # Ansible adds a child group not yet in the file when its section comes:
            # that moment sets its place among the parent's children, and the groups'.
            self.waiting.setdefault(child, []).append((group.name, self.lineno))
        if child not in self.declared:
            self.pending.setdefault(
                child,
                _Pending(
                    self.lineno,
                    f"[{group.name}:children] names group {child!r}, which is not declared",
                    f"add a [{child}] section listing its hosts (or [{child}:children]), "
                    "or fix the group's name",
                ),
            )

    def var_name(self, name: str) -> str:
        if not name.isidentifier():
            raise self.error(
                f"invalid variable name {name!r}",
                "variable names use letters, digits and '_', and do not start with a digit",
            )
        return name

    def value(self, name: str, raw: str) -> Any:
        value = parse_value(raw)
        if value is _TOO_DEEP:
            raise self.error(f"the value of {name} is nested too deeply", "write a flatter value")
        if isinstance(value, tuple):
            return list(value)  # what a YAML inventory (and Ansible's JSON) holds
        if isinstance(value, _FOREIGN):
            raise self.error(
                f"the value of {name} is a Python {type(value).__name__}, which an "
                "inventory cannot hold",
                f'quote it to keep the text: {name}="{raw}"',
            )
        return value
