"""Slurm's hostlist syntax, expanded by cpuaccel/slurm/hostlist.py."""

from __future__ import annotations

import pytest

from cpuaccel.errors import EXIT_USAGE
from cpuaccel.slurm.hostlist import HostlistError, expand


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("node1", ["node1"]),
        ("node[1-3]", ["node1", "node2", "node3"]),
        ("node[01-03,20]", ["node01", "node02", "node03", "node20"]),
        ("node[08-11]", ["node08", "node09", "node10", "node11"]),
        ("a[1-2]b[3-4]", ["a1b3", "a1b4", "a2b3", "a2b4"]),
        ("login1,node[1-2],node1", ["login1", "node1", "node2"]),
        ("rack1-n[7],x", ["rack1-n7", "x"]),
        (" node[1] ", ["node1"]),
    ],
)
def test_expand(text: str, hosts: list[str]) -> None:
    assert expand(text) == hosts


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("node[1-3", "'[' without ']'"),
        ("node1-3]", "']' without '['"),
        ("node[[1]]", "nested"),
        ("node[3-1]", "goes backwards"),
        ("node[a-b]", "is not a number"),
        ("node1,,node2", "empty name"),
        ("node[1-1000000]", "more than"),
        ("-oProxyCommand=x", "must not start with '-'"),
        ("node;rm", "not a host name"),
        ("fe80::1%x;rm", "IPv6 scope id 'x;rm'"),
    ],
)
def test_bad_hostlists_name_the_origin_and_the_fault(text: str, said: str) -> None:
    with pytest.raises(HostlistError) as caught:
        expand(text, origin="SLURM_JOB_NODELIST")
    assert str(caught.value).startswith("SLURM_JOB_NODELIST: ")
    assert said in str(caught.value)
    assert caught.value.exit_code == EXIT_USAGE
    assert caught.value.hint  # every refusal says how to write it
