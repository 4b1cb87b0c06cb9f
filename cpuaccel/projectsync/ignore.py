"""What ``cpuaccel sync`` leaves out: .gitignore and .cpuaccelignore rules, plus defaults.

Rules are read per directory, as git does: a file's patterns apply below its folder,
and a deeper file's decision (including ``!negation``) overrides a shallower one.

Rules are matched per folder (``Ignore.folder``): the files that apply to a folder are
found once for it, and each name in it is decided against them. The defaults alone need
no pattern engine: a tree without rules files and without ``--exclude`` decides every
name by a set look-up, and pathspec (slow to import, and several regular expressions
a path) is loaded only for a tree that has rules of its own, so that a plain sync runs
at rsync's speed.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from cpuaccel.errors import SourceError, UsageError
from cpuaccel.sourcefile import read_source

if TYPE_CHECKING:
    import pathspec

IGNORE_FILES = (".gitignore", ".cpuaccelignore")
# Never worth shipping, and never to be deleted on a node: VCS data, bytecode (the node
# writes its own), run outputs, and cpuaccel's own state folder.
DEFAULT_PATTERNS = (".git/", "__pycache__/", "*.pyc", "runs/", ".cpuaccel/", ".venv/", "venv/")
# DEFAULT_PATTERNS as gitignore decides them for one name whose folder is not ignored:
# a folder of these names (`name/` matches folders only, at any depth), or any name that
# ends in .pyc (`*` may match nothing, and a folder too). tests/unit/projectsync/test_ignore.py
# holds this to pathspec's own answer.
DEFAULT_FOLDERS = frozenset(p[:-1] for p in DEFAULT_PATTERNS if p.endswith("/"))
DEFAULT_SUFFIX = ".pyc"
# Folder names pruned on the node side too (cheap to skip while walking).
PRUNE_NAMES = (".git", "__pycache__", ".cpuaccel")


def _compile(lines: Sequence[str]) -> pathspec.GitIgnoreSpec:
    import pathspec  # only for trees with rules of their own (see the module's doc)

    return pathspec.GitIgnoreSpec.from_lines(lines)


def pattern_error(pattern: str) -> str | None:
    """Why PATTERN is not a gitignore pattern (pathspec's words), else None: checked where
    a pattern enters (a rules file's line, the project file's ``exclude``, --exclude), as
    pathspec refuses a few (a lone ``!`` or ``\\``) with an exception of its own, and a
    bracket range whose ends are reversed (``[z-a]``) fails as its regular expression."""
    try:
        _compile([pattern])
    except (ValueError, re.error) as exc:  # pathspec's GitIgnorePatternError is a ValueError
        return str(exc)
    return None


def default_ignored(name: str, is_dir: bool) -> bool:
    """DEFAULT_PATTERNS' decision on one name in a folder that is not ignored."""
    return name.endswith(DEFAULT_SUFFIX) or (is_dir and name in DEFAULT_FOLDERS)


def check_excludes(patterns: Iterable[str]) -> None:
    """--exclude's patterns (sync's, run's) judged before anything is scanned or sent."""
    for pattern in patterns:
        said = pattern_error(pattern)
        if said is not None:
            raise UsageError(
                f"--exclude {pattern!r} is not a gitignore pattern ({said})",
                hint="give a pattern in gitignore syntax, e.g. --exclude 'data/' or '*.bin'",
            )


def _refuse_bad_line(path: str, lines: list[str]) -> None:
    """A rules file's first line that is no pattern, as file:line (pathspec's exception
    for the whole folder's rules would escape as a traceback)."""
    for number, line in enumerate(lines, 1):
        said = pattern_error(line) if line.strip() else None
        if said is not None:
            raise SourceError(
                f"not a gitignore pattern: {line!r} ({said})",
                source=path,
                line=number,
                hint="fix the pattern (gitignore syntax, e.g. data/ or *.bin) or remove the line",
            )


class FolderRules:
    """The rules that decide the names in one folder: the defaults (with --exclude's
    patterns when given), then each rules file of the folder and of those above it,
    shallowest first, each matched against the name's path below its own folder."""

    def __init__(
        self,
        base: pathspec.GitIgnoreSpec | None,
        prefix: str,
        chain: list[tuple[pathspec.GitIgnoreSpec, str]],
    ) -> None:
        self._base = base  # None: the defaults alone (default_ignored)
        self._prefix = prefix  # the folder's path below the root, "" or ending in "/"
        self._chain = chain  # (rules file's spec, the folder's path below that file's)

    def ignored(self, name: str, is_dir: bool) -> bool:
        """True when NAME (a file or folder directly in this folder) is left out."""
        tail = name + "/" if is_dir else name
        if self._base is None:
            decision: bool | None = default_ignored(name, is_dir)
        else:
            decision = self._base.check_file(self._prefix + tail).include
        for spec, below in self._chain:
            result = spec.check_file(below + tail).include
            if result is not None:
                decision = result
        return bool(decision)


class Ignore:
    """Answers "is this relative path left out?" for one source root."""

    def __init__(self, root: str, extra: Iterable[str] = ()) -> None:
        self.root = root
        self._specs: dict[str, pathspec.GitIgnoreSpec | None] = {}
        self._folders: dict[str, FolderRules] = {}
        extra = list(extra)
        self._base = _compile([*DEFAULT_PATTERNS, *extra]) if extra else None

    def _spec_for(self, rel_dir: str) -> pathspec.GitIgnoreSpec | None:
        if rel_dir not in self._specs:
            files: dict[str, list[str]] = {}  # each rules file's lines
            for name in IGNORE_FILES:
                path = os.path.join(self.root, rel_dir, name)
                if not os.path.lexists(path):
                    continue
                # Through the one reader: a FIFO or device here would hang the scan, and
                # an unreadable rules file must not silently ship what it leaves out.
                hint = "make it a text file of patterns, or remove it"
                files[path] = read_source(path, SourceError, f"{name} file", hint).splitlines()
            lines = [line for own in files.values() for line in own]
            try:
                self._specs[rel_dir] = _compile(lines) if lines else None
            except (ValueError, re.error):  # a line refused: which one, as file:line
                for path, own in files.items():
                    _refuse_bad_line(path, own)
                raise
        return self._specs[rel_dir]

    def folder(self, rel_dir: str) -> FolderRules:
        """The rules for the names directly in REL_DIR ('/'-separated below root, ''
        for the root), found once a folder."""
        rules = self._folders.get(rel_dir)
        if rules is None:
            parts = rel_dir.split("/") if rel_dir else []
            chain = []
            for depth in range(len(parts) + 1):
                spec = self._spec_for("/".join(parts[:depth]))
                if spec is not None:
                    below = "/".join(parts[depth:])
                    chain.append((spec, below + "/" if below else ""))
            prefix = rel_dir + "/" if rel_dir else ""
            rules = self._folders[rel_dir] = FolderRules(self._base, prefix, chain)
        return rules

    def ignored(self, rel: str, is_dir: bool) -> bool:
        """True when rel (a '/'-separated path below root) is left out.

        Callers walk top-down and skip ignored folders, so only the path's own name
        needs deciding here, as git does.
        """
        folder, _, name = rel.rpartition("/")
        return self.folder(folder).ignored(name, is_dir)

    def ignored_anywhere(self, rel: str, is_dir: bool) -> bool:
        """Like ignored(), but also true when any parent folder is ignored (node paths)."""
        parts = rel.split("/")
        for depth in range(1, len(parts)):
            if self.ignored("/".join(parts[:depth]), True):
                return True
        return self.ignored(rel, is_dir)


# ---------------------------------------------------------------- this command's own output files
# The files this command's own output goes into, which a sync must never send.
#
# ``cpuaccel run train.py > train.log`` from the project folder writes train.log while the
# sync before the launch reads the folder: the log changes under the sync, every time. Its
# stdout and stderr are found by inode (fds 1 and 2). ``| tee train.log`` leaves a pipe on
# fd 1: the files written by the process reading that pipe (tee, and a tee after it) are
# found through /proc on Linux; elsewhere the sync's retry and its message are the answer.
FileId = tuple[int, int]  # (st_dev, st_ino)
_PIPE_HOPS = 3  # cpuaccel ... | tee a.log | tee b.log: follow the pipes this far
_PROC = "/proc"


def own_output_files(proc: str = _PROC) -> set[FileId]:
    """The regular files fds 1 and 2 write into, directly or through a pipe's reader."""
    found: set[FileId] = set()
    pipes: set[int] = set()
    for fd in (1, 2):
        try:
            st = os.fstat(fd)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            found.add((st.st_dev, st.st_ino))
        elif stat.S_ISFIFO(st.st_mode):
            pipes.add(st.st_ino)
    for _ in range(_PIPE_HOPS):
        if not pipes:
            break
        files, pipes = _written_by_readers_of(pipes, proc)
        found |= files
    return found


def _written_by_readers_of(pipes: set[int], proc: str) -> tuple[set[FileId], set[int]]:
    """What the processes reading these pipes (on their stdin) write: files, and pipes."""
    wanted = {f"pipe:[{ino}]" for ino in pipes}
    files: set[FileId] = set()
    onward: set[int] = set()
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit() and p != str(os.getpid())]
    except OSError:
        return files, onward  # no /proc (not Linux)
    for pid in pids:
        try:
            if os.readlink(f"{proc}/{pid}/fd/0") not in wanted:
                continue
            fds = os.listdir(f"{proc}/{pid}/fd")
        except OSError:
            continue  # gone, or another user's
        for fd in fds:
            path = f"{proc}/{pid}/fd/{fd}"
            try:
                st = os.stat(path)
                writing = _opened_for_writing(f"{proc}/{pid}/fdinfo/{fd}")
            except OSError:
                continue
            if not writing:
                continue
            if stat.S_ISREG(st.st_mode):
                files.add((st.st_dev, st.st_ino))
            elif stat.S_ISFIFO(st.st_mode) and fd == "1":
                onward.add(st.st_ino)
    return files, onward


def _opened_for_writing(fdinfo: str) -> bool:
    for line in Path(fdinfo).read_text().splitlines():
        if line.startswith("flags:"):
            return int(line.split()[1], 8) & os.O_ACCMODE != os.O_RDONLY
    return False
