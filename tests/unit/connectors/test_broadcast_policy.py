"""The broadcast's rules (cpuaccel/connectors/broadcast_policy.py): what goes by
broadcast, the chain's order, and the fall-back to the direct path."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from cpuaccel.connectors.broadcast_policy import (
    FILE_BYTES,
    LAG,
    MIN_BYTES,
    SLOW,
    choose,
    fall_back,
    feeders,
    large,
    relays,
    slow,
    worth,
)
from cpuaccel.inventory.host import Host

MB = 1 << 20


def test_only_nodes_the_others_reach_over_ssh_relay() -> None:
    assert relays(Host("node1"))
    assert not relays(Host("here", {"ansible_connection": "local"}))
    assert not relays(Host("step", {"ansible_connection": "slurm"}))


def test_a_file_is_large_from_file_bytes_on() -> None:
    assert large(FILE_BYTES) and not large(FILE_BYTES - 1)


def test_a_broadcast_pays_for_two_nodes_and_min_bytes_counted_once() -> None:
    sizes = {"a": MIN_BYTES // 2, "b": MIN_BYTES // 2, "c": 1}
    assert worth({"n1": {"a", "b"}, "n2": {"a"}}, sizes)
    # one node alone: its own copy costs the same
    assert not worth({"n1": {"a", "b"}, "n2": set()}, sizes)
    # a file two nodes need counts once
    assert not worth({"n1": {"a", "c"}, "n2": {"a"}}, sizes)


def test_choose_keeps_each_nodes_large_files_and_drops_nodes_without_any() -> None:
    sizes = {"big": MIN_BYTES, "small": FILE_BYTES - 1}
    needs = {"n1": ["big", "small"], "n2": ["big", "folder/"], "n3": ["small"]}
    assert choose(needs, sizes) == {"n1": frozenset({"big"}), "n2": frozenset({"big"})}
    assert list(choose(needs, sizes)) == ["n1", "n2"]  # the nodes' order kept


def test_choose_gives_nothing_when_not_worth_a_broadcast() -> None:
    sizes = {"f": FILE_BYTES}
    assert choose({"n1": ["f"], "n2": ["f"]}, sizes) == {}


@pytest.mark.parametrize(
    ("fanout", "fed"),
    [
        (1, {"b": "a", "c": "b", "d": "c", "e": "d"}),
        (2, {"b": "a", "c": "a", "d": "b", "e": "b"}),
        (0, {}),
    ],
)
def test_node_i_is_fed_by_node_i_less_one_over_fanout(fanout: int, fed: dict[str, str]) -> None:
    assert feeders(["a", "b", "c", "d", "e"], fanout) == fed


def test_a_node_behind_its_feeder_is_slow_past_lag_or_still_past_slow() -> None:
    assert slow(LAG + 1, 0.0)
    assert slow(1, SLOW + 1)
    assert not slow(LAG, SLOW)
    assert not slow(0, SLOW * 10)  # nothing to take: not slow


@dataclass
class Outcome:
    error: str | None = None
    bad: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None and not self.bad


def test_fall_back_names_each_failed_node_in_one_line_with_its_direct_path() -> None:
    notes: list[str] = []
    done = {"n1": Outcome(), "n2": Outcome("its relay ended"), "n3": Outcome(bad=True)}
    failed = fall_back(done, notes.append, "sending it directly")
    assert failed == ["n2", "n3"]
    assert notes == ["n2: the broadcast failed (its relay ended): sending it directly"]
