"""``group_vars/`` and ``host_vars/`` folders, read as Ansible's host_group_vars plugin
reads them (lib/ansible/plugins/vars/host_group_vars.py, DataLoader.find_vars_files).

Beside the inventory file (and, for ``provision``, beside the playbook), the variables of
group ``web`` come from the first of ``group_vars/web``, ``web.yml``, ``web.yaml``,
``web.json`` that exists; a folder ``group_vars/web/`` has its files read in sorted
order (subfolders too), a later file's variables over an earlier's. Each file is a YAML
mapping of NAME: value, each value remembering its file and line.

Ansible passes over some files without a word; here each is a warning naming it: a file
for a group or host the inventory does not have, a second candidate (``web.yml`` when
``web.yaml`` was read), a file in a folder whose suffix is not .yml/.yaml/.json.
Hidden files and backups (``.x``, ``x~``) are skipped, as in Ansible.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from typing import Any, NamedTuple

from cpuaccel.errors import InventoryError
from cpuaccel.inventory.ansible_yaml import read_vars_file
from cpuaccel.inventory.builder import FileVars, InventoryBuilder, Origin
from cpuaccel.sourcefile import read_source

SUFFIXES = (".yml", ".yaml", ".json")
FOLDERS = ("group_vars", "host_vars")
MAX_DEPTH = 8  # a folder of vars files nested deeper is a symlink loop, not a layout
_HINT = "write the file as a YAML mapping of NAME: value lines"


class Found(NamedTuple):
    """The vars files a folder holds for each name, and what it holds that is not read."""

    files: dict[str, list[str]]
    unread: list[str]


def attach(builder: InventoryBuilder, folder: str, layer: int) -> list[str]:
    """Read ``folder``'s group_vars/ and host_vars/ into ``builder`` at ``layer`` (0: beside
    the inventory, 1: beside the playbook); the warnings about files not read."""
    warnings: list[str] = []
    for kind, names in (("group_vars", builder.groups), ("host_vars", builder.hosts)):
        path = os.path.join(folder, kind)
        if not os.path.lexists(path):
            continue
        what = "group" if kind == "group_vars" else "host"
        if not os.path.isdir(path):
            raise InventoryError(
                f"{kind} is not a folder",
                source=path,
                hint=f"make {kind}/ a folder of YAML files, one per {what}, or remove it",
            )
        found = find(path, names, what)
        target = builder.group_files if kind == "group_vars" else builder.host_files
        for name, files in found.files.items():
            values: dict[str, Any] = {}
            origins: dict[str, Origin] = {}
            for file in files:
                text = read_source(file, InventoryError, f"{kind} file", _HINT)
                read, at = read_vars_file(text, file)
                values.update(read)
                origins.update(at)
            target[(layer, name)] = FileVars(values, origins)
        warnings += found.unread
    return warnings


def find(path: str, names: Collection[str], what: str) -> Found:
    """Which files of the folder ``path`` hold each name's variables (Ansible's order:
    NAME, then NAME.yml, NAME.yaml, NAME.json; a folder is read whole)."""
    entries = sorted(e for e in os.listdir(path) if not _hidden(e))
    used: set[str] = set()
    files: dict[str, list[str]] = {}
    notes: list[str] = []
    for name in sorted(names):
        candidates = [c for c in (name, *(name + s for s in SUFFIXES)) if c in entries]
        if not candidates:
            continue
        used.update(candidates)
        chosen = os.path.join(path, candidates[0])
        files[name] = _folder_files(chosen, 0, notes) if os.path.isdir(chosen) else [chosen]
        notes += [
            f"{os.path.join(path, extra)}: not read: Ansible reads only {candidates[0]} "
            f"for {what} {name!r} (merge the two)"
            for extra in candidates[1:]
        ]
    for entry in entries:
        if entry not in used:
            stem = os.path.splitext(entry)[0] if entry.endswith(SUFFIXES) else entry
            notes.append(
                f"{os.path.join(path, entry)}: not read: the inventory has no {what} {stem!r}"
            )
    return Found(files, notes)


def _folder_files(folder: str, depth: int, notes: list[str]) -> list[str]:
    if depth > MAX_DEPTH:
        raise InventoryError(
            f"vars folders nested more than {MAX_DEPTH} deep",
            source=folder,
            hint="check for a symbolic link that points to a folder above it",
        )
    found: list[str] = []
    for entry in sorted(os.listdir(folder)):
        if _hidden(entry):
            continue
        full = os.path.join(folder, entry)
        suffix = os.path.splitext(entry)[1]
        if os.path.isdir(full) and not suffix:
            found += _folder_files(full, depth + 1, notes)
        elif not suffix or suffix in SUFFIXES:
            found.append(full)
        else:
            notes.append(f"{full}: not read: a vars file ends in .yml, .yaml or .json")
    return found


def _hidden(entry: str) -> bool:
    return entry.startswith(".") or entry.endswith("~")
