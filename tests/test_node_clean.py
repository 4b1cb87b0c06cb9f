"""The sync receiver's cleanup of leftover temporary files never acts through a link,
not even one swapped in for a folder between its listing and its removal."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cpuaccel.node import tree
from cpuaccel.node.common import TMP_MARK

LEFTOVER = ".model.bin" + TMP_MARK + "0123456789abcdef"


def _inode(where: Any) -> int:
    return os.fstat(where).st_ino if isinstance(where, int) else os.stat(where).st_ino


def test_a_folder_swapped_for_a_link_mid_clean_leads_nowhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dest, elsewhere = tmp_path / "dest", tmp_path / "elsewhere"
    (dest / "sub").mkdir(parents=True)
    elsewhere.mkdir()
    (dest / "sub" / LEFTOVER).write_text("partial")
    (elsewhere / LEFTOVER).write_text("someone else's file")
    sub = (dest / "sub").stat().st_ino
    real_scandir = os.scandir

    def scandir_then_swap(where: Any = ".") -> Iterator[os.DirEntry[str]]:
        listed = list(real_scandir(where))
        if _inode(where) == sub and not (dest / "sub").is_symlink():
            # Between the listing and the removal: sub moves away, a link takes its name.
            (dest / "sub").rename(dest / "moved")
            (dest / "sub").symlink_to(elsewhere)
        return iter(listed)

    monkeypatch.setattr(os, "scandir", scandir_then_swap)
    tree._clean(str(dest), set())
    assert (elsewhere / LEFTOVER).read_text() == "someone else's file"
    assert not (dest / "moved" / LEFTOVER).exists()  # the real folder's leftover went


def test_leftovers_go_and_links_venvs_and_state_stay(tmp_path: Path) -> None:
    dest, elsewhere = tmp_path / "dest", tmp_path / "elsewhere"
    for folder in (dest / "a" / "b", dest / "venv", dest / tree.STATE / tree.RSYNC_TMP):
        folder.mkdir(parents=True)
    elsewhere.mkdir()
    (elsewhere / LEFTOVER).write_text("keep")
    (dest / "link").symlink_to(elsewhere)
    (dest / "a" / "b" / LEFTOVER).write_text("partial")
    (dest / ("x" + TMP_MARK + "1")).symlink_to(elsewhere / LEFTOVER)  # a link: itself goes
    (dest / "venv" / "pyvenv.cfg").write_text("")
    (dest / "venv" / LEFTOVER).write_text("the venv's own")
    (dest / tree.STATE / tree.RSYNC_TMP / "partial").write_text("rsync's")
    (dest / "keep.txt").write_text("a file")
    tree._clean(str(dest), set())
    assert not (dest / "a" / "b" / LEFTOVER).exists()
    assert not os.path.lexists(dest / ("x" + TMP_MARK + "1"))
    assert (elsewhere / LEFTOVER).read_text() == "keep"
    assert (dest / "venv" / LEFTOVER).exists() and (dest / "keep.txt").exists()
    assert list((dest / tree.STATE / tree.RSYNC_TMP).iterdir()) == []
