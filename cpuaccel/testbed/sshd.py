"""Each test node's sshd: its files (keys, config, log), starting it, and waiting for it.

All files live in the cluster's state dir, named after the node, so that one sshd's config
path identifies it on /proc (see :func:`cpuaccel.testbed.netns._is_our_sshd`).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cpuaccel.connectors.openssh import MUX_PREFIX
from cpuaccel.testbed.netns import SSHD, ClusterError, Node, _cmdline, _is_our_sshd

# --------------------------------------------------------------------------- files


def config_path(state_dir: Path, name: str) -> Path:
    return state_dir / "sshd" / f"{name}.conf"


def host_key_path(state_dir: Path, name: str) -> Path:
    return state_dir / "sshd" / f"{name}_host_ed25519_key"


def pid_path(state_dir: Path, name: str) -> Path:
    return state_dir / f"{name}.pid"


def log_path(state_dir: Path, name: str) -> Path:
    return state_dir / f"{name}.log"


def generate_keys(keys: Sequence[tuple[Path, str]]) -> None:
    """Create ed25519 key pairs (path, comment), all at once; ClusterError if one fails."""
    running = []
    for path, comment in keys:
        argv = ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)]
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        running.append((proc, path))
    for proc, path in running:
        _, err = proc.communicate(timeout=60)
        if proc.returncode != 0:
            raise ClusterError(f"ssh-keygen for {path} failed: {err.strip()}")


def write_files(state_dir: Path, cluster_id: int, nodes: Sequence[Node], user_key: Path) -> None:
    """The user's key pair (`user_key`), and each node's host key and sshd config."""
    keys = [(user_key, f"cpxl{cluster_id}-user")]
    keys += [(host_key_path(state_dir, node.name), node.name) for node in nodes]
    generate_keys(keys)
    for node in nodes:
        host_key = host_key_path(state_dir, node.name)
        text = sshd_config(node, cluster_id, host_key, Path(f"{user_key}.pub"))
        config_path(state_dir, node.name).write_text(text)


def sshd_config(node: Node, cluster_id: int, host_key: Path, authorized_keys: Path) -> str:
    """The sshd_config of one node: root by key only, quiet, many sessions at once."""
    settings = [
        ("ListenAddress", node.address),
        ("Port", "22"),
        ("HostKey", str(host_key)),
        ("AuthorizedKeysFile", str(authorized_keys)),
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
    header = f"# {node.name} of test cluster {cluster_id} (cpuaccel.testbed.cluster)\n"
    return header + "".join(f"{key} {value}\n" for key, value in settings)


# --------------------------------------------------------------------------- processes


def sshd_script(config: Path) -> str:
    """The shell command that becomes the node's sshd (exec: the pid stays the same)."""
    return f"exec {SSHD} -D -e -f {shlex.quote(str(config))}"


def spawn(enter_node_argv: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
    """Start sshd through `enter_node_argv` (which ends in :func:`sshd_script`).

    The Popen child is never a process group leader, so setsid(1) does not fork: every
    link of the chain execs, and the pid we get is sshd's.
    """
    with log.open("ab") as out:
        return subprocess.Popen(
            ["setsid", *enter_node_argv], stdin=subprocess.DEVNULL, stdout=out,
            stderr=subprocess.STDOUT, close_fds=True,
        )  # fmt: skip


def wait_for_sshd(
    nodes: Sequence[Node],
    procs: Mapping[str, subprocess.Popen[bytes]],
    state_dir: Path,
    limit: float,
) -> None:
    """Wait until each node's sshd answers on port 22 and its pid is that sshd."""
    deadline = time.monotonic() + limit
    pending = list(nodes)
    while pending:
        for node in list(pending):
            proc = procs.get(node.name)
            if proc is not None and proc.poll() is not None:
                raise ClusterError(
                    f"sshd of {node.name} ({node.namespace}) exited with {proc.returncode}: "
                    f"{log_tail(log_path(state_dir, node.name))}"
                )
            if ssh_banner(node.address, timeout=0.5):
                pending.remove(node)
        if not pending:
            break
        if time.monotonic() > deadline:
            names = ", ".join(f"{n.name} ({n.address})" for n in pending)
            raise ClusterError(
                f"sshd did not answer on port 22 within {limit:.0f}s on: {names}; "
                f"log of {pending[0].name}: {log_tail(log_path(state_dir, pending[0].name))}"
            )
        time.sleep(0.02)
    for node in nodes:
        assert node.pid is not None
        if not _is_our_sshd(node.pid, config_path(state_dir, node.name)):
            raise ClusterError(
                f"pid {node.pid} of {node.name} is not its sshd: {_cmdline(node.pid)}"
            )


def our_listeners(nodes: Sequence[Node], state_dir: Path) -> list[int]:
    """The pids of these nodes' sshd listeners that still are theirs (checked on /proc)."""
    return [
        node.pid
        for node in nodes
        if node.pid is not None and _is_our_sshd(node.pid, config_path(state_dir, node.name))
    ]


def status_row(node: Node, state_dir: Path) -> dict[str, Any]:
    """name, address, namespace, pid, whether its sshd lives and whether port 22 answers."""
    return {
        "name": node.name,
        "address": node.address,
        "namespace": node.namespace,
        "pid": node.pid,
        "sshd": bool(our_listeners([node], state_dir)),
        "port22": ssh_banner(node.address, timeout=0.5),
    }


def log_tail(log: Path) -> str:
    try:
        text = log.read_text(errors="replace").strip()
    except OSError:
        return "(no log)"
    return text[-2000:] or "(empty log)"


def ssh_banner(address: str, timeout: float) -> bool:
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


_TCP_OPEN = {"01", "08"}  # /proc/net/tcp's ESTABLISHED and CLOSE_WAIT


def open_connections(address: str, port: int = 22) -> int:
    """This machine's TCP connections to address:port not yet closed at this end
    (established, or ended by the node but not yet closed by their process)."""
    wanted = f"{socket.htonl(int.from_bytes(socket.inet_aton(address), 'big')):08X}:{port:04X}"
    try:
        rows = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return 0
    return sum(1 for row in rows if (cols := row.split())[2] == wanted and cols[3] in _TCP_OPEN)


def wait_connections_closed(address: str, timeout: float = 5.0) -> int:
    """Wait until this machine holds no open connection to address:22 (its processes,
    kept ssh masters among them, have seen their connection end); how many are left
    when ``timeout`` is up (a process that keeps its ended connection unclosed)."""
    deadline = time.monotonic() + timeout
    while (left := open_connections(address)) and time.monotonic() < deadline:
        time.sleep(0.02)
    return left


def is_session(pid: int) -> bool:
    """An idle connection's process: an sshd session ("sshd: user@notty", "sshd: user
    [priv]"), or on a head node the ssh master ``cpuaccel check`` keeps there for the
    next check's launcher reach (node/mux.keep_folder), which ends by itself after
    ControlPersist: one that a session started is named "ssh: /tmp/cpuaccel-mux-c<hash>/
    <socket> [mux]"; one ``ssh -N`` started keeps its command line, and is known by its
    socket in that folder."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # gone: nothing left to wait for
    kept = f"ssh: {MUX_PREFIX}c".encode()
    if cmdline.startswith(b"ssh\0") and b"\0-N\0" in cmdline:
        return _listens_below(pid, f"{MUX_PREFIX}c")
    return cmdline.startswith(b"sshd:") or (
        cmdline.startswith(kept) and cmdline.rstrip(b"\0").endswith(b" [mux]")
    )


def _listens_below(pid: int, prefix: str) -> bool:
    """Whether process ``pid`` holds a unix socket bound at a path starting ``prefix``
    (an ssh master binds a temporary name there, then renames it into place)."""
    try:
        inodes = set()
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
        table = Path(f"/proc/{pid}/net/unix").read_text().splitlines()[1:]
    except OSError:
        return True  # gone: nothing left to wait for
    for line in table:
        fields = line.split()
        if len(fields) >= 8 and fields[6] in inodes and fields[7].startswith(prefix):
            return True
    return False
