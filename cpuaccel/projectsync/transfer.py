"""Moving changed entries to a node: rsync when both ends have it, else a tar stream.

Either way files reach their real paths only by rename (rsync's temporary files live in
the destination's ``.cpuaccel/tmp``, or beside the file in a destination the sync has
just made; the tar stream's are renamed by the node program),
and the node verifies the result against the manifest afterwards.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from typing import BinaryIO

from cpuaccel.connectors.base import Connector
from cpuaccel.errors import HostError
from cpuaccel.node.tree import RSYNC_TMP, STATE
from cpuaccel.projectsync.manifest import SourceManifest

# Below this many changed bytes the tar stream on the already-open connection wins: rsync
# costs another SSH handshake and its own file list before the first byte moves.
RSYNC_MIN_BYTES = 4 << 20
# rsync reads --files-from one byte a system call, a poll before each: tens of thousands
# of calls a node for a few thousand paths, which add up across a sync's nodes. The
# same entries named as its arguments cost no list to read; they may take this share of
# the system's argument space (ARG_MAX), beyond which the list goes on stdin again.
ARGV_SHARE = 4
NAMED = ["--no-recursive", "--dirs", "--relative"]  # what --files-from implies, as flags
LISTED = ["--from0", "--files-from=-"]


@functools.cache
def have_local_rsync() -> bool:
    return shutil.which("rsync") is not None


def rsync_push(
    conn: Connector,
    source: SourceManifest,
    changed: Sequence[str],
    dest: str,
    copy_links: bool,
    on_bytes: Callable[[int], None] | None = None,
    temp_dir: bool = True,
) -> None:
    """Send the changed entries (grouped by the local folder they come from) with the
    connector's rsync; its temporary files in the state folder unless ``temp_dir`` is
    False (a destination this sync made: node/unfinished.py)."""
    by_root: dict[str, list[str]] = {}
    for rel in changed:
        by_root.setdefault(source.root_of[rel], []).append(rel)
    # --ignore-times: every listed file differs by its content hash; rsync's own quick
    # check (size and mtime) would skip one rewritten at the same size within the same
    # mtime, and the node, trusting what rsync delivered, would keep the old bytes.
    flags = ["-a", "--ignore-times"]
    if temp_dir:
        flags.append(f"--temp-dir={STATE}/{RSYNC_TMP}")
    flags.append("--out-format=%l")  # one line per file sent: its size, for on_bytes
    if copy_links:
        flags.append("--copy-unsafe-links")

    def sent(line: str) -> None:
        if on_bytes is not None and line.strip().isdigit():
            on_bytes(int(line))

    for root, rels in by_root.items():
        named = as_arguments(root, rels)
        if named is not None:
            result = conn.rsync([*flags, *NAMED], named, dest + "/", on_line=sent)
        else:
            listing = b"\0".join(os.fsencode(rel) for rel in rels) + b"\0"
            folder = root.rstrip("/") + "/"
            result = conn.rsync([*flags, *LISTED], folder, dest + "/", stdin=listing, on_line=sent)
        if not result.ok:
            raise HostError(
                conn.host.name,
                f"rsync exited {result.exit_code}: {result.error}",
                hint="check free disk and permissions at the destination",
            )


def as_arguments(root: str, rels: Sequence[str]) -> list[str] | None:
    """``ROOT/./REL`` for each entry (``--relative`` keeps the part after ``/./``, so the
    entry lands at REL under the destination, its folders made as --files-from makes
    them), or None when they would take more than ARG_MAX / ARGV_SHARE. ROOT is made
    absolute: no ``/./`` in it, and no argument that rsync could read as ``HOST:PATH``."""
    base = os.path.abspath(root)
    if any(rel in ("", ".") or rel.startswith("/") for rel in rels):
        return None  # not below ROOT ("ROOT/./." would send the folder's files, all of them)
    named = [f"{base}/./{rel}" for rel in rels]
    room = os.sysconf("SC_ARG_MAX") // ARGV_SHARE
    if sum(len(os.fsencode(arg)) + 9 for arg in named) > room:  # + NUL and the pointer
        return None
    return named


def tar_stream(source: SourceManifest, changed: Sequence[str], header: bytes) -> BinaryIO:
    """The header line then a tar of the changed entries, spooled (memory, then disk)."""
    import tarfile  # here: start-up time that a no-change sync never needs

    spool = tempfile.SpooledTemporaryFile(max_size=64 << 20)  # noqa: SIM115 - the caller closes it
    spool.write(header)
    with tarfile.open(fileobj=spool, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for rel in changed:
            entry = source.entries[rel]
            info = tar.gettarinfo(source.local[rel], arcname=rel)
            if entry[0] in ("f", "d") and info.type == tarfile.SYMTYPE:
                # --copy-links: send what the link points to, as a file or a folder
                info = tar.gettarinfo(os.path.realpath(source.local[rel]), arcname=rel)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if info.isfile():
                with open(source.local[rel], "rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    spool.seek(0)
    return spool  # type: ignore[return-value]
