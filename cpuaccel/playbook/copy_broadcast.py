"""A copy task's large source file, sent to all of the task's hosts through one broadcast.

copy sends a file's content in each host's request: every byte leaves the controller once
per node. Before the task's per-host runs, the strategy hands this step the hosts whose
task is ready to run (arguments rendered, ``when`` true, no become, not in check mode).
Each node says what is at the task's dest (the ``stat`` request: where ``~`` resolves,
the folder it goes in, and whether the file there is this one already, by size then
sha1). A source worth a broadcast (cpuaccel.connectors.broadcast_policy) that two nodes
or more lack goes through one (cpuaccel.connectors.broadcast): it takes its name on a
node only after its sha256 was checked there, with the task's mode (a new file's, per
the node's umask, without one). Each host's own run then finds it equal (copy's probe: its sha1)
and sends nothing.

A node whose dest is a folder, whose folder is missing, or that keeps an existing file
(``force: false``) is left to its own run, which says so as copy does. A node the
broadcast failed is named in a note; its own run sends the file as usual.

Which nodes got it is left on their HostContext (``broadcast``) for the task's result.
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cpuaccel.connectors import broadcast, broadcast_policy
from cpuaccel.errors import CpuaccelError
from cpuaccel.executor import fan_out
from cpuaccel.node.moduleutil import want_mode
from cpuaccel.playbook.actions import ActionError, copy_dest, copy_source, source_sha1
from cpuaccel.playbook.preparing import Caster
from cpuaccel.playbook.session import HostContext

NEW_FILE = -1  # a mode for the relay: what a new file gets there (0o666 less the umask)


@dataclass
class Target:
    """One node that lacks the file: the folder it goes in, as it resolves there."""

    ctx: HostContext
    folder: str


def prepare(ready: Sequence[tuple[HostContext, dict[str, Any]]], cast: Caster) -> None:
    """One broadcast per source file and name at dest that two hosts or more copy."""
    groups: dict[tuple[str, str, int], list[tuple[HostContext, dict[str, Any], str]]] = {}
    for ctx, args in ready:
        if args.get("content") is not None or not broadcast_policy.relays(ctx.host):
            continue
        try:
            src = copy_source(ctx, args)
        except (ActionError, OSError):
            continue  # its own run says why
        dest = copy_dest(args, src)
        try:
            mode = want_mode(args)  # as the node's copy reads it
        except (TypeError, ValueError):
            continue  # a mode the node's copy judges
        wanted = NEW_FILE if mode is None else mode
        key = (str(src.resolve()), posixpath.basename(dest), wanted)
        groups.setdefault(key, []).append((ctx, args, dest))
    for (path, name, kept), members in groups.items():
        if len(members) >= 2:
            _one_file(Path(path), name, kept, members, cast)


def _one_file(
    src: Path,
    name: str,
    mode: int,
    members: list[tuple[HostContext, dict[str, Any], str]],
    cast: Caster,
) -> None:
    size = src.stat().st_size
    sizes = {name: size}
    every = {ctx.host.name: sizes.keys() for ctx, _, _ in members}
    if not broadcast_policy.worth(every, sizes) or not name or name in (".", ".."):
        return
    sha1 = source_sha1(src)

    def look(member: tuple[HostContext, dict[str, Any], str]) -> Target | None:
        ctx, args, dest = member
        try:
            return survey(ctx, dest, bool(args.get("force", True)), size, sha1)
        except CpuaccelError:
            return None  # unreachable, or the node's answer was bad: its own run says so

    targets = [t for t in fan_out(members, look, forks=len(members)) if t is not None]
    if not broadcast_policy.worth({t.ctx.host.name: sizes.keys() for t in targets}, sizes):
        return
    sent = broadcast.payload_file(str(src), name)
    if sent.size != size:
        return  # the source changed while we looked: each host's run sends what is there
    kept = mode & 0o777 if mode >= 0 else NEW_FILE
    file = broadcast.PayloadFile(sent.rel, sent.local, sent.size, sent.sha256, kept)
    done = cast.deliver([(t.ctx, t.folder) for t in targets], [file])
    broadcast_policy.fall_back(done, cast.note, "copy sends it directly")


def survey(ctx: HostContext, dest: str, force: bool, size: int, sha1: str) -> Target | None:
    """The folder of ``dest`` on the node when the file there is not this one and copy
    would write it; else None (copy's own run does what there is to do, or fails)."""
    there = ctx.request("stat", {"path": dest, "get_checksum": False})
    info = there.get("stat")
    if there.get("failed") or not isinstance(info, dict):
        return None
    path = info.get("path")
    if not isinstance(path, str) or not path.startswith("/") or path.endswith("/"):
        return None
    if info.get("exists"):
        if info.get("isdir") or not force:
            return None
        if info.get("isreg") and info.get("size") == size:
            summed = ctx.request("stat", {"path": path}).get("stat")
            if isinstance(summed, dict) and summed.get("checksum") == sha1:
                return None  # the node holds it: copy's probe finds it so
    folder = posixpath.dirname(path)
    parent = ctx.request("stat", {"path": folder, "follow": True}).get("stat")
    if not isinstance(parent, dict) or not parent.get("isdir"):
        return None  # copy refuses a missing folder; a broadcast would make it
    # the folder as it resolves there: the relay reaches its root without following a link
    resolved = ctx.request("destination", {"path": folder, "workdir": ctx.host.workdir})
    real = resolved.get("dest")
    if resolved.get("failed") or not isinstance(real, str) or not real.startswith("/"):
        return None
    return Target(ctx, real)
