"""What outlives the process that started a test cluster: its state file, its lock, and
whatever a crashed run left behind (found and removed by cluster id alone).

``python -m cpuaccel.testbed up`` returns while the nodes keep running; a later
``status`` or ``down`` (or :meth:`Cluster.attach`) finds them again through the state file
in the cluster's state dir. The lock file says which process owns a running cluster.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shlex
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cpuaccel.testbed.netns import (
    NETNS_DIR,
    ClusterError,
    Node,
    _alive,
    _all_pids,
    _check_id,
    _cmdline,
    _names_state_dir,
    _netns_inode,
    _pids_in_netns,
    _run,
    _stat_fields,
    _terminate,
    state_dir_for,
)
from cpuaccel.testbed.slurm_files import bed_pids

STATE_FILE = "state.json"


def save_state(state_dir: Path, cluster_id: int, python: str, nodes: Sequence[Node]) -> None:
    """Record the nodes (and their sshd pids) of a running cluster."""
    state = {
        "cluster_id": cluster_id,
        "python": python,
        "nodes": [
            {"name": n.name, "address": n.address, "namespace": n.namespace, "pid": n.pid}
            for n in nodes
        ],
    }
    (state_dir / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")


def load_state(cluster_id: int, state_root: Path) -> dict[str, Any]:
    """The state a running cluster recorded; ClusterError if there is none."""
    state_file = state_dir_for(cluster_id, state_root) / STATE_FILE
    try:
        state: dict[str, Any] = json.loads(state_file.read_text())
    except (OSError, ValueError) as exc:
        raise ClusterError(f"no running cluster {cluster_id}: {exc}") from None
    return state


# --------------------------------------------------------------------------- cleanup


def _list_netns(cluster_id: int) -> list[str]:
    pattern = re.compile(rf"^cpxl{cluster_id}-node\d+$")
    try:
        names = os.listdir(NETNS_DIR)
    except OSError:
        names = []
    return sorted(name for name in names if pattern.match(name))


def _list_links(cluster_id: int) -> list[str]:
    # The bridges and host-side veths of both networks (the second: netfaults.second_network).
    pattern = re.compile(rf"^cpxl{cluster_id}(br|br2|v\d+|w\d+)$")
    try:
        names = os.listdir("/sys/class/net")
    except OSError:
        names = []
    return sorted(name for name in names if pattern.match(name))


def _stale_processes(cluster_id: int, state_root: Path) -> set[int]:
    state_dir = state_dir_for(cluster_id, state_root)
    found: set[int] = set()
    for namespace in _list_netns(cluster_id):
        inode = _netns_inode(namespace)
        if inode is not None:
            found |= _pids_in_netns(inode)
    found |= {pid for pid in _all_pids() if _names_state_dir(pid, state_dir)}
    found |= bed_pids(state_dir)  # the Slurm daemons of the cluster's test bed
    found.discard(os.getpid())
    return found


def leftovers(cluster_id: int, state_root: Path = Path("/tmp")) -> dict[str, list[str]]:
    """What exists on this machine for a cluster id: namespaces, links, processes, state dir."""
    _check_id(cluster_id)
    state_dir = state_dir_for(cluster_id, state_root)
    return {
        "namespaces": _list_netns(cluster_id),
        "links": _list_links(cluster_id),
        "processes": [
            f"{pid} {shlex.join(_cmdline(pid))}"
            for pid in sorted(_stale_processes(cluster_id, state_root))
            if _alive(pid)
        ],
        "state_dir": [str(state_dir)] if state_dir.exists() else [],
    }


def cleanup_stale(cluster_id: int, state_root: Path = Path("/tmp")) -> None:
    """Remove everything named after this cluster id, and nothing else.

    Kills every process inside the id's namespaces and every sshd whose ``-f`` config lives
    in its state dir (both checked on /proc before killing), then deletes its links,
    namespaces and state dir. Does not take the lock: callers that care do.
    """
    _check_id(cluster_id)
    state_dir = state_dir_for(cluster_id, state_root)
    pids = _stale_processes(cluster_id, state_root)
    # sshd listeners were started with setsid: their process group is theirs alone.
    groups = [pid for pid in pids if (f := _stat_fields(pid)) is not None and f[2] == pid]
    _terminate(pids, groups)
    # Delete the host-side veths before the namespaces: namespace teardown is
    # asynchronous in the kernel, `ip link del` is not.
    links = _list_links(cluster_id)
    for link in sorted(links, key=lambda name: name.endswith(("br", "br2"))):
        with contextlib.suppress(ClusterError):
            _run(["ip", "link", "del", link])
    for namespace in _list_netns(cluster_id):
        with contextlib.suppress(ClusterError):
            _run(["ip", "netns", "del", namespace])
    if state_dir.is_dir() and not state_dir.is_symlink():
        shutil.rmtree(state_dir, ignore_errors=True)
    left = {kind: items for kind, items in leftovers(cluster_id, state_root).items() if items}
    if left:
        raise ClusterError(f"cluster {cluster_id}: could not remove {left}")


# --------------------------------------------------------------------------- lock


class Lock:
    """An flock on state_root/cpxl-{id}.lock, held while a process owns a cluster."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        if self._fd is not None:
            return
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = ""
                with contextlib.suppress(OSError, ValueError):
                    owner = os.read(fd, 64).decode().strip()
                os.close(fd)
                raise ClusterError(
                    f"{self.path} is held by a running process (pid {owner or '?'}): that "
                    "cluster id is in use; pick another id or stop that process first"
                ) from None
            # The file may have been unlinked by its previous owner between open and flock.
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self, *, remove: bool) -> None:
        if self._fd is None:
            return
        if remove:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        os.close(self._fd)
        self._fd = None
