"""``tune --write``: the best setting into cpuaccel.yaml, the rest of the file as it was.

Only the values change: ``ppn``, ``env: OMP_NUM_THREADS`` and ``allocator`` are edited
in place (their text spans, from the YAML nodes' marks), or added when absent; every
other key, comment and blank line stays byte for byte. The new text is read back with
the project file's own reader before it replaces the file, so that a write never leaves
a file ``run`` would refuse. A missing file is created with ``cpuaccel config``'s writer.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from yaml.nodes import MappingNode, Node, ScalarNode

from cpuaccel.config.project import PROJECT_FILE, parse_project
from cpuaccel.config.writer import project_text, write_files
from cpuaccel.errors import ProjectFileError, UsageError
from cpuaccel.sourcefile import read_source
from cpuaccel.tuning.grid import Trial
from cpuaccel.yamlsource import YamlReader

THREADS_VAR = "OMP_NUM_THREADS"
NOTE = "written by cpuaccel tune"


def tuned_values(best: Trial, with_allocator: bool) -> dict[str, Any]:
    values: dict[str, Any] = {"ppn": best.ppn, "env": {THREADS_VAR: str(best.threads)}}
    if with_allocator:
        values["allocator"] = best.allocator
    return values


def check_target(path: Path) -> None:
    if path.is_symlink():
        raise UsageError(
            f"{path} is a symbolic link; tune --write replaces only a regular file",
            hint="write to the file it points to with --config FILE, or copy it here",
        )
    # No write bit at all is the owner's "leave it": refused even to root, whom
    # os.access lets write anything.
    if path.exists() and (not os.access(path, os.W_OK) or not path.stat().st_mode & 0o222):
        raise UsageError(f"{path} is not writable; nothing was written", hint=f"chmod u+w {path}")
    if not os.access(path.parent, os.W_OK):
        raise UsageError(
            f"{path.parent} is not writable (the new {path.name} goes there beside it)",
            hint=f"chmod u+w {path.parent}, or leave out --write",
        )


def _key(root: MappingNode, name: str) -> tuple[ScalarNode, Node] | None:
    for key, value in root.value:
        if isinstance(key, ScalarNode) and key.value == name:
            return key, value
    return None


def _scalar(value: Any) -> str:
    return value if isinstance(value, str) and value.isidentifier() else json.dumps(value)


Edit = tuple[int, int, str]  # replace text[start:end] with the string


def _set(text: str, root: MappingNode, name: str, value: Any) -> list[Edit]:
    """Edits that make top-level ``name`` hold ``value`` (a scalar)."""
    found = _key(root, name)
    if found is None:  # a new line at the end (edited_text adds them in order)
        return [(len(text), len(text), f"{name}: {_scalar(value)}  # {NOTE}\n")]
    key, node = found
    if isinstance(node, ScalarNode) and node.start_mark.index == node.end_mark.index:
        at = text.index(":", key.end_mark.index) + 1  # `ppn:` with no value
        return [(at, at, f" {_scalar(value)}")]
    return [(node.start_mark.index, node.end_mark.index, _scalar(value))]


def _set_env(text: str, root: MappingNode, threads: str) -> list[Edit]:
    """Edits that put OMP_NUM_THREADS into the ``env`` mapping, the others kept."""
    found = _key(root, "env")
    if found is None or not isinstance(found[1], MappingNode):
        return _set(text, root, "env", {THREADS_VAR: threads})  # absent or empty: a new one
    env = found[1]
    own = _key(env, THREADS_VAR)
    if own is not None:
        return [(own[1].start_mark.index, own[1].end_mark.index, json.dumps(threads))]
    entry = f"{THREADS_VAR}: {json.dumps(threads)}"
    if env.flow_style or not env.value:  # {A: "1"}: the new entry first in the braces
        at = env.start_mark.index + 1
        return [(at, at, entry + (", " if env.value else ""))]
    first = env.value[0][0]
    start = text.rfind("\n", 0, first.start_mark.index) + 1  # that line's start
    return [(start, start, " " * first.start_mark.column + entry + "\n")]


def edited_text(text: str, values: dict[str, Any], source: str) -> str:
    """``text`` with ``values`` set (ppn, env's OMP_NUM_THREADS, allocator)."""
    # Bounded as every read of the file (nesting, a bad line: its file:line error).
    root = YamlReader(source, ProjectFileError).compose(text) if text.strip() else None
    if root is None:
        root = MappingNode("tag:yaml.org,2002:map", [])
    if not isinstance(root, MappingNode):
        raise ProjectFileError("not a mapping of 'key: value' lines", source=source)
    edits: list[Edit] = []
    for name, value in values.items():
        if name == "env":
            edits += _set_env(text, root, value[THREADS_VAR])
        else:
            edits += _set(text, root, name, value)
    end = len(text)
    added = "".join(new for start, stop, new in edits if start == stop == end)
    for start, stop, new in sorted(edits, key=lambda e: e[0], reverse=True):
        if not start == stop == end:
            text = text[:start] + new + text[stop:]
    if added and text and not text.endswith("\n"):
        added = "\n" + added
    return text + added


def write_best(path: Path, best: Trial, with_allocator: bool) -> Path:
    """The best setting into ``path`` (a cpuaccel.yaml); refused when it is a link or
    cannot be written. Returns the path written."""
    check_target(path)
    values = tuned_values(best, with_allocator)
    if not os.path.lexists(path):
        text, mode = project_text(values, NOTE), 0o644
    else:
        hint = f"fix {path}, or write elsewhere with --config FILE"
        old = read_source(path, ProjectFileError, "project file", hint)
        mode = os.stat(path).st_mode & 0o7777
        text = edited_text(old, values, str(path))
    config = parse_project(text, str(path))  # read back as run reads it
    wanted = {"ppn": best.ppn, "threads": str(best.threads)}
    got = {"ppn": config.get("ppn"), "threads": (config.get("env") or {}).get(THREADS_VAR)}
    if got != wanted or (with_allocator and config.get("allocator") != best.allocator):
        raise ProjectFileError(
            f"the edit would not read back as {wanted} (got {got}); nothing was written",
            source=str(path),
            hint="set ppn and env: OMP_NUM_THREADS in it by hand",
        )
    write_files({path: text}, force=True, confirm=None)
    os.chmod(path, mode)  # write_files' temporary file is 0600: keep the file's own mode
    return path


def target_file(config_path: str | None, kind: str | None) -> Path:
    """Where --write writes: the cpuaccel.yaml in use, else ./cpuaccel.yaml."""
    if config_path and kind == "accelerate":
        raise UsageError(
            f"--write: {config_path} is Accelerate's config, which tune does not edit",
            hint=f"run tune without --config to write ./{PROJECT_FILE}",
        )
    return Path(config_path) if config_path and kind == "cpuaccel" else Path(PROJECT_FILE)
