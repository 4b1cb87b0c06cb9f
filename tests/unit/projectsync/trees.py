"""A tree of files for a sync to take: what the tests of sync, its node side and its
command share."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path


def make_tree(root: Path, files: Mapping[str, str | bytes]) -> Path:
    """Files (with parent folders) below root; a key ending in '/' is an empty folder."""
    root.mkdir(parents=True, exist_ok=True)
    for rel, content in files.items():
        path = root / rel
        if rel.endswith("/"):
            path.mkdir(parents=True, exist_ok=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    return root
