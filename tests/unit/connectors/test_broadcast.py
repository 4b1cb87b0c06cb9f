"""The broadcast's loop (cpuaccel/connectors/broadcast.py) reading its relays' answers,
as the records of cpuaccel/node/relay.py, without a node: the answers are queued as a
relay's reader would queue them."""

from __future__ import annotations

from typing import Any

from cpuaccel.connectors.broadcast import Broadcast, _Node
from cpuaccel.connectors.connect_options import ConnectOptions
from cpuaccel.errors import CpuaccelError
from cpuaccel.inventory.host import Host
from cpuaccel.node.relay import VERSION


class NoNode:
    """A connection whose programs never start (the controller's feed fails)."""

    def start(self, argv: list[str]) -> Any:
        raise CpuaccelError("no node here")


class NoPool:
    options = ConnectOptions()

    def get(self, host: Host) -> Any:
        raise AssertionError("no connection is made")


def loop_over(*answers: dict[str, Any]) -> Broadcast:
    """A broadcast to one node whose relay said ``answers``, run to its end."""
    sender = Broadcast(NoPool(), [Host("node1")], {"node1": "/srv/root"}, [])
    sender.nodes["node1"] = _Node(Host("node1"), NoNode(), frozenset())  # type: ignore[arg-type]
    for answer in answers:
        sender.events.put(("node1", answer, ""))
    sender._loop()
    return sender


def test_a_relay_of_another_version_fails_its_node_in_one_line() -> None:
    sender = loop_over({"ready": True, "version": VERSION + 1})
    delivery = sender.nodes["node1"].delivery
    assert delivery is not None and not delivery.ok
    assert delivery.error == f"its relay's records are version {VERSION + 1}, this controller's 1"


def test_an_answer_no_relay_gives_fails_its_node_naming_it() -> None:
    sender = loop_over({"ready": True, "version": VERSION}, {"hello": 1})
    delivery = sender.nodes["node1"].delivery
    assert delivery is not None
    assert delivery.error == "its relay's answer was not understood: {'hello': 1}"


def test_a_relay_that_ended_short_fails_its_node_with_its_bytes_and_why() -> None:
    sender = loop_over(
        {"ready": True, "version": VERSION},
        {"end": False, "got": 0, "failure": "No space left on device"},
    )
    delivery = sender.nodes["node1"].delivery
    assert delivery is not None
    assert delivery.error == "its relay ended with 0 of 0 bytes: No space left on device"
