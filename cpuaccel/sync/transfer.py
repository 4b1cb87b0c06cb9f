"""Moving changed entries to a node: rsync when both ends have it, else a tar stream.

Either way files reach their real paths only by rename (rsync's temporary files live in
the destination's ``.cpuaccel/tmp``; the tar stream's are renamed by the node program),
and the node verifies the result against the manifest afterwards.
"""

from __future__ import annotations

import functools
import os
import shlex
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable, Sequence
from typing import BinaryIO

from cpuaccel.connectors import openssh
from cpuaccel.connectors.base import ConnectOptions
from cpuaccel.errors import HostError
from cpuaccel.inventory.host import Host
from cpuaccel.node.tree import RSYNC_TMP, STATE
from cpuaccel.sync.manifest import SourceManifest

# Below this many changed bytes the tar stream on the already-open connection wins: rsync
# costs another SSH handshake and its own file list before the first byte moves.
RSYNC_MIN_BYTES = 4 << 20


@functools.cache
def have_local_rsync() -> bool:
    return shutil.which("rsync") is not None


def rsync_push(
    host: Host,
    options: ConnectOptions,
    source: SourceManifest,
    changed: Sequence[str],
    dest: str,
    copy_links: bool,
    on_bytes: Callable[[int], None] | None = None,
) -> None:
    """Send the changed entries (grouped by the local folder they come from) with rsync."""
    by_root: dict[str, list[str]] = {}
    for rel in changed:
        by_root.setdefault(source.root_of[rel], []).append(rel)
    for root, rels in by_root.items():
        argv = [
            "rsync",
            "-a",
            "--from0",
            "--files-from=-",
            f"--temp-dir={STATE}/{RSYNC_TMP}",
            "--out-format=%l",
        ]
        if copy_links:
            argv.append("--copy-unsafe-links")
        if host.is_local:
            target = dest + "/"
        else:
            argv += ["-e", shlex.join(["ssh", *openssh.ssh_options(host, options)])]
            target = openssh.remote_spec(host, dest + "/")
        argv += [root.rstrip("/") + "/", target]
        listing = b"\0".join(os.fsencode(rel) for rel in rels) + b"\0"
        with subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        ) as proc:
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(listing)
            proc.stdin.close()
            for line in proc.stdout:
                if on_bytes is not None and line.strip().isdigit():
                    on_bytes(int(line))
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            code = proc.wait()
        if code != 0:
            last = (err.strip().splitlines() or ["no message"])[-1]
            raise HostError(
                host.name,
                f"rsync exited {code}: {last}",
                hint="check free disk and permissions at the destination",
            )


def tar_stream(source: SourceManifest, changed: Sequence[str], header: bytes) -> BinaryIO:
    """The header line then a tar of the changed entries, spooled (memory, then disk)."""
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
