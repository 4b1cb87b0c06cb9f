"""Cross-host analysis of facts, as data-driven specs: facts in, problems out; and the note
on inventory names that are one machine and one user."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from cpuaccel.executor import HostResult, Status
from cpuaccel.facts.problems import ERROR, NOTE, WARNING, find_problems, same_account
from cpuaccel.inventory.host import Host

BASE: dict[str, Any] = {
    "hostname": "nodeX",
    "python": {"version": "3.11.7"},
    "packages": {"torch": "2.13.0+cpu", "cpuaccel": "0.1.0", "impi_rt": "2021.18.1"},
    "mpi": {"launchers": [{"path": "/v/bin/mpirun", "flavour": "impi"}]},
    "cpu": {"isa": {"amx_bf16": True, "avx512_bf16": True}},
    "resolve": {},
    "addresses": [],
    "clock_skew": 0.1,
}


def node(name: str, **changes: Any) -> HostResult[dict[str, Any]]:
    facts = copy.deepcopy(BASE)
    facts["hostname"] = name
    for path, value in changes.items():
        cursor = facts
        keys = path.split("__")
        for key in keys[:-1]:
            cursor = cursor[key]
        cursor[keys[-1]] = value
    return HostResult(Host(name), Status.OK, facts)


def summary(results: list[HostResult[dict[str, Any]]]) -> list[tuple[str, str | None, str]]:
    return [(p.severity, p.host, p.message) for p in find_problems(results)]


def test_identical_nodes_have_no_problems() -> None:
    assert summary([node("n1"), node("n2"), node("n3")]) == []


@pytest.mark.parametrize(
    ("change", "severity", "words"),
    [
        ({"python__version": "3.11.2"}, ERROR, ["Python 3.11.2 here", "3.11.7 on n1, n2"]),
        ({"packages__torch": "2.8.0"}, ERROR, ["torch 2.8.0 here", "2.13.0+cpu on n1, n2"]),
        ({"packages__torch": None}, ERROR, ["torch absent here"]),
        ({"packages__cpuaccel": "0.0.9"}, ERROR, ["cpuaccel 0.0.9 here"]),
        (
            {"mpi__launchers": [{"path": "/usr/bin/mpirun", "flavour": "openmpi"}]},
            ERROR,
            ["MPI flavour openmpi here", "impi on n1, n2"],
        ),
        ({"mpi__launchers": []}, ERROR, ["MPI flavour absent here"]),
        ({"packages__impi_rt": "2021.10.0"}, WARNING, ["impi-rt 2021.10.0 here"]),
        ({"clock_skew": -3.5}, WARNING, ["-3.5 s off"]),
        ({"cpu__isa": {"amx_bf16": False, "avx512_bf16": False}}, WARNING, ["no AMX-BF16"]),
    ],
)
def test_one_odd_node_is_named(change: dict[str, Any], severity: str, words: list[str]) -> None:
    problems = summary([node("n1"), node("n2"), node("n3", **change)])
    assert len(problems) == 1, problems
    got_severity, host, message = problems[0]
    assert (got_severity, host) == (severity, "n3")
    for word in words:
        assert word in message


def test_bf16_missing_everywhere_is_not_a_problem() -> None:
    no_bf16 = {"cpu__isa": {"amx_bf16": False, "avx512_bf16": False}}
    assert summary([node("n1", **no_bf16), node("n2", **no_bf16)]) == []


def test_unreachable_host_is_an_error_and_others_still_compared() -> None:
    down = HostResult(Host("n4"), Status.UNREACHABLE, None, "connection refused", "start sshd")
    problems = find_problems([node("n1"), node("n2", packages__torch="2.8.0"), down])
    assert [(p.severity, p.host) for p in problems] == [(ERROR, "n4"), (ERROR, "n2")]
    assert problems[0].hint == "start sshd"


def test_names_a_node_cannot_resolve_are_no_problem() -> None:
    # A job names the nodes by the addresses cpuaccel.network.choice picks where the
    # names do not resolve alike everywhere: an inventory of aliases runs as it is.
    n1 = node(
        "n1",
        addresses=["127.0.0.1", "10.0.0.1"],
        resolve={
            "n2": {"addresses": ["10.0.0.9"], "error": None},
            "n3": {"addresses": [], "error": "Name or service not known"},
        },
    )
    n2 = node("n2", addresses=["127.0.0.1", "10.0.0.2"], resolve={})
    n3 = node("n3", addresses=["10.0.0.3"], resolve={"n1": {"addresses": ["10.0.0.1"]}})
    assert summary([n1, n2, n3]) == []


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
