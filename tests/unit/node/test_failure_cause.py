"""Which failing rank a failed job blames (node/supervisor.cause)."""

from __future__ import annotations

from cpuaccel.node.supervisor import Failure, cause


def test_a_sigterm_victim_reported_first_is_not_blamed() -> None:
    failures = [Failure(0, "node1", 143), Failure(2, "node2", 3), Failure(1, "node1", 143)]
    assert cause(failures) == Failure(2, "node2", 3)


def test_the_first_report_is_blamed_otherwise() -> None:
    assert cause([Failure(1, "node2", 137), Failure(0, "node1", 1)]) == Failure(1, "node2", 137)
    assert cause([Failure(0, "node1", 143)]) == Failure(0, "node1", 143)
    assert cause([]) is None
