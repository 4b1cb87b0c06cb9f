"""A host whose name does not resolve: said so, with the fix, in the same words by
check (OpenSSH) and run (paramiko)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cpuaccel.connectors.base import cannot_connect
from cpuaccel.errors import EXIT_NODE_FAILED
from cpuaccel.inventory.host import Host
from testsupport.command import cpuaccel, inherited_env

NAME = "no-such-node.invalid"  # .invalid never resolves (RFC 6761)
LINE = f"cannot connect to {NAME}:22: the name {NAME} does not resolve"
FIX = f"fix: set ansible_host to its address, or add {NAME} to DNS or /etc/hosts"


@pytest.mark.parametrize(
    "reason",
    [
        f"ssh: Could not resolve hostname {NAME}: Name or service not known",  # OpenSSH
        "Name or service not known",  # paramiko: the resolver's words
        "[Errno -3] Temporary failure in name resolution",
    ],
)
def test_every_connectors_words_for_an_unresolved_name_are_one(reason: str) -> None:
    error = cannot_connect(Host(NAME), f"{NAME}:22", reason)
    assert error.message.startswith(f"{NAME}: {LINE} (")
    assert error.hint == f"set ansible_host to its address, or add {NAME} to DNS or /etc/hosts"


def test_another_failure_keeps_the_sshd_hint() -> None:
    error = cannot_connect(Host("node1"), "10.0.0.1:22", "Connection refused")
    assert error.message == "node1: cannot connect to 10.0.0.1:22: Connection refused"
    assert "sshd running" in (error.hint or "")


@pytest.mark.parametrize("verb", [["check"], ["run", "--nodes", "1", "--ppn", "1", "train.py"]])
def test_check_and_run_say_it_in_the_same_words(tmp_path: Path, verb: list[str]) -> None:
    (tmp_path / "inventory.yaml").write_text(f"all:\n  hosts:\n    {NAME}:\n")
    (tmp_path / "train.py").write_text("print('never runs')\n")
    args = [*verb[:1], "-i", "inventory.yaml", "-T", "5", *verb[1:]]
    proc = cpuaccel(*args, cwd=tmp_path, env=inherited_env(HOME=str(tmp_path)), timeout=60)
    assert proc.returncode == EXIT_NODE_FAILED, proc.stdout + proc.stderr
    out = proc.stdout + proc.stderr
    assert LINE in out, out
    assert FIX in out, out
    assert "sshd running" not in out
