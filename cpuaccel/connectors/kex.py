"""The key exchange a master of cpuaccel's own OpenSSH connections offers (check's and
sync's, connectors/openssh_session.py).

OpenSSH 9.0-9.8 start every connection with sntrup761x25519, whose CPU cost on both
sides is most of a handshake's: with several handshakes in parallel on few cores, it is
most of a first contact (docs/benchmarks.md, "SSH key exchange"). A master opened by
cpuaccel leaves sntrup761 out, as the head's launcher-reach masters do
(node/mux.fast_kex): what remains first is mlkem768x25519 (OpenSSH 9.9+, post-quantum
too) or curve25519, which is what cpuaccel's paramiko connections (run, provision) use
to the same nodes, carrying the same files, so the tool's weakest link is unchanged.

The user's own choice wins: a KexAlgorithms in any ssh_config file ssh reads, or in the
inventory's ssh arguments, and nothing is added. Only a command that will open a master
pays ``ssh -Q kex`` (once a process): one that finds a master's socket reuses it, and a
reused master negotiates nothing.
"""

from __future__ import annotations

import functools
import os

from cpuaccel.connectors.openssh import config_may_set
from cpuaccel.inventory.host import Host, ssh_options
from cpuaccel.node.mux import WITHOUT_SNTRUP, lists_sntrup761


def master_options(host: Host, control_path: str) -> list[str]:
    """``-o KexAlgorithms=-sntrup761...`` for a command that opens the master at
    ``control_path``, else nothing."""
    if os.path.exists(control_path):  # a master to reuse (a dead one: ssh connects alone)
        return []
    if "kexalgorithms" in ssh_options(host.vars) or config_may_set("kexalgorithms"):
        return []
    return ["-o", f"KexAlgorithms={WITHOUT_SNTRUP}"] if _local_ssh_has_sntrup() else []


@functools.cache
def _local_ssh_has_sntrup() -> bool:
    return lists_sntrup761("ssh")
