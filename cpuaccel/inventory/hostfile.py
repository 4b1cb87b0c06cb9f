"""A plain MPI hostfile standing in for an inventory (``-i hostfile``).

Users who followed the Accelerate guide already have one: a host per line, as Intel MPI
and MPICH (``host``, ``host:slots``) or Open MPI (``host slots=N``) read it, with ``#``
comments. It says nothing about SSH, so connection details, the port included, come from
``~/.ssh/config`` (Fabric and ssh read it: a host sets no port, see Host.port), which the
loader's warning says.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cpuaccel.errors import InventoryError
from cpuaccel.inventory.builder import InventoryBuilder, Origin
from cpuaccel.inventory.variables import SLOTS_VAR
from cpuaccel.sourcefile import read_source

# name, then ":slots" (hydra), then "key=value" words (Open MPI: slots=, max_slots=).
_NAME = r"(?P<name>[A-Za-z0-9_][A-Za-z0-9_.\-]*|\[[0-9A-Fa-f:.]+\])"
_LINE = re.compile(rf"^{_NAME}(?::(?P<colon>\d+))?(?P<words>(?:\s+[A-Za-z_]+=\S+)*)$")
_YAMLISH = re.compile(r"^(?:[^:]*:(?:\s|$)|-\s|[{\[])")
# The seed's hostfile is a template: "xxx.xxx.xxx.xxx #node0 ip".
_PLACEHOLDER = re.compile(r"^[xX]+(?:\.[xX]+)+$")
SYNTAX_HINT = (
    "write one host per line: 'node1', 'node1:4' or 'node1 slots=4' ('#' starts a comment)"
)


@dataclass(frozen=True)
class HostfileEntry:
    name: str
    slots: int | None
    line: int


def _strip(line: str) -> str:
    return line.split("#", 1)[0].strip()


def looks_like_hostfile(text: str) -> bool:
    """True when every non-comment line is a hostfile line (a YAML inventory never is:
    its first line is a key ending in ':')."""
    lines = [_strip(line) for line in text.splitlines()]
    significant = [line for line in lines if line]
    if not significant or not _LINE.match(significant[0]):
        return False
    # A hostfile with one bad line is still a hostfile (its error names that line), as
    # long as nothing in it looks like YAML ("key:" or "- item").
    return all(_LINE.match(line) or not _YAMLISH.match(line) for line in significant)


def has_ini_words(text: str) -> bool:
    """True when a line sets something other than slots (``node1 ansible_user=x``): an
    Ansible INI inventory without a section, not an MPI hostfile."""
    for line in (_strip(line) for line in text.splitlines()):
        match = _LINE.match(line)
        words = match.group("words").split() if match else []
        if any(word.partition("=")[0] not in ("slots", "max_slots") for word in words):
            return True
    return False


def parse_hostfile(text: str, source: str) -> list[HostfileEntry]:
    """Entries in file order; a host listed twice is one host with the slots added up,
    as hydra counts it."""
    entries: dict[str, HostfileEntry] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = _strip(raw)
        if not line:
            continue
        match = _LINE.match(line)
        if match is None:
            raise InventoryError(
                f"not a hostfile line: {line!r}", source=source, line=number, hint=SYNTAX_HINT
            )
        name = match.group("name").strip("[]")
        if _PLACEHOLDER.match(name):
            raise InventoryError(
                f"{name!r} is a placeholder, not a host",
                source=source,
                line=number,
                hint="replace it with the node's name or IP address, as the guide's "
                "'#node0 ip' comment asks",
            )
        slots = int(match.group("colon")) if match.group("colon") else None
        for word in match.group("words").split():
            key, _, value = word.partition("=")
            if key in ("slots", "max_slots"):
                if not value.isdigit():
                    raise InventoryError(
                        f"{key}={value!r} is not a number", source=source, line=number,
                        hint=f"write {key}=N with N a whole number, e.g. node1 {key}=4",
                    )  # fmt: skip
                slots = int(value) if key == "slots" else slots
            elif key != "max_slots":
                raise InventoryError(
                    f"unknown hostfile option {key!r}",
                    source=source,
                    line=number,
                    hint="cpuaccel reads slots= (and ignores max_slots=); " + SYNTAX_HINT,
                )
        if slots is not None and slots < 1:
            raise InventoryError(
                f"host {name!r} has {slots} slots", source=source, line=number,
                hint="give each host at least one slot, or leave the count out",
            )  # fmt: skip
        if name in entries:
            old = entries[name]
            total = None if old.slots is None and slots is None else (old.slots or 1) + (slots or 1)
            entries[name] = HostfileEntry(name, total, old.line)
        else:
            entries[name] = HostfileEntry(name, slots, number)
    if not entries:
        raise InventoryError("the hostfile lists no hosts", source=source, hint=SYNTAX_HINT)
    return list(entries.values())


def read_hostfile(path: str | Path) -> list[HostfileEntry]:
    source = str(path)
    text = read_source(path, InventoryError, "hostfile", "check the path")
    return parse_hostfile(text, source)


def hostfile_vars(entry: HostfileEntry) -> dict[str, Any]:
    values: dict[str, Any] = {}
    if entry.slots is not None:
        values[SLOTS_VAR] = entry.slots
    if entry.name in ("localhost", "127.0.0.1"):
        values["ansible_connection"] = "local"
    return values


def warning_for(source: str) -> str:
    return (
        f"{source} is a plain MPI hostfile: SSH user, key and address come from "
        "~/.ssh/config (or pass -e ansible_user=... ); write an inventory.yaml "
        "(cpuaccel config) to set them per host"
    )


def hostfile_inventory(entries: list[HostfileEntry], source: str) -> InventoryBuilder:
    """A plain MPI hostfile as an inventory: every host in group all, in file order."""
    builder = InventoryBuilder(source)
    for entry in entries:
        values = hostfile_vars(entry)
        origins = dict.fromkeys(values, Origin(source, entry.line))
        builder.add_host(builder.groups["all"], entry.name, values, origins)
    return builder
