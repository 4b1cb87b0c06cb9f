"""The sync receiver kept open on one channel: ``tree``'s modes as requests, one
interpreter a node for a whole sync (the node program ``treesession``).

It runs as ``python -c BOOT LENGTH DEST [--workdir=W] [PRUNE...]`` and then reads, one at
a time, a request line ``{"mode": "look" | "scan" | "apply", "expect": H, "length": N}``
followed by N bytes of payload (apply's header line and tar stream); each answer is one
JSON line, as ``tree`` gives it. EOF on stdin ends it, having changed nothing more.

Why: a sync first asks every node to look, changing nothing, and only once every node
has accepted its destination sends the changes. One interpreter per node serves both
phases, so a change costs no second session, interpreter start or program compile. Every
request resolves and judges DEST again (``tree.answer``), right before it acts.

An apply to a known tree (its header names the ``base`` the controller remembers) here
checks the base against the look this interpreter made: the tree is walked again, stats
only, and must match the look's walk path for path (type, mode, size, times, inode);
then the look's entries and hash stand. After unpacking, only the paths written and
deleted are stat-ed again (by descriptors, never through a link), the tree's hash is
recomputed from the entries in memory, and it must be the source's. Anything unusual
(the tree changed since the look, a folder deleted or replaced, a name the walk would
skip) takes ``tree.apply``'s way: a whole scan before and after.
"""

from __future__ import annotations

import functools
import json
import os
import stat
import sys

from cpuaccel.node.boundedjson import loads
from cpuaccel.node.common import TMP_MARK, write_atomic
from cpuaccel.node.jobprocs import live_runs
from cpuaccel.node.nofollow import delete, lstat_below, open_folder, unpack
from cpuaccel.node.tree import (
    RECORD,
    RSYNC_TMP,
    STATE,
    _fsid,
    _prepare,
    _rel,
    _save_cache,
    _walk,
    answer,
    apply,
    entry_of,
    manifest_hash,
    scan,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, BinaryIO

MAX_HEADER = 1 << 20  # a request line is small; a longer one is not ours
REQUEST_BOUND = 3600  # seconds a request may take, its wait included (``serve``)


class Payload:
    """The N bytes of payload that follow a request, and not one more."""

    def __init__(self, stream: BinaryIO, length: int) -> None:
        self._stream = stream
        self.left = length

    def read(self, size: int = -1) -> bytes:
        size = self.left if size < 0 else min(size, self.left)
        data = self._stream.read(size) if size else b""
        self.left -= len(data)
        return data

    def readline(self) -> bytes:
        line = self._stream.readline(self.left)
        self.left -= len(line)
        return line

    def drain(self) -> None:
        """Skip what the request's handler left unread (a tar's padding, an unused tar)."""
        while self.left and self.read(1 << 16):
            pass


def _signature(found: dict[str, os.stat_result]) -> dict[str, tuple[int, ...]]:
    return {
        rel: (st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
        for rel, st in found.items()
    }


def _still_as_looked(dest: str, prune: set[str], looked: dict[str, Any]) -> bool:
    """The tree is path for path as the look saw it, with no leftovers."""
    found, leftovers = _walk(dest, prune)
    try:
        leftovers += len(os.listdir(os.path.join(dest, STATE, RSYNC_TMP)))
    except OSError:
        pass
    return not leftovers and _signature(found) == looked["signature"]


def _restat(
    dest: str, entries: dict[str, Any], touched: list[str], prune: set[str], cache: dict[str, Any]
) -> bool:
    """Entries of the touched paths (and their folders) taken again, ``cache`` (the
    look's hash cache, trimmed to its walk) updated and saved; False when that cannot
    stand for a walk (a folder gone or replaced, a name a walk skips)."""
    root = open_folder(dest)
    try:
        for rel in touched:
            parts = rel.split("/")
            if any(p in prune or TMP_MARK in p or p == "pyvenv.cfg" for p in parts):
                return False
            for depth in range(1, len(parts) + 1):  # a folder made on the way is new
                here = "/".join(parts[:depth])
                st = lstat_below(root, here)
                old = entries.get(here)
                if (
                    old is not None
                    and old[0] == "d"
                    and (st is None or not stat.S_ISDIR(st.st_mode))
                ):
                    return False  # what was below it is gone too: a walk says what is left
                if st is None:
                    entries.pop(here, None)
                else:
                    entries[here] = entry_of(os.path.join(dest, here), st, cache)
    finally:
        os.close(root)
    _save_cache(os.path.join(dest, STATE), cache)
    return True


def apply_known(
    dest: str, prune: set[str], stream: Any, looked: dict[str, Any] | None
) -> dict[str, Any]:
    """Apply a request; a change to the tree just looked at without walking it twice."""
    header = loads(stream.readline())
    base = header.get("base")
    _prepare(dest)  # DEST and its state folder real ones (a link there is replaced)
    if (
        base is None
        or looked is None
        or looked["dest"] != dest
        or looked["hash"] != base
        or looked["fsid"] != header.get("fsid")
        or _fsid(os.path.join(dest, STATE), create=False) != header.get("fsid")
        or not _still_as_looked(dest, prune, looked)
    ):
        return (
            _apply_to_scanned(dest, prune, header, stream)
            if base
            else apply(dest, prune, stream, header)
        )
    entries = dict(looked["entries"])
    touched: list[str] = []
    written = unpack(dest, stream, lambda r: _rel(dest, r), touched) if header.get("tar") else 0
    gone = [_rel(dest, rel) for rel in header.get("delete", [])]
    delete(dest, gone, lambda r: _rel(dest, r))
    if _restat(dest, entries, touched + gone, prune, dict(looked["cache"])):
        digest = manifest_hash(entries)
    else:
        digest = scan(dest, prune, create=True)["hash"]
    ok = digest == header["target"]
    if ok:
        write_atomic(os.path.join(dest, STATE, RECORD), digest.encode() + b"\n")
    return {
        "hash": digest,
        "mismatches": [] if ok else ["(the tree's hash differs from the source's)"],
        "written": written,
        "fsid": looked["fsid"],
    }


def _apply_to_scanned(
    dest: str, prune: set[str], header: dict[str, Any], stream: Any
) -> dict[str, Any]:
    """A change to the tree the controller remembers, checked by whole scans: applied
    only if the tree is exactly ``base``, on the filesystem it was then (else what is
    here is reported, changing nothing, and the controller plans from that); verified by
    the new tree's hash (unchanged files from the hash cache, changed ones read again)."""
    now = scan(dest, prune, create=True, expect=header["base"])
    if now["hash"] != header["base"] or now["leftovers"] or now["fsid"] != header["fsid"]:
        return {"base_mismatch": True, "scan": now}
    if not header.get("tar") and not header.get("delete"):
        after, written = now, 0  # nothing to change: the tree just checked is the result
    else:
        written = unpack(dest, stream, lambda r: _rel(dest, r)) if header.get("tar") else 0
        delete(dest, header.get("delete", []), lambda r: _rel(dest, r))
        after = scan(dest, prune, create=True)
    target = header["target"]
    return _verdict(dest, after["hash"], target, written, after["fsid"], after.get("recorded"))


def _verdict(
    dest: str, digest: str, target: str, written: int, fsid: str | None, recorded: Any = None
) -> dict[str, Any]:
    """The answer to an apply to a known tree; the record written when it is the target
    (an unchanged tree, already recorded so, stays untouched)."""
    ok = digest == target
    if ok and recorded != target:
        write_atomic(os.path.join(dest, STATE, RECORD), digest.encode() + b"\n")
    return {
        "hash": digest,
        "mismatches": [] if ok else ["(the tree's hash differs from the source's)"],
        "written": written,
        "fsid": fsid,
    }


def serve(raw: str, options: list[str], stdin: BinaryIO, stdout: Any, bound: int = 0) -> None:
    """Answer requests until EOF; the last look's walk is kept for an apply.

    ``bound`` > 0: SIGALRM's default action ends the program when a request (waiting
    for it, reading its payload, answering it) takes longer, so a controller that
    vanished without closing the connection leaves no receiver waiting for good (the
    controller gives up on an answer after as long: projectsync.receiver.REMOTE_TIMEOUT)."""
    import signal

    looked: dict[str, Any] | None = None
    try:
        while True:
            signal.alarm(bound)
            line = stdin.readline(MAX_HEADER)
            if not line:
                return
            request = loads(line)
            mode, expect, length = request["mode"], request.get("expect"), int(request["length"])
            if mode not in ("look", "scan", "apply") or length < 0:
                raise ValueError(f"not a tree request: {line[:80]!r}")
            payload: Any = Payload(stdin, length)
            keep: dict[str, Any] = {}
            words = [*options, *([f"--expect={expect}"] if expect else [])]
            result = answer(
                mode, raw, words, payload, keep, functools.partial(apply_known, looked=looked)
            )
            looked = _looked(result, keep)  # after an apply, None: a later apply scans again
            if mode == "look" and "refused" not in result:
                # The jobs' processes here: the controller ends those of a run it
                # records as ended (a node lost mid-run keeps its ranks till then).
                result["runs"] = live_runs()
            payload.drain()
            stdout.write(json.dumps(result) + "\n")
            stdout.flush()
    finally:
        signal.alarm(0)


def _looked(result: dict[str, Any], keep: dict[str, Any]) -> dict[str, Any] | None:
    if "refused" in result or "found" not in keep:
        return None
    return {
        "dest": result["dest"],
        "hash": result["hash"],
        "fsid": result["fsid"],
        "entries": keep["entries"],
        "signature": _signature(keep["found"]),
        # The hash cache as the look's walk left it: the file is not read again.
        "cache": keep["cache"],
    }


def main() -> None:
    # After BOOT's LENGTH (cpuaccel.connectors.programs): DEST [--workdir=W] [PRUNE...]
    serve(sys.argv[2], sys.argv[3:], sys.stdin.buffer, sys.stdout, REQUEST_BOUND)
