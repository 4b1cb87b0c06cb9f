"""Which of a synchronize task's large files a node lacks, from the node's answers:
answers that are not what the agent sends (a hostile or broken node) leave the files to
rsync, never an exception or a path the node made up."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cpuaccel.inventory.host import Host
from cpuaccel.playbook.synchronize_broadcast import survey

MIB = 1 << 20
LOCAL = {"a.whl": [8 * MIB, 1000, 0o644], "b.whl": [9 * MIB, 1000, 0o644]}


class Answers:
    """A HostContext's request(), answering from a table (module -> reply)."""

    def __init__(self, replies: dict[str, Any]) -> None:
        self.host = Host("node1", {"ansible_host": "192.0.2.1"})
        self.replies = replies
        self.asked: list[tuple[str, dict[str, Any]]] = []

    def request(self, module: str, args: dict[str, Any]) -> Any:
        self.asked.append((module, args))
        return self.replies[module]


def look(replies: dict[str, Any], src: str = "/w/wheels/", delete: bool = True) -> Any:
    ctx = Answers(replies)
    args = {"src": src, "dest": "~/wheels/", "delete": delete}
    return survey(ctx, args, Path("/w/wheels"), LOCAL), ctx  # type: ignore[arg-type]


def test_a_node_lacking_one_file_and_holding_the_other_gets_the_one() -> None:
    target, ctx = look(
        {
            "destination": {"dest": "/home/u/wheels", "refused": None},
            "tree": {"exists": True, "files": {"b.whl": [9 * MIB, 1000, 0o600]}},
        }
    )
    # a mode of its own is rsync's to fix, without sending the bytes again
    assert target.lacks == frozenset({"a.whl"}) and target.dest == "/home/u/wheels"
    assert ctx.asked[1] == ("tree", {"path": "/home/u/wheels"})


def test_src_without_a_slash_lands_in_a_folder_of_its_name() -> None:
    target, _ = look(
        {"destination": {"dest": "/d", "refused": None}, "tree": {"exists": False}},
        src="/w/wheels",
    )
    assert target.dest == "/d/wheels" and target.lacks == frozenset(LOCAL)


def test_a_folder_where_a_file_goes_is_left_to_rsync() -> None:
    target, _ = look(
        {
            "destination": {"dest": "/d", "refused": None},
            "tree": {"exists": True, "files": {"a.whl": [-1, 0, 0o755]}},
        }
    )
    assert target.lacks == frozenset({"b.whl"})


def test_a_refused_delete_is_the_tasks_to_report() -> None:
    replies = {"destination": {"dest": "/home/u", "refused": "the home folder"}, "tree": {}}
    assert look(replies)[0] is None


@pytest.mark.parametrize(
    "replies",
    [
        {"destination": {"dest": 5}},
        {"destination": {"dest": "relative/path", "refused": None}},
        {"destination": {"failed": True, "msg": "no"}},
        {"destination": {"dest": "/d"}, "tree": {"failed": True}},
        {"destination": {"dest": "/d"}, "tree": {"files": ["a.whl"]}},
    ],
)
def test_answers_not_understood_leave_the_node_to_rsync(replies: dict[str, Any]) -> None:
    assert look(replies)[0] is None


def test_entries_not_understood_are_not_sent() -> None:
    target, _ = look(
        {
            "destination": {"dest": "/d"},
            "tree": {"files": {"a.whl": "8388608", "b.whl": [None, "x"]}},
        }
    )
    assert target.lacks == frozenset()
