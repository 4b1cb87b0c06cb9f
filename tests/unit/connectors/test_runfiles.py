"""A run's files read from a node that answers what cpuaccel's program never would:
every name and number it sends is checked before a path or a call is made of it."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from cpuaccel.connectors import programs, runfiles
from cpuaccel.errors import HostError

RUN_DIR = "/work/runs/20260101-000000-abcdef"
MTIME = 1_700_000_000.0


class Head:
    """The node as ``programs.call_kept`` reaches it: ``answer`` to every request."""

    def __init__(self) -> None:
        self.host = type("Host", (), {"name": "head0"})()
        self.answer: dict[str, Any] = {}
        self.asked: list[list[str]] = []


@pytest.fixture
def head(monkeypatch: pytest.MonkeyPatch) -> Head:
    node = Head()

    def call_kept(kept: Any, conn: Any, words: list[str], *_: Any, **__: Any) -> dict[str, Any]:
        node.asked.append(list(words))
        return node.answer

    monkeypatch.setattr(programs, "call_kept", call_kept)
    return node


def test_only_names_the_node_would_read_are_listed(head: Head) -> None:
    head.answer = {"files": [
        ["metrics.jsonl", 1, MTIME], ["attempt-1/rank-0.log", 1, MTIME], ["../x", 1, MTIME],
        ["a/b", 1, MTIME], [".hidden", 1, MTIME], ["x\n", 1, MTIME], ["secret.env", 1, MTIME],
        ["a..b", 1, MTIME], ["", 1, MTIME],
    ]}  # fmt: skip
    found = runfiles.list_files(head, RUN_DIR)  # type: ignore[arg-type]
    assert [f.name for f in found or []] == ["metrics.jsonl", "attempt-1/rank-0.log"]
    assert head.asked == [["list", RUN_DIR]]


def test_a_listing_that_is_no_list_is_one_host_error(head: Head) -> None:
    head.answer = {"files": {"status.json": 2}}
    with pytest.raises(HostError, match="head0: listing the run's files: the answer holds no"):
        runfiles.list_files(head, RUN_DIR)  # type: ignore[arg-type]


def test_no_run_folder_is_no_listing_and_no_file_is_no_bytes(head: Head) -> None:
    head.answer = {}
    assert runfiles.list_files(head, RUN_DIR) is None  # type: ignore[arg-type]
    assert runfiles.read(head, RUN_DIR, "status.json", 7) == (None, 7, None)  # type: ignore[arg-type]
    assert runfiles.read_new(head, RUN_DIR, "rank-0.log", 7) == (b"", 7)  # type: ignore[arg-type]


def test_a_read_from_a_shorter_file_starts_again_and_a_stuck_one_is_an_error(head: Head) -> None:
    data = base64.b64encode(b"xyz").decode()
    head.answer = {"data": data, "offset": 3, "size": 3}  # rewritten: shorter than 9
    assert runfiles.read(head, RUN_DIR, "m.jsonl", 9) == (b"xyz", 3, 3)  # type: ignore[arg-type]
    assert head.asked[-1] == ["read", RUN_DIR, "m.jsonl", "9", str(runfiles.CHUNK)]
    head.answer = {"data": data, "offset": 9, "size": 30}  # never advances
    with pytest.raises(HostError, match=r"head0: reading m\.jsonl: the answer does not fit"):
        runfiles.read(head, RUN_DIR, "m.jsonl", 9)  # type: ignore[arg-type]
