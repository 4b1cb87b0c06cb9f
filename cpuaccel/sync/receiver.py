"""The sync receiver's protocol, from the controller: the node program ``tree``
(cpuaccel.node.tree) called in one mode on one destination, and the apply request."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, BinaryIO

from cpuaccel.connectors import programs
from cpuaccel.connectors.base import Connector
from cpuaccel.sync.ignore import PRUNE_NAMES
from cpuaccel.sync.location import DestinationRefused
from cpuaccel.sync.manifest import SourceManifest

REMOTE_TIMEOUT = 3600.0


def call_remote(
    conn: Connector,
    mode: str,
    dest: str,
    payload: bytes | BinaryIO = b"",
    expect: str | None = None,
) -> dict[str, Any]:
    """Run the node program in MODE on DEST; ``payload`` follows it on stdin.

    With ``expect`` (a manifest hash), a scan leaves its entries out (None) when the
    node's tree has exactly that hash: an unchanged node answers in a few bytes. Raises
    DestinationRefused when the node will not sync into DEST as it resolves there.
    """
    value = programs.call(
        conn, "tree", words(mode, dest, conn.host.workdir, expect), payload,
        what=f"syncing to {dest}", timeout=REMOTE_TIMEOUT,
    )  # fmt: skip
    return checked(conn.host.name, value)


def words(mode: str, dest: str, workdir: str, expect: str | None = None) -> list[str]:
    """The request words of the ``tree`` program (also sent in one srun step to every
    node of an allocation: launch/preflight.py)."""
    found = [mode, dest, *([f"--expect={expect}"] if expect else [])]
    found.append(f"--workdir={workdir}")  # the node resolves it, to protect it
    return [*found, *PRUNE_NAMES]


def checked(host: str, value: dict[str, Any]) -> dict[str, Any]:
    """The program's answer, refused destinations raised, entries as tuples."""
    if value.get("refused"):
        raise DestinationRefused(host, str(value["dest"]), str(value["refused"]))
    _tupled(value)
    if "scan" in value:  # apply's answer when the node's tree was not the expected one
        _tupled(value["scan"])
    return value


def _tupled(report: dict[str, Any]) -> None:
    """Entries as tuples, as the source's are (JSON brings lists)."""
    if report.get("entries") is not None:
        report["entries"] = {rel: tuple(entry) for rel, entry in report["entries"].items()}


def request(
    source: SourceManifest, deleted: Sequence[str], *, tar: bool, trusted: Sequence[str] = ()
) -> bytes:
    """The apply request: the manifest to verify against, what to delete, and which
    entries rsync delivered (verified by rsync's own checksums, see cpuaccel.node.tree.apply)."""
    header = {
        "manifest": source.entries,
        "delete": list(deleted),
        "tar": tar,
        "trusted": list(trusted),
    }
    return json.dumps(header).encode() + b"\n"
