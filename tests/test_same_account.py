"""Issue 12 (item 10): `check` notes inventory names that are one machine and one user."""

from __future__ import annotations

from typing import Any

import pytest

from cpuaccel.executor import HostResult, Status
from cpuaccel.facts.problems import NOTE, same_account
from cpuaccel.inventory.host import Host


def ok(name: str, facts: dict[str, Any] | None = None, **host_vars: Any) -> HostResult[Any]:
    return HostResult(Host(name, host_vars), Status.OK, facts or {})


@pytest.mark.parametrize(
    ("results", "names"),
    [
        # same address, port and user
        ([ok("a", ansible_host="10.0.0.1", ansible_user="u"),
          ok("b", ansible_host="10.0.0.1", ansible_user="u")], ["a, b"]),
        # same kernel and login, whatever the addresses
        ([ok("a", {"boot_id": "k1", "user": "u"}, ansible_host="10.0.0.1"),
          ok("b", {"boot_id": "k1", "user": "u"}, ansible_host="10.0.0.2"),
          ok("c", {"boot_id": "k2", "user": "u"})], ["a, b"]),
        # both rules on the same pair: said once
        ([ok("a", {"boot_id": "k", "user": "u"}, ansible_host="h"),
          ok("b", {"boot_id": "k", "user": "u"}, ansible_host="h")], ["a, b"]),
        # another port, another user, another kernel: distinct accounts
        ([ok("a", ansible_host="h", ansible_port=22),
          ok("b", ansible_host="h", ansible_port=2222)], []),
        ([ok("a", ansible_host="h", ansible_user="x"),
          ok("b", ansible_host="h", ansible_user="y")], []),
        ([ok("a", {"boot_id": "k", "user": "x"}), ok("b", {"boot_id": "k", "user": "y"})], []),
        ([HostResult(Host("a", {"ansible_host": "h"}), Status.UNREACHABLE),
          ok("b", {"boot_id": "k", "user": "u"})], []),
    ],
)  # fmt: skip
def test_same_account_is_a_note(results: list[HostResult[Any]], names: list[str]) -> None:
    notes = same_account(results)
    assert [n.message.split(" are ")[0] for n in notes] == names
    assert all(n.severity == NOTE and n.hint for n in notes)
