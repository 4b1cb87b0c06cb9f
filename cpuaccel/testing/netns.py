"""The host side of the test cluster: names, processes, leftovers and the lock.

Everything here works from an id alone, so that a later process can find (and clean
up) what an earlier one left: names follow from the id, processes are recognised on
/proc by their namespace or by the sshd config they were started with, never by a
pattern that could match someone else's.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

SSHD = "/usr/sbin/sshd"
NODE_DIR = Path("/srv/cpuaccel-node")
SKEL_BASHRC = Path("/etc/skel/.bashrc")
"""The one path that is private to each node (a per-node directory is mounted over it)."""
WORKDIR = NODE_DIR / "work"
PRIVSEP_DIR = Path("/run/sshd")
NETNS_DIR = Path("/run/netns")
CONTROLLER_NAME = "cpxl-controller"
CONTROLLER_HOST = 254
MAX_NODES = 253
MAX_CLUSTER_ID = 255
REQUIRED_TOOLS = ("ip", "unshare", "nsenter", "setsid", "ssh-keygen", "hostname", "mount")

_STATE_FILE = "state.json"


class ClusterError(RuntimeError):
    """The test cluster could not be brought up, inspected or torn down."""


# --------------------------------------------------------------------------- names


def bridge_name(cluster_id: int) -> str:
    return f"cpxl{cluster_id}br"


def namespace_name(cluster_id: int, index: int) -> str:
    return f"cpxl{cluster_id}-node{index}"


def veth_name(cluster_id: int, index: int) -> str:
    return f"cpxl{cluster_id}v{index}"


def node_address(cluster_id: int, index: int) -> str:
    return f"10.77.{cluster_id}.{index}"


def controller_address(cluster_id: int) -> str:
    return node_address(cluster_id, CONTROLLER_HOST)


def state_dir_for(cluster_id: int, state_root: Path = Path("/tmp")) -> Path:
    return state_root / f"cpxl-{cluster_id}"


def lock_path_for(cluster_id: int, state_root: Path = Path("/tmp")) -> Path:
    return state_root / f"cpxl-{cluster_id}.lock"


def _check_id(cluster_id: int) -> None:
    if not 0 <= cluster_id <= MAX_CLUSTER_ID:
        raise ValueError(f"cluster id must be in 0..{MAX_CLUSTER_ID}, got {cluster_id}")


def unavailable_reason() -> str | None:
    """Why namespace clusters cannot run here, or None if they can."""
    if os.geteuid() != 0:
        return (
            f"needs root to create network namespaces and start sshd (running as uid "
            f"{os.geteuid()})"
        )
    missing = [tool for tool in REQUIRED_TOOLS if shutil.which(tool) is None]
    if not Path(SSHD).exists():
        missing.append(SSHD)
    if missing:
        return f"missing tools for the namespace cluster: {', '.join(missing)}"
    return None


# --------------------------------------------------------------------------- processes


def _run(argv: Sequence[str], *, input: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run a setup command; raise ClusterError with its stderr if it fails."""
    proc = subprocess.run(
        list(argv), input=input, capture_output=True, text=True, check=False, timeout=60
    )
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip()
        raise ClusterError(f"{shlex.join(argv)} failed ({proc.returncode}): {detail}")
    return proc


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _all_pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def _stat_fields(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, pgid) of a process, or None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name is in parentheses and may contain anything, so split after it.
    fields = raw[raw.rindex(")") + 2 :].split()
    return fields[0], int(fields[1]), int(fields[2])


def _alive(pid: int) -> bool:
    """True if the process exists and is not a zombie."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def _netns_inode(namespace: str) -> int | None:
    try:
        return (NETNS_DIR / namespace).stat().st_ino
    except OSError:
        return None


def _pids_in_netns(inode: int) -> set[int]:
    wanted = f"net:[{inode}]"
    found: set[int] = set()
    for pid in _all_pids():
        try:
            if os.readlink(f"/proc/{pid}/ns/net") == wanted:
                found.add(pid)
        except OSError:
            continue
    return found


def _descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid in _all_pids():
        fields = _stat_fields(pid)
        if fields is not None and fields[0] not in ("Z", "X"):
            children.setdefault(fields[1], []).append(pid)
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _sshd_config_of(pid: int) -> Path | None:
    """The `-f` config of an sshd process, read from /proc, or None if pid is no such sshd.

    Handles both a plain command line and the title sshd sets on its listener
    (``sshd: /usr/sbin/sshd -D -e -f CONF [listener] ...``).
    """
    tokens = " ".join(_cmdline(pid)).split()
    if not tokens:
        return None
    if tokens[0] == "sshd:":
        tokens = tokens[1:]
    if not tokens or tokens[0] != SSHD:
        return None
    for flag, value in itertools.pairwise(tokens):
        if flag == "-f":
            return Path(value)
    return None


def _is_our_sshd(pid: int, config: Path) -> bool:
    """True if pid is a live sshd started with this exact config file."""
    return _alive(pid) and _sshd_config_of(pid) == config


def _names_state_dir(pid: int, state_dir: Path) -> bool:
    """True if pid is an sshd whose -f config lives in state_dir (checked on /proc)."""
    config = _sshd_config_of(pid)
    return config is not None and config.is_relative_to(state_dir)


def _terminate(pids: Iterable[int], groups: Iterable[int] = (), timeout: float = 3.0) -> None:
    """SIGTERM the processes and process groups, wait, then SIGKILL what is left."""
    targets = set(pids)
    group_list = list(groups)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pgid in group_list:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, sig)
        for pid in targets:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            targets = {pid for pid in targets if _alive(pid)}
            if not targets:
                return
            time.sleep(0.02)


# --------------------------------------------------------------------------- cleanup


def _list_netns(cluster_id: int) -> list[str]:
    pattern = re.compile(rf"^cpxl{cluster_id}-node\d+$")
    try:
        names = os.listdir(NETNS_DIR)
    except OSError:
        names = []
    return sorted(name for name in names if pattern.match(name))


def _list_links(cluster_id: int) -> list[str]:
    pattern = re.compile(rf"^cpxl{cluster_id}(br|v\d+)$")
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
    for link in sorted(links, key=lambda name: name.endswith("br")):
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


class _Lock:
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
