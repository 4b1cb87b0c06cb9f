"""What the launcher check (jobs/preflight.py: the head's ``ssh.sh NODE true``) says
when a pair fails: the message and the fix, from ssh's exit code and last line."""

from __future__ import annotations

from cpuaccel.connectors import openssh
from cpuaccel.facts.problems import ERROR, Problem
from cpuaccel.inventory.host import Host


def unreached(head: Host, node: Host, code: int | None, said: str, timeout: float) -> Problem:
    """The launcher check's failure from ``head`` to ``node``: one problem, with the fix
    its exit code and last line point at."""
    port = openssh.port_of(node)
    user = f"{node.user}@" if node.user else ""
    where = f"{user}{node.address}:{port}"
    if code is None:
        outcome = f"no answer within {timeout:g} s"
    else:
        outcome = f"exit code {code}" + (f": {said}" if said else "")
    message = f"the MPI launcher on {head.name} cannot ssh to {node.name} ({where}): {outcome}"
    low = said.lower()
    if code == 127:
        hint = f"install the OpenSSH client (ssh) on {head.name}: MPI's launcher runs it there"
    elif "host key" in low or "identification has changed" in low:
        hint = (
            f"from {head.name}, {node.address}:{port} answers with another host key than the "
            f"controller verified: make ansible_host of {node.name} an address that means "
            "the same machine from every node"
        )
    elif "permission denied" in low or "too many authentication" in low:
        key = node.key_file or "the head's default keys"
        hint = (
            f"{node.name} must let {node.user or 'the same user'} log in from {head.name} with "
            f"{key} (a key path is read on {head.name}, ~ is the home there): copy the key "
            f"there or authorize the head's, and check AllowUsers/Match in {node.name}'s sshd"
        )
    elif "resolve" in low:
        hint = f"{node.address} does not resolve on {head.name}: use an ansible_host all resolve"
    else:
        hint = (
            f"{head.name} cannot open {node.address}:{port}: let {node.name}'s sshd accept "
            "connections from the other nodes (firewall, ListenAddress), or set "
            "ansible_host/ansible_port to what the nodes' network reaches"
        )
    return Problem(ERROR, f"{head.name} -> {node.name}", message, hint=hint)
