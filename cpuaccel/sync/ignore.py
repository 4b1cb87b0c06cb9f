"""What ``cpuaccel sync`` leaves out: .gitignore and .cpuaccelignore rules, plus defaults.

Rules are read per directory, as git does: a file's patterns apply below its folder,
and a deeper file's decision (including ``!negation``) overrides a shallower one.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import pathspec

from cpuaccel.errors import SourceError
from cpuaccel.sourcefile import read_source

IGNORE_FILES = (".gitignore", ".cpuaccelignore")
# Never worth shipping, and never to be deleted on a node: VCS data, bytecode (the node
# writes its own), run outputs, and cpuaccel's own state folder.
DEFAULT_PATTERNS = (".git/", "__pycache__/", "*.pyc", "runs/", ".cpuaccel/", ".venv/", "venv/")
# Folder names pruned on the node side too (cheap to skip while walking).
PRUNE_NAMES = (".git", "__pycache__", ".cpuaccel")


class Ignore:
    """Answers "is this relative path left out?" for one source root."""

    def __init__(self, root: str, extra: Iterable[str] = ()) -> None:
        self.root = root
        self._specs: dict[str, pathspec.GitIgnoreSpec | None] = {}
        self._base = pathspec.GitIgnoreSpec.from_lines([*DEFAULT_PATTERNS, *extra])

    def _spec_for(self, rel_dir: str) -> pathspec.GitIgnoreSpec | None:
        if rel_dir not in self._specs:
            lines: list[str] = []
            for name in IGNORE_FILES:
                path = os.path.join(self.root, rel_dir, name)
                if not os.path.lexists(path):
                    continue
                # Through the one reader: a FIFO or device here would hang the scan, and
                # an unreadable rules file must not silently ship what it leaves out.
                hint = "make it a text file of patterns, or remove it"
                lines += read_source(path, SourceError, f"{name} file", hint).splitlines()
            self._specs[rel_dir] = pathspec.GitIgnoreSpec.from_lines(lines) if lines else None
        return self._specs[rel_dir]

    def ignored(self, rel: str, is_dir: bool) -> bool:
        """True when rel (a '/'-separated path below root) is left out.

        Callers walk top-down and skip ignored folders, so only the path's own name
        needs deciding here, as git does.
        """
        probe = rel + "/" if is_dir else rel
        decision = self._base.check_file(probe).include
        parts = rel.split("/")
        for depth in range(len(parts)):
            rel_dir = "/".join(parts[:depth])
            spec = self._spec_for(rel_dir)
            if spec is None:
                continue
            below = "/".join(parts[depth:]) + ("/" if is_dir else "")
            result = spec.check_file(below).include
            if result is not None:
                decision = result
        return bool(decision)

    def ignored_anywhere(self, rel: str, is_dir: bool) -> bool:
        """Like ignored(), but also true when any parent folder is ignored (node paths)."""
        parts = rel.split("/")
        for depth in range(1, len(parts)):
            if self.ignored("/".join(parts[:depth]), True):
                return True
        return self.ignored(rel, is_dir)
