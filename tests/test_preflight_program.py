"""The ``preflight`` node program: run's fact probe and its look at the project's copy
in one call, answering as the two programs would apart."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from cpuaccel import node
from cpuaccel.connectors.base import ConnectOptions
from cpuaccel.connectors.local import LocalConnector
from cpuaccel.facts.gather import gather, gather_and_look
from cpuaccel.inventory.host import Host
from cpuaccel.sync import receiver
from cpuaccel.sync.location import DestinationRefused
from cpuaccel.sync.manifest import build


def _conn(workdir: Path) -> LocalConnector:
    vars_ = {"ansible_connection": "local", "cpuaccel_python": sys.executable}
    host = Host("box", {**vars_, "cpuaccel_workdir": str(workdir)})
    return LocalConnector(host, ConnectOptions())


def test_one_call_gives_the_facts_and_the_look(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("print('hi')\n")
    source = build([str(project)])
    conn = _conn(tmp_path / "work")
    look = receiver.words("look", str(project), conn.host.workdir, source.hash)[1:]
    facts, found = gather_and_look(conn, ["localhost"], 29511, look)
    alone = gather(conn, ["localhost"], 29511)
    assert facts["python"] == alone["python"] and facts["resolve"] == alone["resolve"]
    assert "port_free" in facts and "clock_skew" in facts
    # The node holds exactly the source's tree: the look says so without its entries.
    assert found["hash"] == source.hash and found["entries"] is None
    assert found == receiver.call_remote(conn, "look", str(project), expect=source.hash)
    (project / "train.py").write_text("print('changed')\n")
    _, changed = gather_and_look(conn, [], None, look)
    assert changed["hash"] != source.hash and "train.py" in changed["entries"]


def test_a_refused_destination_is_refused_as_by_the_tree_program(tmp_path: Path) -> None:
    conn = _conn(tmp_path / "work")
    look = receiver.words("look", "/", conn.host.workdir, "0" * 64)[1:]
    _, found = gather_and_look(conn, [], None, look)
    with pytest.raises(DestinationRefused):
        receiver.checked("box", found)


def test_the_program_carries_the_probe_and_the_receiver_only() -> None:
    assert node.parts("preflight") == [
        "common", "facts", "destination", "nofollow", "tree", "preflight",
    ]  # fmt: skip
