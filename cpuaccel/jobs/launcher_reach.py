"""The launcher check: the head node's own ssh (the run's ``ssh.sh -N NODE``, with the
run's ssh_config and known_hosts) to every other node, all at once, within run's
preflight and ``check``: no job starts that MPI's launcher cannot start. ``-N``: it
authenticates and opens no session, so no shell (and no ~/.bashrc) runs on the node for
it; the login is kept as an ssh master, which is how ssh returns. A failing pair
is one problem naming head -> node and the fix (``unreached``: from ssh's exit code
and last line).

A run keeps these logins as ssh masters for its launch (``/tmp/cpuaccel-mux-<run id>``,
ended by its sweep); ``check`` keeps them across checks in a folder named by what they
were opened with (connectors/controlpath.head_folder).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from cpuaccel import ui
from cpuaccel.connectors import controlpath, openssh, programs
from cpuaccel.connectors.base import Connector
from cpuaccel.connectors.connect_options import ConnectOptions
from cpuaccel.errors import CpuaccelError
from cpuaccel.executor import ConnectionPool, HostResult
from cpuaccel.facts.problems import ERROR, Problem
from cpuaccel.inventory.host import Host
from cpuaccel.jobs.plan import RunPlan

REACH_TIMEOUT = 15.0  # seconds for every ssh.sh -N NODE from the head, all at once


class LauncherReach:
    """The head node's ssh.sh to every other node, within the preflight pass: it starts
    on a channel of its own once the controller knows every node's key (what the run's
    known_hosts holds), beside the probes. Those keys are known at the first connection
    when the controller's connections are OpenSSH masters and every node's key is
    already in known_hosts (ssh accepts no other); else once the controller has
    connected to every node. A pair whose node, or whose head, the controller's own
    probe then finds failed is left out of the problems: those checks name what is
    wrong, as when the reach waits for every node.

    The files are the draft plan's ssh files, placed in a folder of their own on the
    head (``/tmp/cpuaccel-reach-<run id>``, made exclusively and removed after)."""

    def __init__(
        self,
        draft: RunPlan,
        connect: ConnectOptions,
        pool: ConnectionPool,
        *,
        keep_masters: bool = False,
    ) -> None:
        self.plan = replace(draft, run_dir=f"/tmp/cpuaccel-reach-{draft.run_id}")
        self.connect = connect
        self.pool = pool
        # A run keeps the check's connections as ssh masters for its launch, in a
        # folder of its own that its sweep ends. `check` starts no job: its masters go
        # to a folder named by what they were opened with (connectors/controlpath.
        # head_folder), where the next check within HEAD_PERSIST s logs in through them.
        self.keep_masters = keep_masters
        local_head = draft.head.is_local  # the controller reaches itself without ssh
        self.targets = [h for h in draft.hosts[1:] if not (h.is_local and local_head)]
        if draft.launcher.name == "slurm":  # srun starts the ranks: no ssh between nodes
            self.targets = []
        self._waiting = {h.name for h in draft.hosts}
        self._keys: dict[str, str] = {}
        self._failed: set[str] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._problems: list[Problem] = []
        self._started = False
        self._looked = False  # whether the keys known before connecting were looked up
        self._left = False  # leave(): nobody waits for the check any more

    def connected(self, conn: Connector) -> None:
        known = None
        if conn.opens_lazily and not self._looked:  # the first connection (or a few)
            self._looked = True
            known = self._known_keys()
        self._settle(conn.host.name, conn.host_key(), ok=True, known=known)

    def finished(self, result: HostResult[Any]) -> None:
        self._settle(result.host.name, None, ok=result.ok)  # no-op once connected

    def _known_keys(self) -> dict[str, str] | None:
        """Every host's key as its connection will verify it, when each is an OpenSSH
        master (its key read from known_hosts before it opens, the only one ssh
        accepts) and has one there; None otherwise (a key learned by connecting, a
        connector that tells it only once connected)."""
        from cpuaccel.connectors.choose import connector_for

        with self._lock:
            waiting = [h for h in self.plan.hosts if h.name in self._waiting]
        keys = {}
        for host in waiting:
            if host.is_local:
                continue  # no ssh: no key, connected or not
            conn = connector_for(host, self.pool.options)
            key = conn.host_key() if conn.opens_lazily else None
            if key is None:
                return None
            keys[host.name] = key
        return keys

    def _settle(
        self, name: str, key: str | None, *, ok: bool, known: dict[str, str] | None = None
    ) -> None:
        with self._lock:
            if name not in self._waiting:
                return
            self._waiting.discard(name)
            if not ok:
                self._failed.add(name)  # after the start: its pair is left out
            if self._started:
                return  # the keys are the started check's now
            if key:
                self._keys[name] = key
            if known is not None:
                self._keys.update({h: k for h, k in known.items() if h in self._waiting})
            self._started = ready = not self._waiting or known is not None
        if ready:
            self._start()

    def _start(self) -> None:
        head = self.plan.head
        with self._lock:
            failed = set(self._failed)
        targets = [h for h in self.targets if h.name not in failed]
        if head.name in failed or not targets:
            return  # the controller's own checks name what is wrong

        def work() -> None:
            try:
                from cpuaccel.jobs.rundir import render_ssh_files

                files = render_ssh_files(self.plan, self.connect, self._keys)
                mode, config = files["ssh_config"]
                if self.keep_masters:  # the check's connections stay for the launch
                    files["ssh_config"] = (mode, config + openssh.ssh_config_master())
                    folder = f"--mux={openssh.mux_dir(self.plan.run_id)}"
                else:  # `check`: the head's masters kept across checks, as the controller's
                    known = files["known_hosts"][1]
                    kept = controlpath.head_folder(config, known, self.plan.run_id)
                    files["ssh_config"] = (mode, controlpath.head_config(kept) + config)
                    folder = f"--keep={kept}"
                conn = self.pool.get(head)
                self._problems = check_launcher_reach(conn, self.plan, files, targets, folder)
            except CpuaccelError as exc:
                self._problems = [Problem(ERROR, head.name, str(exc), hint=exc.hint)]

        self._thread = threading.Thread(target=ui.carried(work), name="launcher-reach", daemon=True)
        self._thread.start()

    def leave(self) -> None:
        """No job starts, for a cause found before this check ended (the network
        doctor's): do not wait for its ssh attempts, end them (those it recorded on the
        head, by pid) and the masters they opened."""
        self._left = True
        if self._thread is None:
            return
        what = "ending the launcher check"
        try:
            conn = self.pool.get(self.plan.head)
            words = ["unreach", self.plan.run_dir, self.plan.run_id]
            programs.call(conn, "jobctl", words, what=what, timeout=30.0)
        except CpuaccelError:
            pass  # its own timeout ends it; the masters end ControlPersist seconds after
        self._thread.join(5.0)  # its attempts ended: it answers at once

    def end_masters(self) -> None:
        """No job starts (preflight failed): end the ssh masters the check left."""
        if self._thread is None or not self.keep_masters or self._left:
            return
        self._thread.join(REACH_TIMEOUT + 60)
        what = "ending the launcher check's ssh masters"
        try:
            conn = self.pool.get(self.plan.head)
            programs.call(conn, "jobctl", ["unmux", self.plan.run_id], what=what, timeout=30.0)
        except CpuaccelError:
            pass  # they end by themselves ControlPersist seconds after the check

    def problems(self) -> list[Problem]:
        """What the check found, once it ended (bounded: the node program's timeout),
        without the pairs of a node (or any of a head) that the controller's own checks
        found failed after the reach had started."""
        if self._thread is not None:
            self._thread.join(REACH_TIMEOUT + 60)
        head = self.plan.head.name
        with self._lock:
            failed = set(self._failed)
        if head in failed:
            return []
        left_out = {f"{head} -> {name}" for name in failed}
        return [p for p in self._problems if p.host not in left_out]


def check_launcher_reach(
    head: Connector,
    plan: RunPlan,
    files: dict[str, tuple[int, str]],
    targets: Sequence[Host],
    folder: str | None = None,
) -> list[Problem]:
    """From the head node, ``ssh.sh -N NODE`` to every node of ``targets`` at once,
    with the run's own ssh.sh and ssh_config: the way MPI's launcher will start its
    proxies. A pair that fails is one problem naming head -> node and the fix.
    ``folder``: the head first makes the folder of the masters ``files`` keep open
    (``--mux=DIR``: a run's, for its launch; ``--keep=DIR``: check's, across checks)."""
    if not targets:
        return []
    names = [h.name for h in targets]
    if folder is not None:
        names.insert(0, folder)
    words = ["reach", plan.run_dir, f"{REACH_TIMEOUT:g}", *names]
    payload = json.dumps(files).encode()
    what = "trying the launcher's ssh from the head node"
    try:
        answer = programs.call(
            head, "jobctl", words, payload, what=what, timeout=REACH_TIMEOUT + 30
        )
    except CpuaccelError as exc:
        return [Problem(ERROR, head.host.name, f"{what}: {exc}")]
    problems = []
    for host in targets:
        code, said = answer["reach"].get(host.name) or [None, ""]
        if code != 0:
            problems.append(unreached(plan.head, host, code, said, REACH_TIMEOUT))
    return problems


# ---------------------------------------------------------------- a failing pair


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
