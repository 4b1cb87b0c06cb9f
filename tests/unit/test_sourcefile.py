"""read_source, the one reader of the files cpuaccel takes as input: a regular file only
(never a FIFO or a device), text whose bad bytes are named by line, a bound on its size,
and an unreadable file named."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cpuaccel.errors import InventoryError, SourceError
from cpuaccel.sourcefile import read_source


@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        (lambda p: os.mkfifo(p), "is a FIFO (named pipe), not a regular file"),
        (lambda p: p.symlink_to("/dev/null"), "is a character device (/dev/null)"),
        (lambda p: p.mkdir(), "is a directory, not a file"),
        (lambda p: None, "inventory file not found"),
        (lambda p: p.symlink_to(p.parent / "gone"), "inventory file not found"),
    ],
)
def test_read_source_refuses_what_is_not_a_regular_file(
    tmp_path: Path, make: Callable[[Path], object], fragment: str
) -> None:
    path = tmp_path / "inv.yaml"
    make(path)
    with pytest.raises(InventoryError) as info:
        read_source(path, InventoryError, "inventory file", "pass a file")
    assert info.value.source == str(path)
    assert fragment in info.value.message
    assert info.value.hint == "pass a file"


def test_read_source_reads_text_and_names_the_line_of_bad_bytes(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_bytes("a: 1\nb: é\n".encode())
    assert read_source(path, SourceError, "inventory file", "x") == "a: 1\nb: é\n"
    path.write_bytes(b"a: 1\nb: \xe9\n")
    with pytest.raises(SourceError) as info:
        read_source(path, SourceError, "inventory file", "x")
    assert info.value.line == 2
    assert "cannot read the inventory file" in info.value.message


def test_read_source_stops_past_its_limit(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_bytes(b"#" * (3 * 1024 * 1024))
    with pytest.raises(SourceError, match="larger than 2 MiB"):
        read_source(path, SourceError, "inventory file", "x", limit=2 * 1024 * 1024)
    assert len(read_source(path, SourceError, "inventory file", "x", limit=None)) == 3 << 20


def test_read_source_names_an_unreadable_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text("a: 1\n")
    path.chmod(0)
    if os.geteuid() == 0:  # root reads any file (CI runs as root): the OS's answer instead
        real_open = os.open

        def denied(name: Any, *args: Any, **kwargs: Any) -> int:
            if str(name) == str(path):
                raise PermissionError(13, "Permission denied", str(name))
            return real_open(name, *args, **kwargs)

        monkeypatch.setattr(os, "open", denied)
    with pytest.raises(SourceError, match="cannot read the inventory file: Permission denied"):
        read_source(path, SourceError, "inventory file", "x")
