"""A synchronize task's large files, sent to all of the task's hosts through one broadcast.

synchronize is rsync from the controller, host by host: every byte leaves the controller
once per node, which for a wheelhouse pushed to many nodes is most of provision's time.
Before the task's per-host runs, the strategy hands this step the hosts whose task is
ready to run (arguments rendered, ``when`` true, no become, not in check mode). Each node
lists its destination (the ``tree`` request: rsync -a's quick check, size and mtime).
The large regular files that two nodes or more lack, when they are worth a broadcast
(cpuaccel.connectors.broadcast_policy), go through one (cpuaccel.connectors.broadcast):
each lands under its name only after its sha256 was checked on the node, with the
source's mode and mtime. Each host's rsync then finds them equal and sends the rest (and
deletes, with ``delete``). A node the broadcast failed is named in a note, and its rsync
compares contents (--checksum): a file may have taken its name there whose report was
not believed.

Which files each node got is left on its HostContext (``broadcast``) for the task's
result: rsync itemizes only what it sent itself.
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
from cpuaccel.playbook.actions import listing, plain_excludes
from cpuaccel.playbook.preparing import Caster
from cpuaccel.playbook.session import HostContext


@dataclass
class Survey:
    """One node's copy of the folder: where it is, and what it lacks."""

    ctx: HostContext
    dest: str  # as it resolves on the node (links and ~ resolved there)
    lacks: frozenset[str]  # the large files its copy lacks or holds another version of


def prepare(ready: Sequence[tuple[HostContext, dict[str, Any]]], cast: Caster) -> None:
    """One broadcast per source folder that two hosts or more push, of the large files
    they lack."""
    groups: dict[tuple[str, tuple[str, ...]], list[tuple[HostContext, dict[str, Any]]]] = {}
    for ctx, args in ready:
        src = Path(str(args["src"])).expanduser()
        excludes = plain_excludes(args)
        if excludes is None or not broadcast_policy.relays(ctx.host):
            continue  # rsync options only rsync knows, or a host the others cannot reach
        if src.is_dir():
            groups.setdefault((str(src.resolve()), tuple(excludes)), []).append((ctx, args))
    for (folder, names), members in groups.items():
        if len(members) >= 2:
            _one_folder(Path(folder), list(names), members, cast)


def _one_folder(
    src: Path,
    excludes: list[str],
    members: list[tuple[HostContext, dict[str, Any]]],
    cast: Caster,
) -> None:
    local = {
        rel: entry
        for rel, entry in listing(src, excludes).items()
        if broadcast_policy.large(entry[0]) and (src / rel).is_file()
        and not (src / rel).is_symlink()
    }  # fmt: skip
    sizes = {rel: entry[0] for rel, entry in local.items()}
    if not broadcast_policy.worth({ctx.host.name: sizes.keys() for ctx, _ in members}, sizes):
        return

    def look(member: tuple[HostContext, dict[str, Any]]) -> Survey | None:
        ctx, args = member
        try:
            return survey(ctx, args, src, local)
        except CpuaccelError:
            return None  # unreachable, or the node's answer was bad: its own run says so

    targets = [t for t in fan_out(members, look, forks=len(members)) if t is not None and t.lacks]
    if not broadcast_policy.worth({t.ctx.host.name: t.lacks for t in targets}, sizes):
        return
    wanted = sorted(set().union(*(t.lacks for t in targets)))
    files = [broadcast.payload_file(str(src / rel), rel, keep_mtime=True) for rel in wanted]
    if any(f.size != local[f.rel][0] for f in files):
        return  # the source changed while we looked: rsync sends what is there now
    keep = {t.ctx.host.name: t.lacks for t in targets}
    done = cast.deliver([(t.ctx, t.dest) for t in targets], files, keep)
    by_name = {t.ctx.host.name: t for t in targets}
    for name in broadcast_policy.fall_back(done, cast.note, "rsync checks it all"):
        by_name[name].ctx.recheck = True


def survey(
    ctx: HostContext, args: dict[str, Any], src: Path, local: dict[str, list[int]]
) -> Survey | None:
    """Where the node's copy is, and which of the large files it lacks."""
    dest = str(args["dest"])
    verdict = ctx.request("destination", {"path": dest, "workdir": ctx.host.workdir})
    resolved = verdict.get("dest")
    if verdict.get("failed") or not isinstance(resolved, str) or not resolved.startswith("/"):
        return None
    if args.get("delete") and verdict.get("refused"):
        return None  # the task refuses it, with the reason
    # rsync's rule: "src/" fills dest; "src" (no slash) lands as dest/<name of src>
    root = resolved if str(args["src"]).endswith("/") else posixpath.join(resolved, src.name)
    there = ctx.request("tree", {"path": root})
    if there.get("failed"):
        return None
    remote = there.get("files") or {}
    if not isinstance(remote, dict):
        return None
    lacks = frozenset(
        rel
        for rel, entry in local.items()
        if _differs(remote.get(rel), entry) and not _is_folder(remote.get(rel))
    )
    return Survey(ctx, posixpath.normpath(root), lacks)


def _differs(there: object, here: list[int]) -> bool:
    """What rsync -a's quick check would send: another size or mtime, or no file."""
    return not (isinstance(there, list) and len(there) >= 2 and there[:2] == here[:2])


def _is_folder(there: object) -> bool:
    """A folder (or a listing not understood) where the file goes: rsync's to replace."""
    return there is not None and not (
        isinstance(there, list) and len(there) >= 2 and isinstance(there[0], int) and there[0] >= 0
    )
