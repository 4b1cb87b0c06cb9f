"""A real multi-node cluster on one machine, for tests and benchmarks.

Each node is a network namespace on a Linux bridge, with its own address, sshd, hostname
(UTS namespace), ``/etc/hosts`` and a private directory mounted over one common path,
:data:`NODE_DIR`. The rest (the venv, the checkout, /tmp) is shared, like an NFS home.

The parts live next to this class: ``netns`` (names, namespaces, processes), ``sshd``,
``inventory_file`` (inventory, known_hosts, hosts), ``state`` (state file, lock and
clean-up, found again by id) and ``slurm`` (the optional Slurm daemons, ``slurm=True``).

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

    python -m cpuaccel.testbed up --nodes 3 [--id N] [--slurm]  # prints the inventory
    python -m cpuaccel.testbed status [--id N]
    python -m cpuaccel.testbed down [--id N]
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from cpuaccel.testbed import slurm as slurm_daemons
from cpuaccel.testbed import sshd
from cpuaccel.testbed.inventory_file import (
    Access,
    hosts_text,
    inventory_text,
    known_hosts_text,
)
from cpuaccel.testbed.netns import (
    MAX_NODES,
    NODE_DIR,
    PRIVSEP_DIR,
    WORKDIR,
    ClusterError,
    Node,
    _alive,
    _check_id,
    _cmdline,
    _is_our_sshd,
    _terminate,
    bridge_name,
    controller_address,
    create_network,
    enter_new_node_argv,
    lock_path_for,
    make_nodes,
    namespace_name,
    namespace_pids,
    node_pids,
    run_in_node,
    state_dir_for,
    unavailable_reason,
    veth_name,
)
from cpuaccel.testbed.state import Lock, cleanup_stale, load_state, save_state

# Tests and benches import these names from here, where the cluster is.
__all__ = [
    "NODE_DIR", "WORKDIR", "Cluster", "ClusterError", "Node",
    "bridge_name", "lock_path_for", "namespace_name", "unavailable_reason", "veth_name",
]  # fmt: skip


class Stray(int):
    """A pid left running, shown with its command line: a failed idle check says what."""

    command: str

    def __new__(cls, pid: int, command: str) -> Stray:
        stray = super().__new__(cls, pid)
        stray.command = command[:200]
        return stray

    def __repr__(self) -> str:
        return f"{int(self)} ({self.command or 'gone'})"


class Cluster:
    """N namespace nodes with sshd, a generated key pair, known_hosts and inventory."""

    def __init__(
        self,
        nodes: int,
        cluster_id: int = 0,
        state_root: Path = Path("/tmp"),
        fresh_bashrc: bool = True,
        slurm: bool = False,
    ) -> None:
        _check_id(cluster_id)
        self.fresh_bashrc = fresh_bashrc
        self.slurm_wanted = slurm
        self.slurm_bed: slurm_daemons.SlurmBed | None = None
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
        self.nodes = make_nodes(cluster_id, nodes, self.state_dir / "nodes")
        self._lock = Lock(lock_path_for(cluster_id, self.state_root))
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
        return sshd.config_path(self.state_dir, name)

    def host_key_path(self, name: str) -> Path:
        return sshd.host_key_path(self.state_dir, name)

    def pid_path(self, name: str) -> Path:
        return sshd.pid_path(self.state_dir, name)

    def log_path(self, name: str) -> Path:
        return sshd.log_path(self.state_dir, name)

    def ssh_args(self) -> list[str]:
        """`ssh` options that log in to any node strictly (append `root@ADDRESS cmd`)."""
        return [
            "-i", str(self.key_path), "-o", "IdentitiesOnly=yes",
            "-o", f"UserKnownHostsFile={self.known_hosts_path}", "-o", "StrictHostKeyChecking=yes",
            "-o", "BatchMode=yes", "-o", "ConnectTimeout=10",
        ]  # fmt: skip

    def ssh_argv(self, name: str, *command: str) -> list[str]:
        """A full system-ssh command line running `command` on node `name` as root."""
        return ["ssh", *self.ssh_args(), f"root@{self.node(name).address}", *command]

    # ---- lifecycle

    def __enter__(self) -> Cluster:
        if not self.running:
            self.up()
        return self

    def __exit__(self, *exc_info: object) -> None:
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
            create_network(self.cluster_id, self.nodes)
            for node in self.nodes:
                self._spawn_sshd(node)
            self._wait_for_sshd(self.nodes, timeout)
            self._save_state()
            if self.slurm_wanted:
                self.start_slurm()
        except BaseException:
            with contextlib.suppress(Exception):
                self.down()
            raise
        return self

    def down(self) -> None:
        """Kill this cluster's processes (its Slurm, its sshd listeners checked on /proc, all
        in its namespaces); delete its namespaces, links and state dir. Idempotent."""
        if not self._lock.held:
            self._lock.acquire()
        if self.slurm_bed is not None:
            self.slurm_bed.stop()  # its daemons first: slurmd would see its node vanish
            self.slurm_bed = None
        groups = sshd.our_listeners(self.nodes, self.state_dir)
        pids = set(groups) | namespace_pids(self.nodes)
        _terminate(pids, groups)
        for proc in self._procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=2)
        self._procs.clear()
        for node in self.nodes:
            node.pid = None
        try:
            cleanup_stale(self.cluster_id, self.state_root)
        finally:
            self._lock.release(remove=True)

    def leave_running(self) -> None:
        """Let the nodes outlive this process (the `up` command): release the lock, keep
        the state. A later ``Cluster.attach(...).down()`` or ``down`` command removes them."""
        self._lock.release(remove=False)

    def start_slurm(self, *, cpus: int | None = None) -> slurm_daemons.SlurmBed:
        """Slurm on the running nodes (:mod:`~cpuaccel.testbed.slurm`), started or the one
        running; `down` stops it. `cpus`: each node's (default this machine's, at least 2)."""
        if self.slurm_bed is None or not self.slurm_bed.running:
            self.slurm_bed = slurm_daemons.attach(self) or slurm_daemons.start(self, cpus)
        return self.slurm_bed

    # ---- files

    def _write_files(self) -> None:
        for path in (self.state_dir, self.state_dir / "sshd", self.state_dir / "nodes"):
            path.mkdir(parents=True, exist_ok=True)
        PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
        # The mount point must exist; it stays empty on the host side.
        NODE_DIR.mkdir(parents=True, exist_ok=True)
        for node in self.nodes:
            node.private_dir.mkdir(parents=True, exist_ok=True)
        sshd.write_files(self.state_dir, self.cluster_id, self.nodes, self.key_path)
        self.hosts_path.write_text(hosts_text(self.controller_address, self.nodes))
        self.known_hosts_path.write_text(
            known_hosts_text([(node, self.host_key_path(node.name)) for node in self.nodes])
        )
        self.write_inventory(self.inventory_path)

    def write_inventory(
        self,
        path: Path | str,
        host_overrides: Mapping[str, Mapping[str, Any]] | None = None,
        *,
        only: Sequence[str] | None = None,
        aliases: Mapping[str, str] | None = None,
        **extra_vars: Any,
    ) -> Path:
        """Write an Ansible YAML inventory of this cluster to `path` and return it.
        `host_overrides` adds or replaces host vars per node (e.g. another ``cpuaccel_python``
        on one node); `only` limits the hosts listed; `aliases` lists node ``nodeK`` under
        another inventory name, still reached by its ``ansible_host`` address (names that
        resolve nowhere: ``netfaults.alias_names``); `extra_vars` adds or replaces group
        vars under ``all.vars`` (None leaves one of the defaults out)."""
        text = inventory_text(
            self.nodes,
            Access(self.key_path, self.known_hosts_path, self.python),
            host_overrides=host_overrides or {},
            only=only,
            extra_vars=extra_vars,
            owner=repr(self),
            aliases=aliases,
        )
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        return out

    def _save_state(self) -> None:
        save_state(self.state_dir, self.cluster_id, self.python, self.nodes)

    # ---- sshd

    def _spawn_sshd(self, node: Node) -> None:
        script = sshd.sshd_script(self.sshd_config_path(node.name))
        enter = enter_new_node_argv(node, self.hosts_path, self.fresh_bashrc, script)
        proc = sshd.spawn(enter, self.log_path(node.name))
        self._procs[node.name] = proc
        node.pid = proc.pid
        self.pid_path(node.name).write_text(f"{proc.pid}\n")

    def _wait_for_sshd(self, nodes: Sequence[Node], timeout: float | None) -> None:
        limit = timeout if timeout is not None else 10.0 + 0.5 * len(nodes)
        sshd.wait_for_sshd(nodes, self._procs, self.state_dir, limit)

    def stop_sshd(self, name: str, *, kill_sessions: bool = False) -> None:
        """Stop a node's sshd so that port 22 refuses connections (the node stays).

        Like stopping the ssh service on a real host, sessions already open survive unless
        `kill_sessions` is set, which kills every process in the node and then waits until
        this machine's ends of those connections are closed too: a kept ssh master that
        has not yet read its connection's end would still take the next session, and lose
        it with no word, where a real host that went away refuses it.
        """
        node = self.node(name)
        groups = sshd.our_listeners([node], self.state_dir)
        pids = set(groups)
        if kill_sessions:
            pids |= set(self.pids(name, include_sshd=True))
        _terminate(pids, groups)
        if kill_sessions:
            sshd.wait_connections_closed(node.address)
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
        """Run argv inside node `name` (its net, mount and UTS namespaces), not via ssh
        (:func:`netns.run_in_node`: captured text output, no check, 120 s, the caller's
        working directory unless ``cwd`` is given)."""
        return run_in_node(self.node(name), argv, self.hosts_path, self.fresh_bashrc, **kw)

    def pids(self, name: str, *, include_sshd: bool = False) -> list[int]:
        """Live processes inside node `name` (:func:`node_pids`; its sshd listener only with
        `include_sshd`), never its slurmd: a test bed's daemon, no process of a test's job."""
        found = node_pids(self.node(name), include_sshd=include_sshd)
        return slurm_daemons.without_daemons(self.slurm_bed, found)

    def wait_idle(self, name: str, timeout: float = 10.0) -> list[Stray]:
        """Wait until node `name` runs no process but idle connections (sshd.is_session).

        An sshd session running no command stays idle: the controller's kept ssh
        masters (check's and sync's, connectors/openssh_session.py) hold one each for
        their idle time, as Ansible's ControlPersist masters do. Any command counts."""
        deadline = time.monotonic() + timeout
        while True:
            left = [pid for pid in self.pids(name) if not sshd.is_session(pid)]
            if not left or time.monotonic() > deadline:
                return [Stray(pid, " ".join(_cmdline(pid))) for pid in left]
            time.sleep(0.05)

    def status(self) -> list[dict[str, Any]]:
        """One row per node: name, address, pid, whether sshd lives and answers."""
        return [sshd.status_row(node, self.state_dir) for node in self.nodes]

    @classmethod
    def attach(cls, cluster_id: int = 0, state_root: Path = Path("/tmp")) -> Cluster:
        """A Cluster object for nodes started by another process (e.g. the `up` command).

        It does not own the lock; its down() still removes everything of that id.
        """
        state = load_state(cluster_id, state_root)
        cluster = cls(len(state["nodes"]), cluster_id, state_root)
        cluster.python = state.get("python", cluster.python)
        for node, saved in zip(cluster.nodes, state["nodes"], strict=True):
            pid = saved.get("pid")
            ok = pid is not None and _is_our_sshd(pid, cluster.sshd_config_path(node.name))
            node.pid = pid if ok else None
        cluster.slurm_bed = slurm_daemons.attach(cluster)
        return cluster
