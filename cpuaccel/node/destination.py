"""Where a sync may write: the node's own verdict on the destination, as it resolves there.

Part of cpuaccel's node package (see ``cpuaccel.node``), carried by the sync receiver
(``tree``): stdlib only, Python 3.8+. Only the node knows what ``--dest`` means: its
``~``, its links, its ``..``, its home and workdir. The controller's check of the text
(cpuaccel.projectsync.location) is an early, cheap refusal; this one is what counts, and it
runs before the sync changes anything on any node (cpuaccel.projectsync.engine asks every node
first).
"""

from __future__ import annotations

import os

# A sync owns its destination (``--delete`` empties it of all the source lacks; a file
# where the node has a folder replaces that folder), so it must never be one of these
# system folders, nor a folder directly in one (/usr/local, /etc/ssh, /home/alice,
# /var/lib ...). Any top-level folder is refused anyway (at least two levels deep): see
# ``refusal``.
SYSTEM = frozenset(
    {
        "usr", "etc", "var", "boot", "opt", "bin", "sbin", "proc", "sys", "dev", "run",
        "root", "home", "srv", "mnt", "media", "snap", "nix",
        "lib", "lib32", "lib64", "libx32", "libexec",
    }
)  # fmt: skip


def _at_or_above(dest: str, folder: str | None) -> bool:
    return bool(folder) and (dest == folder or (folder or "").startswith(dest.rstrip("/") + "/"))


def refusal(dest: str, homes: list[str], workdir: str | None) -> str | None:
    """Why a sync must not own ``dest``, or None. ``dest``, ``homes`` and ``workdir``
    are resolved paths (absolute, no link, no ``..``), as ``resolve`` gives them."""
    if not dest.startswith("/") or os.path.normpath(dest) != dest:
        return "it is not an absolute, resolved path"
    for home in homes:
        if _at_or_above(dest, home):
            return f"it is the home folder {home} or a folder above it"
        name = dest[len(home) + 1 :] if dest.startswith(home + "/") else ""
        if name.startswith(".") and "/" not in name:  # ~/.ssh, ~/.config ...
            return f"it is the hidden folder {name} of the home folder {home}"
    if _at_or_above(dest, workdir):
        return f"it is cpuaccel's workdir {workdir} or a folder above it (runs, other projects)"
    parts = [p for p in dest.split("/") if p]
    if len(parts) < 2:
        return "it is a top-level folder"
    if len(parts) == 2 and parts[0] in SYSTEM:
        return f"it is a system folder (/{parts[0]} or a folder directly in it)"
    return None


def resolve(raw: str, workdir: str | None) -> tuple[str, str | None]:
    """(``raw`` resolved on this node, why a sync must not own it or None)."""
    expanded = os.path.expanduser(raw)
    dest = os.path.realpath(expanded)
    if not expanded.startswith("/"):
        return dest, f"{raw!r} is not an absolute path (nor one below ~/)"
    homes = {os.path.realpath(os.path.expanduser("~"))}
    try:
        import pwd  # HOME may differ from the account's home: protect both

        homes.add(os.path.realpath(pwd.getpwuid(os.getuid()).pw_dir))
    except (ImportError, KeyError):
        pass
    homes.discard("/")  # a home of "/" (some service accounts) makes every path "below" it
    work = os.path.realpath(os.path.expanduser(workdir)) if workdir else None
    return dest, refusal(dest, sorted(homes), work)
