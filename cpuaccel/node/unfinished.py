"""A destination a sync made and has not finished yet (part of the ``tree`` programs, see
``cpuaccel.node``).

rsync into a folder cpuaccel already knows writes its temporary files in the state
folder (``--temp-dir``), so that an interrupted sync never leaves names of rsync's
choosing in the user's tree; that costs rsync several more system calls a file (it
opens the temporary path component by component), a large share of its CPU on a first
sync of many files. A destination the sync itself has just made holds nothing of the
user's, so rsync writes there with its default: ``.NAME.XXXXXX`` beside NAME, renamed
into place (a file still reaches its real path only whole). The scan that makes the
folder marks it (``MARK`` in the state folder); the apply that verifies the tree removes
the mark.
A later apply that still finds the mark (the first sync was cut: a node crashed, or
rsync was killed before it could remove its file) removes, with the interrupted sync's
other leftovers, the files named as rsync names its temporary ones beside a file of
the manifest, and nothing else.
"""

from __future__ import annotations

import os
import re
import stat

from cpuaccel.node.common import create_new

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time: the node pays for every import
    from collections.abc import Callable
    from typing import Any

MARK = "unfinished"  # in the destination's state folder
# rsync's temporary name (receiver.c get_tmpname): "." + the name (cut to fit NAME_MAX)
# + "." + six characters of mkstemp's.
_RSYNC_TEMP = re.compile(r"\.(.+)\.[A-Za-z0-9]{6}", re.DOTALL)
_CUT = 200  # a shorter middle part is the whole name, never a cut one


def mark_made(state: str) -> None:
    """Mark the destination whose state folder is ``state`` as made by this sync (nodes
    that share the folder may both have found it missing: marked once)."""
    try:
        os.close(create_new(os.path.join(state, MARK)))
    except FileExistsError:
        pass


def is_unfinished(state: str) -> bool:
    try:
        return stat.S_ISREG(os.lstat(os.path.join(state, MARK)).st_mode)
    except OSError:
        return False


def mark_finished(state: str) -> None:
    try:
        os.unlink(os.path.join(state, MARK))
    except FileNotFoundError:
        pass


def rsync_leftover_test(manifest: dict[str, Any]) -> Callable[[str, os.stat_result], bool]:
    """Whether a path (relative, '/'-separated) and its lstat are one of rsync's
    temporary files beside a manifest file: a regular file, not in the manifest, named
    ``.NAME.XXXXXX`` (NAME a file of the manifest in the same folder, or its start when
    rsync cut a long name)."""
    siblings: dict[str, set[str]] = {}
    for rel, entry in manifest.items():
        if entry[0] == "f":
            folder, _, name = rel.rpartition("/")
            siblings.setdefault(folder, set()).add(name)

    def test(rel: str, st: os.stat_result) -> bool:
        if rel in manifest or not stat.S_ISREG(st.st_mode):
            return False
        folder, _, name = rel.rpartition("/")
        found = _RSYNC_TEMP.fullmatch(name)
        if found is None:
            return False
        middle, names = found.group(1), siblings.get(folder, set())
        return middle in names or (len(middle) >= _CUT and any(n.startswith(middle) for n in names))

    return test
