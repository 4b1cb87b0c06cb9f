"""A real multi-node cluster on one machine, for tests and benchmarks.

Each node is a network namespace on a Linux bridge, with its own address, its own sshd,
its own hostname (UTS namespace), its own ``/etc/hosts`` and a private directory mounted
over one common path, :data:`NODE_DIR` (mount namespace). The rest of the filesystem
(the venv, the checkout, /tmp) is shared, like a cluster with an NFS home.

Everything created is named after the cluster id, so several clusters can coexist::

    bridge      cpxl{id}br          address 10.77.{id}.254/24 (the controller side)
    namespace   cpxl{id}-node{k}    eth0 at 10.77.{id}.{k}/24, hostname node{k}
    host veth   cpxl{id}v{k}
    state dir   /tmp/cpxl-{id}/     keys, sshd configs, hosts, known_hosts, inventory.yaml
    lock        /tmp/cpxl-{id}.lock held by the process that owns a running cluster

Needs root. From Python::

    with Cluster(3) as cluster:
        cluster.exec("node1", ["hostname"])

From a shell (nodes keep running after ``up`` returns)::

    python -m cpuaccel.testing.cluster up --nodes 3 [--id N]   # prints the inventory path
    python -m cpuaccel.testing.cluster status [--id N]
    python -m cpuaccel.testing.cluster down [--id N]
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from cpuaccel.testing.netns import (
    _STATE_FILE,
    CONTROLLER_NAME,
    MAX_NODES,
    NODE_DIR,
    PRIVSEP_DIR,
    SKEL_BASHRC,
    SSHD,
    WORKDIR,
    ClusterError,
    _alive,
    _check_id,
    _cmdline,
    _descendants,
    _is_our_sshd,
    _Lock,
    _netns_inode,
    _pids_in_netns,
    _run,
    _terminate,
    bridge_name,
    cleanup_stale,
    controller_address,
    lock_path_for,
    namespace_name,
    node_address,
    state_dir_for,
    unavailable_reason,
    veth_name,
)

# --------------------------------------------------------------------------- cluster


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


class _FlowDict(dict[str, Any]):
    """A mapping written in YAML flow style (``{ansible_host: 10.77.0.1}``)."""


class _InventoryDumper(yaml.SafeDumper):
    pass


def _represent_flow(dumper: yaml.SafeDumper, data: _FlowDict) -> yaml.Node:
    return dumper.represent_mapping("tag:yaml.org,2002:map", data, flow_style=True)


_InventoryDumper.add_representer(_FlowDict, _represent_flow)


class Cluster:
    """N namespace nodes with sshd, a generated key pair, known_hosts and inventory."""

    def __init__(
        self,
        nodes: int,
        cluster_id: int = 0,
        state_root: Path = Path("/tmp"),
        fresh_bashrc: bool = True,
    ) -> None:
        _check_id(cluster_id)
        self.fresh_bashrc = fresh_bashrc
        if not 1 <= nodes <= MAX_NODES:
            raise ValueError(f"nodes must be in 1..{MAX_NODES}, got {nodes}")
        self.cluster_id = cluster_id
        self.state_root = Path(state_root)
        self.state_dir = state_dir_for(cluster_id, self.state_root)
        self.key_path = self.state_dir / "id_ed25519"
        self.known_hosts_path = self.state_dir / "known_hosts"
        self.inventory_path = self.state_dir / "inventory.yaml"
        self.hosts_path = self.state_dir / "hosts"
        self.bridge = bridge_name(cluster_id)
        self.controller_address = controller_address(cluster_id)
        self.python = sys.executable
        self.nodes = [
            Node(
                index=k,
                name=f"node{k}",
                address=node_address(cluster_id, k),
                namespace=namespace_name(cluster_id, k),
                pid=None,
                private_dir=self.state_dir / "nodes" / f"node{k}",
            )
            for k in range(1, nodes + 1)
        ]
        self._lock = _Lock(lock_path_for(cluster_id, self.state_root))
        self._procs: dict[str, subprocess.Popen[bytes]] = {}

    def __repr__(self) -> str:
        return f"Cluster(nodes={len(self.nodes)}, cluster_id={self.cluster_id})"

    # ---- lookup and paths

    def node(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(f"no node {name!r} in {self!r} (nodes: {self.names})")

    @property
    def names(self) -> list[str]:
        return [node.name for node in self.nodes]

    def sshd_config_path(self, name: str) -> Path:
        return self.state_dir / "sshd" / f"{name}.conf"

    def host_key_path(self, name: str) -> Path:
        return self.state_dir / "sshd" / f"{name}_host_ed25519_key"

    def pid_path(self, name: str) -> Path:
        return self.state_dir / f"{name}.pid"

    def log_path(self, name: str) -> Path:
        return self.state_dir / f"{name}.log"

    def ssh_args(self) -> list[str]:
        """`ssh` options that log in to any node strictly (append `root@ADDRESS cmd`)."""
        return [
            "-i",
            str(self.key_path),
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            f"UserKnownHostsFile={self.known_hosts_path}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=10",
        ]

    def ssh_argv(self, name: str, *command: str) -> list[str]:
        """A full system-ssh command line running `command` on node `name` as root."""
        return ["ssh", *self.ssh_args(), f"root@{self.node(name).address}", *command]

    # ---- lifecycle

    def __enter__(self) -> Cluster:
        if not self.running:
            self.up()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.down()

    @property
    def running(self) -> bool:
        return bool(self._procs) or any(node.pid is not None for node in self.nodes)

    def up(self, timeout: float | None = None) -> Cluster:
        """Clean leftovers of this id, create the nodes, and wait until each sshd answers.

        `timeout` bounds the wait for sshd (default 10 s + 0.5 s per node).
        """
        reason = unavailable_reason()
        if reason is not None:
            raise ClusterError(f"cannot start a namespace cluster: {reason}")
        if self.running:
            self.down()  # up() again means a fresh cluster
        self._lock.acquire()
        try:
            cleanup_stale(self.cluster_id, self.state_root)
            self._write_files()
            self._create_network()
            for node in self.nodes:
                self._spawn_sshd(node)
            self._wait_for_sshd(self.nodes, timeout)
            self._save_state()
        except BaseException:
            with contextlib.suppress(Exception):
                self.down()
            raise
        return self

    def down(self) -> None:
        """Kill this cluster's processes; delete its namespaces, links and state dir.

        Idempotent. Kills the sshd listeners it started (verified on /proc) with their process
        groups, and every process inside the nodes' network namespaces (sessions, strays).
        """
        if not self._lock.held:
            self._lock.acquire()
        pids: set[int] = set()
        groups: list[int] = []
        for node in self.nodes:
            if node.pid is not None and _is_our_sshd(node.pid, self.sshd_config_path(node.name)):
                pids.add(node.pid)
                groups.append(node.pid)
            inode = _netns_inode(node.namespace)
            if inode is not None:
                pids |= _pids_in_netns(inode)
        pids.discard(os.getpid())
        _terminate(pids, groups)
        self._reap()
        for node in self.nodes:
            node.pid = None
        try:
            cleanup_stale(self.cluster_id, self.state_root)
        finally:
            self._lock.release(remove=True)

    def _reap(self) -> None:
        for proc in self._procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=2)
        self._procs.clear()

    # ---- files

    def _write_files(self) -> None:
        for path in (self.state_dir, self.state_dir / "sshd", self.state_dir / "nodes"):
            path.mkdir(parents=True, exist_ok=True)
        PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
        # The mount point must exist; it stays empty on the host side.
        NODE_DIR.mkdir(parents=True, exist_ok=True)
        keygens = [self._keygen(self.key_path, f"cpxl{self.cluster_id}-user")]
        for node in self.nodes:
            node.private_dir.mkdir(parents=True, exist_ok=True)
            keygens.append(self._keygen(self.host_key_path(node.name), node.name))
        for proc, path in keygens:
            _, err = proc.communicate(timeout=60)
            if proc.returncode != 0:
                raise ClusterError(f"ssh-keygen for {path} failed: {err.strip()}")

        lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"]
        lines.append(f"{self.controller_address} {CONTROLLER_NAME}")
        lines += [f"{node.address} {node.name}" for node in self.nodes]
        self.hosts_path.write_text("\n".join(lines) + "\n")

        known = []
        for node in self.nodes:
            key_type, key = (
                self.host_key_path(node.name).with_suffix(".pub").read_text().split()[:2]
            )
            known.append(f"{node.name},{node.address} {key_type} {key}")
        self.known_hosts_path.write_text("\n".join(known) + "\n")

        for node in self.nodes:
            self.sshd_config_path(node.name).write_text(self._sshd_config(node))
        self.write_inventory(self.inventory_path)

    @staticmethod
    def _keygen(path: Path, comment: str) -> tuple[subprocess.Popen[str], Path]:
        argv = ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)]
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        return proc, path

    def _sshd_config(self, node: Node) -> str:
        settings = [
            ("ListenAddress", node.address),
            ("Port", "22"),
            ("HostKey", str(self.host_key_path(node.name))),
            ("AuthorizedKeysFile", f"{self.key_path}.pub"),
            ("PermitRootLogin", "prohibit-password"),
            ("PubkeyAuthentication", "yes"),
            ("PasswordAuthentication", "no"),
            ("KbdInteractiveAuthentication", "no"),
            ("UsePAM", "no"),
            ("StrictModes", "no"),
            ("PidFile", "none"),
            ("MaxSessions", "200"),
            ("MaxStartups", "200:30:400"),
            ("PrintMotd", "no"),
            ("PrintLastLog", "no"),
            ("UseDNS", "no"),
            ("X11Forwarding", "no"),
            ("Subsystem", "sftp internal-sftp"),
            ("LogLevel", "ERROR"),
        ]
        header = f"# {node.name} of test cluster {self.cluster_id} (cpuaccel.testing.cluster)\n"
        return header + "".join(f"{key} {value}\n" for key, value in settings)

    def write_inventory(
        self,
        path: Path | str,
        host_overrides: Mapping[str, Mapping[str, Any]] | None = None,
        *,
        only: Sequence[str] | None = None,
        **extra_vars: Any,
    ) -> Path:
        """Write an Ansible YAML inventory of this cluster to `path` and return it.

        `host_overrides` adds or replaces host vars per node (e.g. another
        ``cpuaccel_python`` on one node); `only` limits the hosts listed; `extra_vars` adds
        or replaces group vars under ``all.vars`` (None leaves one of the defaults out).
        """
        overrides = dict(host_overrides or {})
        unknown = set(overrides) - set(self.names)
        if only is not None:
            unknown |= set(only) - set(self.names)
        if unknown:
            raise KeyError(f"no such nodes in {self!r}: {sorted(unknown)}")
        group_vars: dict[str, Any] = {
            "ansible_user": "root",
            "ansible_ssh_private_key_file": str(self.key_path),
            "ansible_ssh_common_args": (
                f"-o UserKnownHostsFile={self.known_hosts_path} -o StrictHostKeyChecking=yes"
            ),
            # Without it ansible-core probes for an interpreter over ssh, and on a machine
            # with pyenv in root's login PATH it picks a shim that fails on the nodes. The
            # caller's venv python is on every node (shared filesystem).
            "ansible_python_interpreter": self.python,
            "cpuaccel_python": self.python,
            "cpuaccel_workdir": str(WORKDIR),
        }
        group_vars.update(extra_vars)
        # None removes a default (e.g. cpuaccel_python=None: nodes use cpuaccel_venv).
        group_vars = {k: v for k, v in group_vars.items() if v is not None}
        hosts: dict[str, Any] = {}
        for node in self.nodes:
            if only is not None and node.name not in only:
                continue
            host = _FlowDict(ansible_host=node.address)
            host.update(overrides.get(node.name, {}))
            hosts[node.name] = host
        document = {"all": {"vars": group_vars, "hosts": hosts}}
        text = yaml.dump(
            document, Dumper=_InventoryDumper, sort_keys=False, default_flow_style=False, width=200
        )
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        return out

    def _save_state(self) -> None:
        state = {
            "cluster_id": self.cluster_id,
            "python": self.python,
            "nodes": [
                {"name": n.name, "address": n.address, "namespace": n.namespace, "pid": n.pid}
                for n in self.nodes
            ],
        }
        (self.state_dir / _STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")

    # ---- network

    def _create_network(self) -> None:
        prefix = f"{self.controller_address}/24"
        batch = [
            f"link add {self.bridge} type bridge",
            f"addr add {prefix} dev {self.bridge}",
            f"link set {self.bridge} up",
        ]
        for node in self.nodes:
            veth = veth_name(self.cluster_id, node.index)
            batch += [
                f"netns add {node.namespace}",
                f"link add {veth} type veth peer name eth0 netns {node.namespace}",
                f"link set {veth} master {self.bridge} up",
            ]
        _run(["ip", "-batch", "-"], input="\n".join(batch) + "\n")
        for node in self.nodes:
            inside = ["link set lo up", f"addr add {node.address}/24 dev eth0", "link set eth0 up"]
            _run(["ip", "-n", node.namespace, "-batch", "-"], input="\n".join(inside) + "\n")

    # ---- sshd

    def _node_prelude(self, node: Node) -> str:
        """Shell commands that make a fresh mount+UTS namespace into this node."""
        prelude = (
            f"hostname {shlex.quote(node.name)} && "
            f"mount --bind {shlex.quote(str(self.hosts_path))} /etc/hosts && "
            f"mount --bind {shlex.quote(str(node.private_dir))} {shlex.quote(str(NODE_DIR))}"
        )
        # A fresh node has Debian's default root ~/.bashrc, not this controller's (which
        # here runs `pyenv init`, ~100 ms of CPU in every SSH command). bash reads
        # ~/.bashrc for commands run by sshd, so without this every node would pay the
        # developer machine's shell set-up.
        bashrc = Path.home() / ".bashrc"
        if self.fresh_bashrc and bashrc.is_file() and SKEL_BASHRC.is_file():
            prelude += f" && mount --bind {SKEL_BASHRC} {shlex.quote(str(bashrc))}"
        return prelude

    def _enter_new_node_argv(self, node: Node, script: str) -> list[str]:
        return [
            "ip", "netns", "exec", node.namespace,
            "unshare", "--mount", "--uts", "--propagation", "private",
            "sh", "-c", f"{self._node_prelude(node)} && {script}",
        ]  # fmt: skip

    def _spawn_sshd(self, node: Node) -> None:
        config = self.sshd_config_path(node.name)
        script = f"exec {SSHD} -D -e -f {shlex.quote(str(config))}"
        # The Popen child is never a process group leader, so setsid(1) does not fork:
        # every link of the chain execs, and the pid we get is sshd's.
        argv = ["setsid", *self._enter_new_node_argv(node, script)]
        with self.log_path(node.name).open("ab") as log:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                close_fds=True,
            )  # fmt: skip
        self._procs[node.name] = proc
        node.pid = proc.pid
        self.pid_path(node.name).write_text(f"{proc.pid}\n")

    def _wait_for_sshd(self, nodes: Sequence[Node], timeout: float | None) -> None:
        limit = timeout if timeout is not None else 10.0 + 0.5 * len(nodes)
        deadline = time.monotonic() + limit
        pending = list(nodes)
        while pending:
            for node in list(pending):
                proc = self._procs.get(node.name)
                if proc is not None and proc.poll() is not None:
                    raise ClusterError(
                        f"sshd of {node.name} ({node.namespace}) exited with {proc.returncode}: "
                        f"{self._log_tail(node.name)}"
                    )
                if _ssh_banner(node.address, timeout=0.5):
                    pending.remove(node)
            if not pending:
                break
            if time.monotonic() > deadline:
                names = ", ".join(f"{n.name} ({n.address})" for n in pending)
                raise ClusterError(
                    f"sshd did not answer on port 22 within {limit:.0f}s on: {names}; "
                    f"log of {pending[0].name}: {self._log_tail(pending[0].name)}"
                )
            time.sleep(0.02)
        for node in nodes:
            assert node.pid is not None
            if not _is_our_sshd(node.pid, self.sshd_config_path(node.name)):
                raise ClusterError(
                    f"pid {node.pid} of {node.name} is not its sshd: {_cmdline(node.pid)}"
                )

    def _log_tail(self, name: str) -> str:
        try:
            text = self.log_path(name).read_text(errors="replace").strip()
        except OSError:
            return "(no log)"
        return text[-2000:] or "(empty log)"

    def stop_sshd(self, name: str, *, kill_sessions: bool = False) -> None:
        """Stop a node's sshd so that port 22 refuses connections (the node stays).

        Like stopping the ssh service on a real host, sessions already open survive unless
        `kill_sessions` is set, which kills every process in the node.
        """
        node = self.node(name)
        pids: set[int] = set()
        groups: list[int] = []
        if node.pid is not None and _is_our_sshd(node.pid, self.sshd_config_path(name)):
            pids.add(node.pid)
            groups.append(node.pid)
        if kill_sessions:
            pids |= set(self.pids(name, include_sshd=True))
        _terminate(pids, groups)
        proc = self._procs.pop(name, None)
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=2)
        node.pid = None
        with contextlib.suppress(FileNotFoundError):
            self.pid_path(name).unlink()
        self._save_state()

    def start_sshd(self, name: str, timeout: float = 10.0) -> Node:
        """Start a node's sshd again (no-op if it runs) and wait until it answers."""
        node = self.node(name)
        if node.pid is not None and _alive(node.pid):
            return node
        self._procs.pop(name, None)
        self._spawn_sshd(node)
        self._wait_for_sshd([node], timeout)
        self._save_state()
        return node

    @contextlib.contextmanager
    def sshd_stopped(self, name: str, *, kill_sessions: bool = False) -> Iterator[Node]:
        """Within the block, `name` refuses ssh connections; its sshd is back after it."""
        self.stop_sshd(name, kill_sessions=kill_sessions)
        try:
            yield self.node(name)
        finally:
            self.start_sshd(name)

    def ensure_running(self) -> list[str]:
        """Restart any node whose sshd is not running; return the names restarted."""
        restarted = []
        for node in self.nodes:
            if node.pid is None or not _alive(node.pid):
                node.pid = None
                self.start_sshd(node.name)
                restarted.append(node.name)
        return restarted

    # ---- inspection

    def exec(self, name: str, argv: Sequence[str], **kw: Any) -> subprocess.CompletedProcess[Any]:
        """Run argv inside node `name` (its net, mount and UTS namespaces), not via ssh.

        Keyword arguments go to subprocess.run. Defaults: capture_output and text, no check,
        timeout 120 s, and the caller's working directory (a shared path).
        """
        node = self.node(name)
        cwd = str(kw.pop("cwd", None) or _cwd_or_root())
        if not any(key in kw for key in ("stdout", "stderr", "capture_output")):
            kw["capture_output"] = True
        if not any(key in kw for key in ("text", "universal_newlines", "encoding", "errors")):
            kw["text"] = True
        kw.setdefault("check", False)
        kw.setdefault("timeout", 120)
        if node.pid is not None and _alive(node.pid):
            full = [
                "nsenter", "--target", str(node.pid), "--net", "--mount", "--uts",
                f"--wd={cwd}", "--", *argv,
            ]  # fmt: skip
        else:
            # sshd stopped: build the same node view in a fresh mount+UTS namespace.
            script = f'cd {shlex.quote(cwd)} && exec "$@"'
            full = [*self._enter_new_node_argv(node, script), "sh", *argv]
        return subprocess.run(full, **kw)

    def pids(self, name: str, *, include_sshd: bool = False) -> list[int]:
        """Live processes inside node `name`: its network namespace and sshd's descendants.

        Includes processes that left sshd's tree (daemonised, orphaned). Excludes the sshd
        listener itself unless `include_sshd`.
        """
        node = self.node(name)
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

    def wait_idle(self, name: str, timeout: float = 10.0) -> list[int]:
        """Wait until node `name` has no process but its sshd; return what is left."""
        deadline = time.monotonic() + timeout
        while True:
            left = self.pids(name)
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.05)

    def clear_private_dirs(self) -> None:
        """Empty every node's private directory (what nodes see at NODE_DIR)."""
        for node in self.nodes:
            for entry in node.private_dir.iterdir():
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()

    def status(self) -> list[dict[str, Any]]:
        """One row per node: name, address, pid, whether sshd lives and answers."""
        rows = []
        for node in self.nodes:
            alive = node.pid is not None and _is_our_sshd(
                node.pid, self.sshd_config_path(node.name)
            )
            rows.append(
                {
                    "name": node.name,
                    "address": node.address,
                    "namespace": node.namespace,
                    "pid": node.pid,
                    "sshd": alive,
                    "port22": _ssh_banner(node.address, timeout=0.5),
                }
            )
        return rows

    @classmethod
    def attach(cls, cluster_id: int = 0, state_root: Path = Path("/tmp")) -> Cluster:
        """A Cluster object for nodes started by another process (e.g. the `up` command).

        It does not own the lock; its down() still removes everything of that id.
        """
        state_file = state_dir_for(cluster_id, state_root) / _STATE_FILE
        try:
            state = json.loads(state_file.read_text())
        except (OSError, ValueError) as exc:
            raise ClusterError(f"no running cluster {cluster_id}: {exc}") from None
        cluster = cls(len(state["nodes"]), cluster_id, state_root)
        cluster.python = state.get("python", cluster.python)
        for node, saved in zip(cluster.nodes, state["nodes"], strict=True):
            pid = saved.get("pid")
            ok = pid is not None and _is_our_sshd(pid, cluster.sshd_config_path(node.name))
            node.pid = pid if ok else None
        return cluster


def _cwd_or_root() -> str:
    try:
        return os.getcwd()
    except FileNotFoundError:
        return "/"


def _ssh_banner(address: str, timeout: float) -> bool:
    """True if an SSH server answers with its banner on address:22."""
    try:
        with socket.create_connection((address, 22), timeout=timeout) as sock:
            sock.settimeout(timeout)
            ok = sock.recv(8).startswith(b"SSH-")
            # Say who we are before hanging up, or sshd logs an error for each probe.
            with contextlib.suppress(OSError):
                sock.sendall(b"SSH-2.0-cpxl-probe\r\n")
            return ok
    except OSError:
        return False


# The shell commands (up, down, status) live in cluster_cli; `python -m` runs them here.
if __name__ == "__main__":
    from cpuaccel.testing.cluster_cli import main

    sys.exit(main())
