"""Whether a node lacks a copy task's large file, and the folder it goes in, from the
node's answers: answers that are not what the agent sends (a hostile or broken node)
leave the file to the host's own copy, never an exception or a folder the node made up."""

from __future__ import annotations

from typing import Any

import pytest

from cpuaccel.inventory.host import Host
from cpuaccel.playbook.copy_broadcast import survey

SIZE = 20 << 20
SHA1 = "a" * 40
DEST = "~/models/w.bin"


class Answers:
    """A HostContext's request(), answering by module and path from a table."""

    def __init__(self, replies: dict[tuple[str, str], Any]) -> None:
        self.host = Host("node1", {"ansible_host": "192.0.2.1"})
        self.replies = replies
        self.asked: list[tuple[str, dict[str, Any]]] = []

    def request(self, module: str, args: dict[str, Any]) -> Any:
        self.asked.append((module, args))
        return self.replies[(module, args["path"])]


def stat(**info: Any) -> dict[str, Any]:
    return {"changed": False, "stat": info}


def node(dest: Any, folder: Any = None, resolved: Any = None, summed: Any = None) -> Answers:
    """A node whose dest resolves to /home/u/models/w.bin."""
    return Answers(
        {
            ("stat", DEST): dest,
            ("stat", "/home/u/models"): folder or stat(exists=True, isdir=True),
            ("destination", "/home/u/models"): resolved or {"dest": "/data/models"},
            ("stat", "/home/u/models/w.bin"): summed,
        }
    )


def look(ctx: Answers, force: bool = True) -> Any:
    return survey(ctx, DEST, force, SIZE, SHA1)  # type: ignore[arg-type]


MISSING = stat(exists=False, path="/home/u/models/w.bin")


def test_a_node_without_the_file_gets_it_in_its_folder_as_resolved_there() -> None:
    ctx = node(MISSING)
    target = look(ctx)
    assert target.folder == "/data/models"  # the folder's link resolved on the node
    assert ctx.asked[0] == ("stat", {"path": DEST, "get_checksum": False})


def test_the_same_file_there_is_left_alone_and_another_of_its_size_is_not() -> None:
    same_size = stat(exists=True, isreg=True, size=SIZE, path="/home/u/models/w.bin")
    assert look(node(same_size, summed=stat(checksum=SHA1))) is None
    other = node(same_size, summed=stat(checksum="b" * 40))
    assert look(other).folder == "/data/models"


@pytest.mark.parametrize(
    "answers",
    [
        node(stat(exists=True, isdir=True, path="/home/u/models/w.bin")),  # copy says why
        node(MISSING, folder=stat(exists=False)),  # copy refuses a missing folder
        node(MISSING, folder=stat(exists=True, isdir=False)),
        node(stat(exists=False, path="models/w.bin")),  # not absolute: not resolved there
        node(stat(exists=False, path="/home/u/models/")),
        node(stat(exists=False, path=["/x"])),
        node({"failed": True, "msg": "no"}),
        node({"stat": "not a mapping"}),
        node(MISSING, resolved={"dest": "relative"}),
        node(MISSING, resolved={"failed": True}),
        node(MISSING, resolved={"dest": None}),
    ],
)
def test_answers_that_do_not_add_up_leave_the_node_to_its_copy(answers: Answers) -> None:
    assert look(answers) is None


def test_a_file_kept_by_force_false_is_left_to_its_copy() -> None:
    there = stat(exists=True, isreg=True, size=1, path="/home/u/models/w.bin")
    assert look(node(there), force=False) is None
    assert look(node(there)).folder == "/data/models"
