"""The source side of a sync: what to send, described entry by entry and as one hash,
and :func:`plan`, what a node's tree lacks or has extra compared with it."""

from __future__ import annotations

import contextlib
import marshal
import os
import stat
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cpuaccel.errors import UsageError
from cpuaccel.node.tree import Entry, entry_of, file_digest, manifest_hash
from cpuaccel.projectsync.ignore import FileId, Ignore, own_output_files
from cpuaccel.sourcefile import kind_of

Signature = tuple[int, int, int]  # a file's (size, mtime_ns, ctime_ns) when it was hashed


@dataclass
class SourceManifest:
    entries: dict[str, Entry] = field(default_factory=dict)  # dest-relative path -> entry
    local: dict[str, str] = field(default_factory=dict)  # dest-relative path -> local path
    # dest-relative path -> the local folder it is relative to (rsync's source root)
    root_of: dict[str, str] = field(default_factory=dict)
    ignores: list[tuple[str, Ignore]] = field(default_factory=list)  # (prefix, rules)
    hash: str = ""
    roots: list[str] = field(default_factory=list)  # the sources, as absolute paths
    # The controller's hash cache as the build left it, written by save_cache() only once
    # the destination is accepted: a refused sync writes nothing, here either.
    hash_cache: dict[str, Any] | None = field(default=None, repr=False)
    stats: dict[str, Signature] = field(default_factory=dict, repr=False)  # files only
    # The command's own stdout/stderr files found in the tree, left out (ignore.own_output_files).
    own_outputs: list[str] = field(default_factory=list)
    built_from: tuple[tuple[str, ...], tuple[str, ...], bool] = ((), (), False)
    # (path, local path) of the files whose digest the walk left to finish(): a sync
    # starts its nodes' connections in between (projectsync/engine.py).
    pending: list[tuple[str, str]] = field(default_factory=list, repr=False)

    def finish(self) -> None:
        """Hash the files the walk left pending, then the tree (once; a no-op after).
        A file removed (or replaced by a FIFO) since the walk: the tree is described
        again, once; when that fails too, SourceChanging names the file."""
        for rel, local in self.pending:
            kind, mode, size, _ = self.entries[rel]
            try:
                digest = file_digest(local)
            except OSError:
                try:
                    self.rebuild()
                except OSError:
                    raise SourceChanging([rel]) from None
                return
            self.entries[rel] = (kind, mode, size, digest)
            if self.hash_cache is not None:
                self.hash_cache[local] = (*self.hash_cache[local][:4], digest)
        self.pending = []
        if not self.hash:
            self.hash = manifest_hash(self.entries)

    def changed_since_build(self) -> list[str]:
        """The files that are no longer what was hashed: written (or removed) since."""
        changed = []
        for rel, before in self.stats.items():
            try:
                st = os.stat(self.local[rel])
            except OSError:
                changed.append(rel)
                continue
            if (st.st_size, st.st_mtime_ns, st.st_ctime_ns) != before:
                changed.append(rel)
        return sorted(changed)

    def rebuild(self) -> None:
        """Describe the sources again, as they are now (in place: callers hold this one)."""
        sources, excludes, copy_links = self.built_from
        fresh = build(sources, excludes=excludes, copy_links=copy_links)
        vars(self).update(vars(fresh))

    def save_cache(self) -> None:
        """Keep the file hashes this build computed for the next one (once)."""
        self.finish()  # never a pending file's empty digest
        if self.hash_cache is not None:
            _save_cache(self.hash_cache)
            self.hash_cache = None

    def ignored_on_node(self, rel: str, is_dir: bool) -> bool:
        """Whether a path found on a node falls under the source's ignore rules.

        Such paths are neither compared nor deleted, as rsync protects excluded files.
        """
        for prefix, rules in self.ignores:
            if not prefix:
                return rules.ignored_anywhere(rel, is_dir)
            if rel == prefix:
                return False
            if rel.startswith(prefix + "/"):
                return rules.ignored_anywhere(rel[len(prefix) + 1 :], is_dir)
        return False


class SourceChanging(UsageError):
    """Files of the source kept changing while they were synced, twice in a row."""

    def __init__(self, paths: Sequence[str]) -> None:
        shown = ", ".join(paths[:5]) + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")
        super().__init__(
            f"{shown}: changed while being synced, twice in a row (a log or output being "
            "written in the project folder?)",
            hint=f"add {'them' if len(paths) > 1 else 'it'} to .cpuaccelignore (or pass "
            f"--exclude {paths[0]}): nodes do not need what a running program writes",
        )
        self.paths = list(paths)


def _cache_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "cpuaccel" / "hashes"


def _load_cache() -> dict[str, Any]:
    try:
        cache = marshal.loads(_cache_path().read_bytes())
    except (OSError, EOFError, ValueError, TypeError):
        return {}
    return cache if isinstance(cache, dict) else {}


def _save_cache(cache: dict[str, Any]) -> None:
    path = _cache_path()
    tmp: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # A new file of random name (O_EXCL), as the sync memory writes: never a file
        # someone placed at a predictable name, nor a link's target.
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=path.name, delete=False) as f:
            tmp = f.name
            f.write(marshal.dumps(cache))
        os.replace(tmp, path)
    except OSError:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        # a cache that cannot be written only costs time


def _check_name(path: str) -> None:
    if "\n" in path or "\r" in path:
        raise UsageError(
            f"{path!r}: a file name with a newline cannot be synced safely",
            hint="rename the file, or exclude it with --exclude or .cpuaccelignore",
        )


class _Builder:
    def __init__(self, copy_links: bool, excludes: Sequence[str], defer: bool = False) -> None:
        self.defer = defer  # files not in the hash cache are left to SourceManifest.finish
        self.copy_links = copy_links
        self.excludes = list(excludes)
        self.cache = _load_cache()
        self.result = SourceManifest()
        self.own_outputs: set[FileId] = own_output_files()

    def add(self, rel: str, local: str, root: str, st: os.stat_result) -> None:
        _check_name(local)
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode) or stat.S_ISLNK(st.st_mode)):
            # A source named on the command line, or what --copy-links follows: hashing a
            # FIFO or /dev/zero would never end.
            raise UsageError(
                f"{local} is {kind_of(st.st_mode)}, not a file or folder a sync can send",
                hint="name files and folders, or exclude it",
            )
        later = None
        if self.defer:

            def later() -> str:  # entry_of asks only when the cache has no digest
                self.result.pending.append((rel, local))
                return ""

        self.result.entries[rel] = entry = entry_of(local, st, self.cache, later)
        if entry[0] == "f":
            self.result.stats[rel] = (st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        self.result.local[rel] = local
        self.result.root_of[rel] = root

    def tree(self, top: str, root: str, rules: Ignore, tree_real: str) -> None:
        """Walk top (a folder below root) top-down, keeping what the rules let through."""

        def prefix(base: str) -> str:
            rel = os.path.relpath(top, base).replace(os.sep, "/")
            return "" if rel == "." else rel + "/"

        # Relative names are built by concatenation as the walk descends: os.path.relpath
        # for each of thousands of files would be much of a no-change sync's controller
        # time.
        stack = [(top, prefix(root), prefix(rules.root))]
        while stack:
            folder, rel_prefix, tree_prefix = stack.pop()
            with os.scandir(folder) as items:
                listing = sorted(items, key=lambda e: e.name)
            in_folder = rules.folder(tree_prefix[:-1])  # its rules, found once a folder
            for item in listing:
                local = item.path
                rel = rel_prefix + item.name
                rel_in_tree = tree_prefix + item.name
                st = item.stat(follow_symlinks=False)
                is_dir = stat.S_ISDIR(st.st_mode)
                if in_folder.ignored(item.name, is_dir):
                    continue
                if stat.S_ISLNK(st.st_mode):
                    target = os.path.realpath(local)
                    inside = target == tree_real or target.startswith(tree_real + os.sep)
                    if not inside:
                        if not self.copy_links:
                            raise UsageError(
                                f"{local}: symlink points outside the synced tree "
                                f"({os.readlink(local)})",
                                hint="pass --copy-links to send what it points to, or exclude it",
                            )
                        try:
                            st = os.stat(local)
                        except OSError:
                            raise UsageError(
                                f"{local}: symlink is broken ({os.readlink(local)})",
                                hint="fix or exclude it",
                            ) from None
                        is_dir = stat.S_ISDIR(st.st_mode)
                elif not (is_dir or stat.S_ISREG(st.st_mode)):
                    continue  # sockets, fifos, devices: nothing a training job ships
                elif (st.st_dev, st.st_ino) in self.own_outputs:
                    # `run ... > train.log` in the project: it grows while we sync it.
                    self.result.own_outputs.append(rel)
                    continue
                if is_dir and os.path.exists(os.path.join(local, "pyvenv.cfg")):
                    continue  # a virtualenv, whatever its name: nodes have their own
                self.add(rel, local, root, st)
                if is_dir:
                    stack.append((local, rel + "/", rel_in_tree + "/"))


def build(
    sources: Sequence[str],
    *,
    excludes: Sequence[str] = (),
    copy_links: bool = False,
    defer_hashing: bool = False,
) -> SourceManifest:
    """Describe the sources as they will land below the destination.

    One folder: its contents land at the destination itself. Several sources, or files:
    each lands below the destination under its own name. Every refusal (a link out of
    the tree, a FIFO named) comes from the walk; ``defer_hashing`` leaves reading the
    files the hash cache does not know to ``finish()``.
    """
    if not sources:
        raise UsageError("nothing to sync", hint="name a folder or files, or run in your project")
    paths = [os.path.abspath(s) for s in sources]
    for given, path in zip(sources, paths, strict=True):
        if not os.path.lexists(path):
            raise UsageError(f"{given}: no such file or folder", hint="check the source path")
        _check_name(path)
    builder = _Builder(copy_links, excludes, defer_hashing)
    single_dir = len(paths) == 1 and os.path.isdir(paths[0])
    names: dict[str, str] = {}
    for given, path in zip(sources, paths, strict=True):
        if single_dir:
            root, prefix = path, ""
        else:
            prefix = os.path.basename(path.rstrip(os.sep))
            if prefix in names:
                raise UsageError(
                    f"{given} and {names[prefix]} would both land at {prefix}/",
                    hint="sync them separately with --dest",
                )
            names[prefix] = given
            root = os.path.dirname(path)
        if os.path.isdir(path):
            rules = Ignore(path, builder.excludes)
            builder.result.ignores.append((prefix, rules))
            if prefix:
                builder.add(prefix, path, root, os.stat(path))
            builder.tree(path, root, rules, os.path.realpath(path))
        else:
            builder.add(prefix, path, root, os.stat(path))
    builder.result.hash_cache = builder.cache
    builder.result.roots = paths
    builder.result.built_from = (tuple(paths), tuple(excludes), copy_links)
    if not defer_hashing:
        builder.result.finish()
    return builder.result


def plan(source: SourceManifest, node: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(changed, deleted): what differs from the source, and what the node has extra.

    Extra paths under the source's ignore rules are neither compared nor deleted; a
    deleted folder takes its contents with it, so only its top is listed.
    """
    changed = [rel for rel, entry in source.entries.items() if node.get(rel) != entry]
    extra = sorted(
        (
            rel
            for rel, entry in node.items()
            if rel not in source.entries and not source.ignored_on_node(rel, entry[0] == "d")
        ),
        key=lambda rel: rel.split("/"),  # a folder right before its contents ("a.txt" after)
    )
    deleted: list[str] = []
    for rel in extra:
        if not any(rel.startswith(top + "/") for top in deleted[-1:]):
            deleted.append(rel)
    return sorted(changed), deleted
