"""The node side of ``cpuaccel sync``: the node program ``tree`` (with ``common``,
``destination`` and ``nofollow``).

A sync's modes are served by ``treesession`` (one interpreter a node for the whole
sync). Run on its own, as ``python -c BOOT LENGTH look DEST [--expect=H] [--workdir=W]
[PRUNE...]`` (cpuaccel.connectors.programs), this program answers ``look`` only: run's
preflight under srun, its one caller, needs nothing else, and a program that cannot
write is the one to leave callable alone.

Every mode first resolves DEST as the node sees it (``~`` expanded, links and ``..``
resolved) and refuses a folder a sync must never own (``refusal``: the home folder, the
workdir or a folder above it, a system folder...): the answer is then only
``{"dest": RESOLVED, "refused": WHY}``, and nothing was changed. Below DEST every path
is reached by descriptors without following links (cpuaccel.node.nofollow).

Modes:
  scan    report DEST's manifest (creating DEST and its state folder). Temporary files
          are counted, not removed: on a shared filesystem they may be another node's
          writes in flight; only the elected writer removes them, in apply.
  look    the same, changing nothing (--check, and run's preflight)
  apply   payload: one JSON header line (the manifest), then a tar stream of changed
          entries (a change to a known tree, ``base``: cpuaccel.node.treesession).
          Every file is written to a temporary name and renamed, so a node never holds
          a half-written file at a real path; then deletions; then one walk by
          descriptors clears the leftovers of an interrupted sync and describes every
          entry, every source entry is verified against it (a file's content too,
          unless rsync delivered it) and the manifest hash is recorded.

The controller imports the entry and hash helpers (``entries``) from here too (both
sides describe files the same way); ``treesession`` serves these modes on one channel.
"""

from __future__ import annotations

import functools
import os
import stat
import sys

from cpuaccel.node.boundedjson import loads
from cpuaccel.node.common import TMP_MARK, create_new, which, write_atomic
from cpuaccel.node.destination import resolve

# Entry, entry_of, file_digest and manifest_hash: the controller's too, imported from here
from cpuaccel.node.entries import Entry as Entry
from cpuaccel.node.entries import entry_at
from cpuaccel.node.entries import entry_of as entry_of
from cpuaccel.node.entries import file_digest as file_digest
from cpuaccel.node.entries import manifest_hash as manifest_hash
from cpuaccel.node.nofollow import (
    delete,
    lstat_at,
    open_folder,
    parent_of,
    remove_at,
    sweep,
    unpack,
)
from cpuaccel.node.unfinished import (
    is_unfinished,
    mark_finished,
    mark_made,
    rsync_leftover_test,
)

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time: the node pays for every import
    from typing import Any, BinaryIO

STATE = ".cpuaccel"  # inside DEST: manifest record, hash cache, fs marker, rsync temp dir
RECORD = "manifest"
CACHE = "hashcache.json"
FSID = "fsid"
RSYNC_TMP = "tmp"


def _load_cache(state: str) -> dict[str, Any]:
    """The hash cache, or an empty one: it lives in a folder others may write to, so it
    is plain data (JSON, never marshal or pickle) and anything unexpected is ignored
    (entry_of checks each entry's shape)."""
    try:
        with open(os.path.join(state, CACHE), "rb") as f:
            cache = loads(f.read())
    except (OSError, ValueError):
        return {}
    return cache if isinstance(cache, dict) else {}


def _save_cache(state: str, cache: dict[str, Any]) -> None:
    import json

    write_atomic(os.path.join(state, CACHE), json.dumps(dict(cache)).encode())


def _walk(dest: str, prune: set[str]) -> tuple[dict[str, os.stat_result], int]:
    """Every path below dest (relative, '/'-separated) with its lstat, and the number of
    temporary files seen. Virtualenvs are skipped, as the source skips them: a node's
    own venv is neither compared nor deleted."""
    found: dict[str, os.stat_result] = {}
    cleaned = 0
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        try:
            items = list(os.scandir(os.path.join(dest, rel_dir) if rel_dir else dest))
        except OSError:
            continue
        for item in items:
            rel = rel_dir + "/" + item.name if rel_dir else item.name
            if rel == STATE or item.name in prune:
                continue
            if TMP_MARK in item.name:
                cleaned += 1
                continue
            try:
                st = item.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # removed while we walk (another node's writer, a rotating run)
            if stat.S_ISDIR(st.st_mode):
                if os.path.exists(os.path.join(item.path, "pyvenv.cfg")):
                    continue
                stack.append(rel)
            found[rel] = st
    return found, cleaned


def _clean(
    dest: str,
    prune: set[str],
    cache: dict[str, Any] | None = None,
    trusted: dict[str, Entry] | None = None,
    leftover: Any = None,
) -> dict[str, Entry]:
    """Remove leftovers of an interrupted sync (temporary files and rsync's partials) and
    describe every entry a scan would find, in one walk by descriptors (a link swapped in
    for a folder on the way is never followed): a file's digest from ``cache`` when it
    knows it, else read through its folder's descriptor. A file rsync delivered
    (``trusted``: path -> the manifest's entry) was checked by rsync itself (a whole-file
    checksum of what it wrote, against the sender's): its type, mode and size are checked
    here, and its digest taken from the manifest, instead of reading it again."""
    found: dict[str, Entry] = {}
    trusted = trusted or {}

    def visit(folder: int, name: str, rel: str, st: os.stat_result) -> None:
        if leftover is not None and leftover(rel, st):  # node/unfinished.py
            remove_at(folder, name)
            return
        want = trusted.get(rel)
        if want and want[0] == "f" and stat.S_ISREG(st.st_mode) and st.st_size == want[2]:
            key = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, want[3])
            cache[os.path.join(dest, rel)] = key  # type: ignore[index]  # trusted: with a cache
        try:
            found[rel] = entry_at(folder, name, os.path.join(dest, rel), st, cache)
        except FileNotFoundError:
            pass  # removed since the listing

    root = open_folder(dest)
    try:
        sweep(root, TMP_MARK, lambda rel: rel == STATE or rel.split("/")[-1] in prune, visit)
        way = parent_of(root, f"{STATE}/{RSYNC_TMP}/-", create=False)
        if way is not None:
            try:
                for name in os.listdir(way[0]):
                    remove_at(way[0], name)
            finally:
                os.close(way[0])
    finally:
        os.close(root)
    return found


def _fsid(state: str, create: bool) -> str | None:
    """A random id shared by every node that sees this directory (a shared filesystem)."""
    path = os.path.join(state, FSID)
    try:
        with open(path) as f:
            return f.read().strip() or None
    except OSError:
        if not create:
            return None
    tmp = path + TMP_MARK + os.urandom(8).hex()
    with os.fdopen(create_new(tmp, 0o644), "w") as f:
        f.write(os.urandom(16).hex())
    try:
        os.link(tmp, path)  # atomic and exclusive: the first node to get here wins
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
    with open(path) as f:
        return f.read().strip()


class _Cache(dict):  # type: ignore[type-arg]
    """path -> (size, mtime, ctime, ino, digest); knows whether it needs writing back."""

    dirty = False

    def __setitem__(self, key: str, value: Any) -> None:
        self.dirty = True
        super().__setitem__(key, value)


def _entries(
    dest: str, found: dict[str, os.stat_result], cache: dict[str, Any]
) -> tuple[dict[str, Entry], _Cache]:
    """Entries of the found paths, and the cache trimmed to them (dirty when it changed)."""
    paths = {rel: os.path.join(dest, rel) for rel in found}  # each joined once: a look's cost
    kept = _Cache({path: cache[path] for path in paths.values() if path in cache})
    kept.dirty = len(kept) != len(cache)
    entries = {}
    for rel, st in found.items():
        try:
            entries[rel] = entry_of(paths[rel], st, kept)
        except FileNotFoundError:
            continue  # removed since the walk
    return entries, kept


def scan(
    dest: str, prune: set[str], create: bool, expect: str | None = None, keep: Any = None
) -> dict[str, Any]:
    """DEST's entries and hash; the entries are left out when the hash is ``expect``.
    ``keep`` (a dict) receives the walk's stats, the entries and the hash cache as the
    entries left it (cpuaccel.node.treesession)."""
    state = os.path.join(dest, STATE)
    made = create and not os.path.lexists(dest)
    if create:
        _prepare(dest)
    if made:  # nothing of the user's here: rsync may write without --temp-dir
        mark_made(state)
    found, leftovers = _walk(dest, prune)
    try:  # rsync's partial files from an interrupted run
        leftovers += len(os.listdir(os.path.join(state, RSYNC_TMP)))
    except OSError:
        pass
    entries, cache = _entries(dest, found, _load_cache(state))
    if keep is not None:
        keep.update(found=found, entries=entries, cache=cache)
    if create and cache.dirty:
        _save_cache(state, cache)
    digest = manifest_hash(entries)
    record = None
    try:
        with open(os.path.join(state, RECORD)) as f:
            record = f.read().strip() or None
    except OSError:
        pass
    rsync = which("rsync")
    return {
        "dest": dest,
        "exists": os.path.isdir(dest),
        # The controller needs the entries only to plan a change.
        "entries": None if digest == expect else entries,
        "hash": digest,
        "recorded": record,
        # None unless the state folder is a real one (scan made it so): the controller then
        # scans before writing (rsync's temporary files go there), which replaces a link
        "fsid": _fsid(state, create) if _real_folder(state) else None,
        "rsync": rsync,
        "leftovers": leftovers,
        "created": made,
    }


def _inside(dest: str, rel: str) -> str:
    path = os.path.normpath(os.path.join(dest, rel))
    if rel.startswith("/") or not path.startswith(dest.rstrip("/") + "/"):
        raise ValueError(f"refusing a path outside the destination: {rel!r}")
    if os.path.relpath(path, dest).split(os.sep)[0] == STATE:
        raise ValueError(f"refusing a path inside cpuaccel's state folder: {rel!r}")
    return path


def _real_folder(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _rel(dest: str, rel: str) -> str:
    """``rel`` checked (``_inside``) and normalised, for a walk by descriptors."""
    return os.path.relpath(_inside(dest, rel), dest).replace(os.sep, "/")


def _prepare(dest: str) -> None:
    """DEST and its state folders, real folders all (a link in their place is replaced)."""
    os.makedirs(dest, exist_ok=True)
    root = open_folder(dest)
    try:
        way = parent_of(root, f"{STATE}/{RSYNC_TMP}/-", create=True)
        assert way is not None  # create=True: every folder on the way is made
        os.close(way[0])
    finally:
        os.close(root)


def _entry_here(root: int, dest: str, rel: str, cache: dict[str, Any]) -> Entry | None:
    """rel's entry, or None when it is missing or reached only through a link."""
    way = parent_of(root, _rel(dest, rel), create=False)
    if way is None:
        return None
    try:
        st = lstat_at(*way)
        return None if st is None else entry_at(*way, os.path.join(dest, rel), st, cache)
    finally:
        os.close(way[0])


def apply(dest: str, prune: set[str], stream: BinaryIO, header: Any = None) -> dict[str, Any]:
    """The apply request (its header read from the stream unless given)."""
    header = loads(stream.readline()) if header is None else header
    expected = {k: tuple(v) for k, v in header["manifest"].items()}
    _prepare(dest)
    written = unpack(dest, stream, functools.partial(_rel, dest)) if header.get("tar") else 0
    delete(dest, header.get("delete", []), functools.partial(_rel, dest))
    state = os.path.join(dest, STATE)
    cache = _load_cache(state)
    trusted = {rel: expected[rel] for rel in header.get("trusted", []) if rel in expected}
    # One walk: leftovers of an interrupted sync removed (only the elected writer applies,
    # so nothing else is in flight), every entry described as a scan would describe it.
    cut = rsync_leftover_test(expected) if is_unfinished(state) else None
    found = _clean(dest, prune, cache, trusted, cut)
    mismatches = [rel for rel, want in expected.items() if found.get(rel) != want]
    if mismatches:  # also reached by descriptors where the walk does not go (a venv...)
        mismatches = _still_differ(dest, expected, mismatches, cache)
    _save_cache(state, {k: v for k, v in cache.items() if k.startswith(dest + "/")})
    digest = manifest_hash(expected)
    tree = None
    if not mismatches:
        mark_finished(state)
        write_atomic(os.path.join(state, RECORD), digest.encode() + b"\n")
        # Every source entry was just verified: when the walk found nothing else, the
        # tree is the manifest's, and its hash the digest (no entry taken twice).
        if found.keys() == expected.keys():
            tree = {"hash": digest, "fsid": _fsid(state, create=True)}
        else:
            tree = scan(dest, prune, create=True)  # stats only: every hash is cached by now
    return {
        "hash": digest,
        "mismatches": sorted(mismatches)[:50],
        "written": written,
        # The whole tree's hash (extra files included) and where it lives, for the
        # controller's memory of this node (cpuaccel.projectsync.memory).
        "tree_hash": tree["hash"] if tree else None,
        "fsid": tree["fsid"] if tree else None,
    }


def _still_differ(
    dest: str, expected: dict[str, Entry], rels: list[str], cache: dict[str, Any]
) -> list[str]:
    """Of ``rels``, those whose entry, reached from DEST by descriptors (never through a
    link), is not the expected one."""
    differ = []
    root = open_folder(dest)
    try:
        for rel in rels:
            try:
                got = _entry_here(root, dest, rel, cache)
            except OSError:
                got = None
            if got != expected[rel]:
                differ.append(rel)
    finally:
        os.close(root)
    return differ


def answer(
    mode: str, raw: str, options: list[str], stdin: BinaryIO, keep: Any = None, by: Any = apply
) -> dict[str, Any]:
    """MODE DEST [--expect=H] [--workdir=W] [PRUNE...]: the request's answer (``look``
    also from the ``prelaunch`` program); ``keep`` goes to scan, ``by`` applies."""
    expect = next((a[9:] for a in options if a.startswith("--expect=")), None)
    workdir = next((a[10:] for a in options if a.startswith("--workdir=")), None)
    prune = {a for a in options if not a.startswith("--")}
    dest, refused = resolve(raw, workdir)
    if refused is not None:  # before anything is created, written or deleted
        return {"dest": dest, "refused": refused}
    if mode == "apply":
        return by(dest, prune, stdin)  # type: ignore[no-any-return]
    return scan(dest, prune, create=(mode == "scan"), expect=expect, keep=keep)


def main() -> None:
    import json

    # After BOOT's LENGTH (cpuaccel.connectors.programs); look only (see the module's doc)
    if sys.argv[2:3] != ["look"] or len(sys.argv) < 4:
        sys.stderr.write("tree: usage: look DEST [--expect=H] [--workdir=W] [PRUNE...]\n")
        raise SystemExit(64)
    result = answer("look", sys.argv[3], sys.argv[4:], sys.stdin.buffer)
    sys.stdout.write(json.dumps(result) + "\n")
