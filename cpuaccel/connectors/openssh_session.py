"""Commands through the OpenSSH ``ssh`` binary, on a master connection kept across
commands (ControlMaster=auto, ControlPersist), as Ansible's default ``ssh`` connection.

A command within PERSIST_SECONDS of the last one to the same host reuses its master:
no handshake, and no paramiko, cryptography or Fabric imported in the controller at all.
The argv is ``openssh.ssh_argv`` (the host's user, port, key, ProxyJump hops, host-key
policy, keepalives, ConnectTimeout), plus the master's options (connectors/controlpath.py:
where the socket lives and why a master to a changed host is never reused). Every
command is a line rendered by ``commandline.shell_line``, run by LocalConnector's
machinery with ssh in front (``wrap``): stdin, timeouts (the process group killed),
streaming (``start``) behave as on a local host.

ssh's own failures (exit status 255 with ssh's words) become the same errors as the
paramiko connector's: HostKeyError for an unknown or changed key (``openssh.refused_key``),
Unreachable for a node that cannot be reached or logged into.
"""

from __future__ import annotations

import re
import subprocess
import time
from typing import BinaryIO

from cpuaccel import ui
from cpuaccel.connectors import controlpath, kex, known_lines, openssh
from cpuaccel.connectors.base import Command, Process, RsyncRoute, cannot_connect
from cpuaccel.connectors.hostkeys import (
    SYSTEM_KNOWN_HOSTS,
    host_key_policy,
    refuse_inline_proxy,
    refuse_unreadable_known_hosts,
)
from cpuaccel.connectors.local import LocalConnector
from cpuaccel.errors import HostKeyError, Unreachable

PERSIST = controlpath.PERSIST_SECONDS
SSH_FAILED = 255  # ssh's own exit status; a remote command's 255 has none of its words
# ssh's words when it could not connect, log in, or lost its connection (ssh.c,
# sshconnect.c, clientloop.c, mux.c): a 255 without them is the remote command's own.
# Patterns, compiled by re on first use: only a failed command reads them.
_SSH_WORDS = (
    r"^(?:ssh: |kex_exchange_identification: |Connection (?:closed|reset|timed out)"
    r"|(?:\S+: )?Permission denied \(|Host key verification failed|Timeout, server "
    r"|client_loop: |mux_client_|Control socket |banner exchange: )"
)


_CONNECT = r"^ssh: connect to host \S+ port \d+: "


class OpenSSHConnector(LocalConnector):
    """A host reached with ``ssh`` over a kept master connection."""

    opens_lazily = True
    _reached = False  # a command went through: the connection is up
    _ssh: list[str] | None = None
    _hops: list[openssh.Hop] | None = None

    def connect(self) -> None:
        # Nothing is opened here: the first command opens (or reuses) the master, and
        # its failure says why. What can be judged without the network is judged now.
        self._argv()

    def _argv(self) -> list[str]:
        """ssh's argv up to the host: openssh's, quiet, and the master's options."""
        if self._ssh is None:
            refuse_inline_proxy(self.host)
            hops = openssh.jump_hops(self.host)
            base = openssh.ssh_argv(self.host, self.options, hops)
            # LogLevel=ERROR: no "Permanently added" line when checking is off; the
            # refusals (error level) still reach refused_key.
            base += ["-o", "LogLevel=ERROR"]
            policy = host_key_policy(self.host, self.options)
            if policy.check:  # as the paramiko connector: judged before ssh reads it
                refuse_unreadable_known_hosts(self.host.name, policy.extra_known_hosts)
            known = policy.known_hosts
            path = controlpath.control_path(
                controlpath.ensure_dir(), base, self.host.address, known
            )
            self._hops = hops
            # The key exchange is not part of the socket's name: a master opened with
            # either offer is the same connection to the same verified key.
            self._ssh = [
                *base,
                *kex.master_options(self.host, path),
                *controlpath.mux_options(path),
            ]
        return self._ssh

    def control_path(self) -> str:
        """The socket of this host's master (for ``ssh -O check``)."""
        argv = self._argv()
        option = next(word for word in argv if word.startswith("ControlPath="))
        return option.removeprefix("ControlPath=").strip('"').replace("%%", "%")

    def ssh_argv(self) -> list[str]:
        """The tools that start ssh themselves (rsync) share the master too."""
        return list(self._argv())

    def wrap(self, line: str) -> list[str]:
        # ``--`` before the address: no host is ever read as an option. ssh sends the
        # one line as the remote command, which the login shell runs, as paramiko's
        # exec_command does.
        return [*self._argv(), "-T", "--", self.host.address, line]

    def failure(self, exit_code: int, stderr: str) -> Unreachable | None:
        return self._failure(stderr) if exit_code == SSH_FAILED else None

    def _failure(self, stderr: str) -> Unreachable | None:
        """The error ssh's own words on stderr describe, if they are ssh's."""
        refused = openssh.refused_key(stderr, self._hops or [])
        if refused is not None:
            return HostKeyError(self.host.name, refused[0].replace("rsync's ", ""), hint=refused[1])
        if not stderr.strip():
            # A master that ended under a session (ended by hand, or its node gone)
            # leaves its clients exit 255 and no word at LogLevel=ERROR; a master still
            # there means the command itself exited 255.
            if self._master_alive():
                return None
            hint = (
                "run the command again (a new connection is opened); if it persists, "
                "check that the node is up"
            )
            if any(word.startswith("KexAlgorithms=") for word in self._argv()):
                # ssh says "Unable to negotiate" at INFO, below LogLevel=ERROR
                hint += (
                    ", and whether its sshd takes only sntrup761x25519, which cpuaccel "
                    "leaves out unless KexAlgorithms is set for it in ~/.ssh/config"
                )
            return Unreachable(
                self.host.name,
                f"the ssh connection to {self.host.address} ended (exit 255, no message)",
                hint=hint,
            )
        found = re.search(_SSH_WORDS, stderr, re.MULTILINE)
        if found is None:
            return None
        said = stderr[found.start() :].splitlines()[0].strip()
        where = f"{self.host.address}:{openssh.port_of(self.host)}"
        if "Permission denied (" in said:
            return Unreachable(
                self.host.name,
                f"authentication failed as {self._user()}@{where}: {said}",
                hint="check ansible_user and ansible_ssh_private_key_file (or -u, --private-key)",
            )
        # "ssh: connect to host A port P: Connection refused": the OS's words, as the
        # paramiko connector gives them.
        reason = re.sub(_CONNECT, "", said)
        via = f" via ProxyJump {', '.join(hop.address for hop in self._hops)}" if self._hops else ""
        return cannot_connect(self.host, f"{where}{via}", reason)

    def _master_alive(self) -> bool:
        """Whether this host's master answers (``ssh -O check``: its socket only)."""
        argv = [*self._argv(), "-O", "check", "--", self.host.address]
        try:
            return subprocess.run(argv, capture_output=True, timeout=10).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False

    def _user(self) -> str:
        """Who ssh logs in as: the inventory's (or -u's), else the local user (ssh's
        own default, unless ssh_config names another)."""
        import getpass

        return openssh.login_user(self.host, self.options) or getpass.getuser()

    def execute(
        self, command: Command, stdin: bytes | BinaryIO | None, timeout: float
    ) -> tuple[int, bytes, bytes]:
        started = time.monotonic()
        code, out, err = super().execute(command, stdin, timeout)
        if code == SSH_FAILED:
            failure = self._failure(err.decode(errors="replace"))
            if failure is not None:
                raise failure
        if not self._reached:  # -v's line, as the paramiko connector's at connect
            self._reached = True
            if ui.verbosity >= 1:  # built only then: its user and port read ssh_config
                where = f"{self._user()}@{self.host.address}:{openssh.port_of(self.host)}"
                took = f"in {time.monotonic() - started:.2f} s (ssh, a connection kept {PERSIST}s)"
                ui.detail(1, self.host.name, f"connected as {where} {took}")
        return code, out, err

    def spawn(self, command: Command) -> Process:
        self._argv()  # the folder and the argv judged before anything starts
        return super().spawn(command)

    def rsync_route(self, dest: str) -> RsyncRoute:
        # rsync's ssh goes through the same master: no handshake of its own.
        spec = openssh.remote_spec(self.host, dest)
        return RsyncRoute(spec, self._argv(), self._hops or [], " (on the controller)")

    def host_key(self) -> str | None:
        """The known key ssh verified the host against (ssh accepts no other), for the
        run's own known_hosts; None when checking is off."""
        policy = host_key_policy(self.host, self.options)
        if not policy.check:
            return None
        port = openssh.port_of(self.host)
        name = (
            self.host.address if port == openssh.DEFAULT_PORT else f"[{self.host.address}]:{port}"
        )
        return known_lines.preferred_key(name, [*policy.known_hosts, SYSTEM_KNOWN_HOSTS])

    def close(self) -> None:
        pass  # the master stays for the next command; it ends itself when idle
