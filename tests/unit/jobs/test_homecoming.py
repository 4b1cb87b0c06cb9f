"""Results brought home from a node that answers what cpuaccel's program never would:
every name and number it sends is checked before a path or a call is made of it."""

from __future__ import annotations

import base64
import math
import re
from pathlib import Path
from typing import Any

import pytest

from cpuaccel.connectors import programs
from cpuaccel.errors import HostError
from cpuaccel.jobs.homecoming import Homecoming

RUN_DIR = "/work/runs/20260101-000000-abcdef"
MTIME = 1_700_000_000.0


class Node:
    """The head as ``programs.call_kept`` reaches it: a scripted listing, and files read
    as the node's ``read`` reads them unless ``answer`` says otherwise."""

    def __init__(self, listing: list[Any], files: dict[str, bytes]) -> None:
        self.listing = listing
        self.files = files
        self.calls = 0
        self.host = type("Host", (), {"name": "head0"})()

    def answer(self, words: list[str]) -> dict[str, Any]:
        self.calls += 1
        assert self.calls < 100, "the controller kept asking: an unbounded loop"
        if words[0] == "list":
            return {"files": self.listing}
        name, offset, limit = words[2], int(words[3]), int(words[4])
        data = self.files[name]
        start = offset if offset <= len(data) else 0
        chunk = data[start : start + limit]
        return {"data": base64.b64encode(chunk).decode(), "offset": start + len(chunk),
                "size": len(data)}  # fmt: skip


@pytest.fixture
def node(monkeypatch: pytest.MonkeyPatch) -> Node:
    head = Node([], {})

    def call_kept(kept: Any, conn: Any, words: list[str], *_: Any, **__: Any) -> dict[str, Any]:
        return head.answer(list(words))

    monkeypatch.setattr(programs, "call_kept", call_kept)
    return head


def home_of(tmp_path: Path, node: Node) -> Homecoming:
    home = tmp_path / "runs" / "r"
    home.mkdir(parents=True)
    return Homecoming(lambda: node, RUN_DIR, home, supervised_there=True)  # type: ignore[arg-type,return-value]


def test_a_listed_name_that_climbs_out_writes_nothing_outside(node: Node, tmp_path: Path) -> None:
    """``hang-/../../x.txt`` passed the hang-*.txt test: with folders of those names in
    the run folder, its copy and its temporary file landed two levels up."""
    homecoming = home_of(tmp_path, node)
    for folder in ("hang-", ".hang-"):  # what the path needs to resolve through
        (homecoming.home / folder).mkdir()
    evil = "hang-/../../escaped.txt"
    node.listing = [[evil, 4, MTIME], ["hang-0.txt", 5, MTIME], ["hang-1.txt\n", 4, MTIME]]
    node.files = {evil: b"evil", "hang-0.txt": b"stack", "hang-1.txt\n": b"evil"}
    fetched = homecoming.once()
    assert fetched is not None and fetched.files == ["hang-0.txt", "checkpoints.json"]
    assert (homecoming.home / "hang-0.txt").read_bytes() == b"stack"
    assert sorted(p.name for p in tmp_path.rglob("*") if "escaped" in p.name) == []
    assert sorted(p.name for p in homecoming.home.iterdir()) == [
        ".hang-", "checkpoints.json", "hang-", "hang-0.txt",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        (["status.json", 2, math.nan], "mtime nan"),
        (["status.json", 2, math.inf], "mtime inf"),
        (["status.json", 2, 1e300], "mtime 1e+300"),
        (["status.json", 2, -5.0], "mtime -5.0"),
        (["status.json", -1, MTIME], "size -1"),
        (["status.json", "2", MTIME], "size '2'"),
        (["status.json", True, MTIME], "size True"),
        (["status.json", 2.5, MTIME], "size 2.5"),
        (["status.json", 2], "a malformed entry"),
        ("status.json", "a malformed entry"),
        ([3, 2, MTIME], "a malformed entry"),
    ],
)
def test_a_number_out_of_range_is_one_host_error(
    node: Node, tmp_path: Path, entry: Any, says: str
) -> None:
    """A NaN mtime raised ValueError in os.utime after a foreground run ended (a
    traceback where the results were to be brought home)."""
    homecoming = home_of(tmp_path, node)
    node.listing = [entry]
    node.files = {"status.json": b"{}"}
    with pytest.raises(HostError, match=f"head0: listing the run's files: .*{re.escape(says)}"):
        homecoming.once()
    assert list(homecoming.home.iterdir()) == []


@pytest.mark.parametrize(
    "answer",
    [
        {"data": base64.b64encode(b"x").decode(), "offset": 0, "size": 10},  # never advances
        {"data": base64.b64encode(b"x").decode(), "offset": math.nan, "size": 10},
        {"data": base64.b64encode(b"x").decode(), "offset": 1, "size": -3},
        {"data": "not base64!", "offset": 1, "size": 10},
        {"data": base64.b64encode(b"x" * 9).decode(), "offset": 7, "size": 10},
    ],
    ids=["stuck", "offset-nan", "size-negative", "data-not-base64", "offset-wrong"],
)
def test_a_read_answer_that_does_not_fit_the_request_is_one_host_error(
    node: Node, tmp_path: Path, answer: dict[str, Any]
) -> None:
    """An offset that never advanced kept the copy appending the same byte for ever."""
    homecoming = home_of(tmp_path, node)
    node.listing = [["metrics.jsonl", 10, MTIME]]

    def scripted(words: list[str]) -> dict[str, Any]:
        node.calls += 1
        assert node.calls < 100, "the controller kept asking: an unbounded loop"
        return {"files": node.listing} if words[0] == "list" else answer

    node.answer = scripted  # type: ignore[method-assign]
    with pytest.raises(HostError, match=r"head0: reading metrics\.jsonl: the answer does not fit"):
        homecoming.once()
    assert (homecoming.home / "metrics.jsonl").read_bytes() == b""


def test_a_file_rewritten_while_it_is_read_waits_for_the_next_pass(
    node: Node, tmp_path: Path
) -> None:
    homecoming = home_of(tmp_path, node)
    node.listing = [["metrics.jsonl", 6, MTIME]]
    node.files = {"metrics.jsonl": b"abcdef"}
    assert homecoming.once() is not None
    node.listing = [["metrics.jsonl", 9, MTIME]]
    node.files = {"metrics.jsonl": b"xyz"}  # shorter than the copy: read from its start
    homecoming.once()
    assert (homecoming.home / "metrics.jsonl").read_bytes() == b"abcdef"  # not "abcdefxyz"
