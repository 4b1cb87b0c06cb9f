"""The test nodes as namespaces: names, the network, entering a node, its processes.

Names follow from the cluster id alone, so that a later process can find (and clean up)
what an earlier one left (see :mod:`cpuaccel.testbed.state`). Processes are recognised on
/proc by their namespace or by the sshd config they were started with, never by a pattern
that could match someone else's.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SSHD = "/usr/sbin/sshd"
NODE_DIR = Path("/srv/cpuaccel-node")
"""The one path that is private to each node (a per-node directory is mounted over it)."""
SKEL_BASHRC = Path("/etc/skel/.bashrc")
WORKDIR = NODE_DIR / "work"
PRIVSEP_DIR = Path("/run/sshd")
NETNS_DIR = Path("/run/netns")
CONTROLLER_NAME = "cpxl-controller"
CONTROLLER_HOST = 254
MAX_NODES = 253
MAX_CLUSTER_ID = 255
REQUIRED_TOOLS = ("ip", "unshare", "nsenter", "setsid", "ssh-keygen", "hostname", "mount")
# The Debian package of each tool (and of sshd), as tools/system-deps.sh installs them.
TOOL_PACKAGES = {
    "ip": "iproute2",
    "unshare": "util-linux",
    "nsenter": "util-linux",
    "setsid": "util-linux",
    "mount": "mount",
    "ssh-keygen": "openssh-client",
    "hostname": "hostname",
    SSHD: "openssh-server",
}


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


def second_bridge_name(cluster_id: int) -> str:
    """The bridge of the optional second network (:mod:`testsupport.netfaults`)."""
    return f"cpxl{cluster_id}br2"


def second_veth_name(cluster_id: int, index: int) -> str:
    """Host end of node `index`'s link to the second network (``eth1`` inside the node)."""
    return f"cpxl{cluster_id}w{index}"


def second_address(cluster_id: int, index: int) -> str:
    """Node `index`'s address on the second network: a /24 of its own in 10.78.0.0/16,
    apart from the first network's 10.77.0.0/16 for every cluster id."""
    return f"10.78.{cluster_id}.{index}"


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
        packages = " ".join(dict.fromkeys(TOOL_PACKAGES[tool] for tool in missing))
        return (
            f"missing tools for the namespace cluster: {', '.join(missing)}; install them "
            f"with `make system-deps` (as root, from the checkout), or "
            f"`apt-get install {packages}`"
        )
    return None


@dataclass
class Node:
    index: int
    name: str
    address: str
    namespace: str
    pid: int | None
    """pid of the node's sshd listener, None while it is stopped."""
    private_dir: Path
    """Host-side path of the directory mounted over NODE_DIR inside the node."""


def make_nodes(cluster_id: int, count: int, private_root: Path) -> list[Node]:
    """Nodes 1..count of a cluster (not started), each with a private dir below private_root."""
    return [
        Node(
            index=k,
            name=f"node{k}",
            address=node_address(cluster_id, k),
            namespace=namespace_name(cluster_id, k),
            pid=None,
            private_dir=private_root / f"node{k}",
        )
        for k in range(1, count + 1)
    ]


# --------------------------------------------------------------------------- nodes


def create_network(cluster_id: int, nodes: Sequence[Node]) -> None:
    """The bridge with the controller's address, and each node's namespace on it."""
    bridge = bridge_name(cluster_id)
    batch = [
        f"link add {bridge} type bridge",
        f"addr add {controller_address(cluster_id)}/24 dev {bridge}",
        f"link set {bridge} up",
    ]
    for node in nodes:
        veth = veth_name(cluster_id, node.index)
        batch += [
            f"netns add {node.namespace}",
            f"link add {veth} type veth peer name eth0 netns {node.namespace}",
            f"link set {veth} master {bridge} up",
        ]
    _run(["ip", "-batch", "-"], input="\n".join(batch) + "\n")
    for node in nodes:
        inside = ["link set lo up", f"addr add {node.address}/24 dev eth0", "link set eth0 up"]
        _run(["ip", "-n", node.namespace, "-batch", "-"], input="\n".join(inside) + "\n")


def _node_prelude(node: Node, hosts_path: Path, fresh_bashrc: bool) -> str:
    """Shell commands that make a fresh mount+UTS namespace into this node."""
    prelude = (
        f"hostname {shlex.quote(node.name)} && "
        f"mount --bind {shlex.quote(str(hosts_path))} /etc/hosts && "
        f"mount --bind {shlex.quote(str(node.private_dir))} {shlex.quote(str(NODE_DIR))}"
    )
    # A fresh node has Debian's default root ~/.bashrc, not this controller's (which
    # may run `pyenv init`, a cost in every SSH command). bash reads
    # ~/.bashrc for commands run by sshd, so without this every node would pay the
    # developer machine's shell set-up.
    bashrc = Path.home() / ".bashrc"
    if fresh_bashrc and bashrc.is_file() and SKEL_BASHRC.is_file():
        prelude += f" && mount --bind {SKEL_BASHRC} {shlex.quote(str(bashrc))}"
    return prelude


def enter_new_node_argv(node: Node, hosts_path: Path, fresh_bashrc: bool, script: str) -> list[str]:
    """argv running the shell `script` in the node's network namespace, in a fresh
    mount+UTS namespace made into the node (hostname, /etc/hosts, NODE_DIR)."""
    return [
        "ip", "netns", "exec", node.namespace,
        "unshare", "--mount", "--uts", "--propagation", "private",
        "sh", "-c", f"{_node_prelude(node, hosts_path, fresh_bashrc)} && {script}",
    ]  # fmt: skip


def exec_argv(
    node: Node, argv: Sequence[str], cwd: str, hosts_path: Path, fresh_bashrc: bool
) -> list[str]:
    """argv running `argv` in `cwd` inside the node, not via ssh: in its sshd's namespaces,
    or, with sshd stopped, in the same node view built afresh."""
    if node.pid is not None and _alive(node.pid):
        return [
            "nsenter", "--target", str(node.pid), "--net", "--mount", "--uts",
            f"--wd={cwd}", "--", *argv,
        ]  # fmt: skip
    script = f'cd {shlex.quote(cwd)} && exec "$@"'
    return [*enter_new_node_argv(node, hosts_path, fresh_bashrc, script), "sh", *argv]


def run_in_node(
    node: Node, argv: Sequence[str], hosts_path: Path, fresh_bashrc: bool, **kw: Any
) -> subprocess.CompletedProcess[Any]:
    """``subprocess.run`` of argv inside the node (:func:`exec_argv`). Defaults:
    capture_output and text, no check, timeout 120 s, the caller's working directory (a
    path the nodes share)."""
    cwd = str(kw.pop("cwd", None) or cwd_or_root())
    if not any(key in kw for key in ("stdout", "stderr", "capture_output")):
        kw["capture_output"] = True
    if not any(key in kw for key in ("text", "universal_newlines", "encoding", "errors")):
        kw["text"] = True
    kw.setdefault("check", False)
    kw.setdefault("timeout", 120)
    return subprocess.run(exec_argv(node, argv, cwd, hosts_path, fresh_bashrc), **kw)


def cwd_or_root() -> str:
    """This process's working directory (a path nodes share), or / if it was deleted."""
    try:
        return os.getcwd()
    except FileNotFoundError:
        return "/"


def namespace_pids(nodes: Sequence[Node]) -> set[int]:
    """Every process in the nodes' network namespaces (sessions, strays) but this one."""
    found: set[int] = set()
    for node in nodes:
        inode = _netns_inode(node.namespace)
        if inode is not None:
            found |= _pids_in_netns(inode)
    found.discard(os.getpid())
    return found


def node_pids(node: Node, *, include_sshd: bool = False) -> list[int]:
    """Live processes inside the node: its network namespace and sshd's descendants.

    Includes processes that left sshd's tree (daemonised, orphaned). Excludes the sshd
    listener itself unless `include_sshd`.
    """
    found: set[int] = set()
    inode = _netns_inode(node.namespace)
    if inode is not None:
        found |= _pids_in_netns(inode)
    if node.pid is not None:
        found |= _descendants(node.pid)
        if include_sshd:
            found.add(node.pid)
        else:
            found.discard(node.pid)
    found.discard(os.getpid())
    return sorted(pid for pid in found if _alive(pid))


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
