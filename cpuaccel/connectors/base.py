"""What every connector offers: everything about reaching one host.

A connector runs commands on its host and collects their results, pushes trees to it
with rsync, and gives the ssh argv for the tools that start ``ssh`` themselves (MPI's
launcher), with the host-key policy of connectors/hostkeys.py throughout.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import BinaryIO

from cpuaccel import ui
from cpuaccel.connectors import commandline, openssh
from cpuaccel.connectors.connect_options import ConnectOptions
from cpuaccel.connectors.rsync import RsyncResult, rsync_argv, run_rsync, shown_rsync
from cpuaccel.errors import CommandTimeout, HostError, HostKeyError, Unreachable
from cpuaccel.inventory.host import Host


@dataclass(frozen=True)
class CommandResult:
    host: str
    command: str
    exit_code: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


@dataclass(frozen=True)
class Command:
    """One command for a host: ``line``, the shell line that runs it (quoted in one
    place, commandline.shell_line), and ``shown``, what logs and errors say of it (no
    environment values)."""

    line: str
    shown: str

    @classmethod
    def of(cls, argv: Sequence[str], env: Mapping[str, str] | None, cwd: str | None) -> Command:
        return cls(
            commandline.shell_line(argv, env=env, cwd=cwd),
            commandline.shown_line(argv, env=env, cwd=cwd),
        )


@dataclass(frozen=True)
class RsyncRoute:
    """How rsync reaches a host: the destination as rsync names it, the ssh argv rsync
    starts (None for a path on this machine), the ProxyJump hops its refusals name, and
    what the shown command line adds."""

    dest: str
    ssh: list[str] | None = None
    hops: Sequence[openssh.Hop] = ()
    note: str = ""


class Process(abc.ABC):
    """A command started on a host and still running: read its lines, then its status."""

    @abc.abstractmethod
    def lines(self) -> Iterator[tuple[str, str]]:
        """("out" or "err", line without its newline), until both streams end."""

    @abc.abstractmethod
    def wait(self, timeout: float | None = None) -> int:
        """Wait for the exit status (after lines() is exhausted).

        Raises CommandTimeout past ``timeout``, and Unreachable when the connection died
        before the status came (the process may still run on its node).
        """

    @abc.abstractmethod
    def send(self, data: bytes) -> None:
        """Write to the process's stdin (it stays open for more)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Close stdin and the connection to the process (it learns of it by EOF)."""

    def end_input(self) -> None:  # noqa: B027 - a no-op unless the channel can half-close
        """EOF on stdin while its output is still read: a process that ends at EOF ends
        right after its last answer. By default nothing (``close`` sends the EOF)."""


def split_lines(pending: bytes, chunk: bytes) -> tuple[list[str], bytes]:
    """Complete lines of pending+chunk, and what is left of an unfinished one."""
    *lines, rest = (pending + chunk).split(b"\n")
    return [line.decode(errors="replace") for line in lines], rest


class Connector(abc.ABC):
    """A connection to one host. Use as a context manager; commands are argv lists."""

    # True when connect() opens nothing and the first command is what reaches the host
    # and verifies its key (an OpenSSH master, connectors/openssh_session.py).
    opens_lazily = False

    def __init__(self, host: Host, options: ConnectOptions) -> None:
        self.host = host
        self.options = options

    @abc.abstractmethod
    def connect(self) -> None:
        """Open the connection; raises Unreachable (or HostKeyError) with the reason."""

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | BinaryIO | None = None,
        timeout: float | None = None,
    ) -> CommandResult:
        """Run argv on the host and wait; raises CommandTimeout past the timeout (the
        options' command_timeout when None).

        ``stdin`` is sent, then closed: bytes, or a binary file streamed in chunks.
        """
        command = Command.of(argv, env, cwd)
        ui.detail(2, self.host.name, f"$ {command.shown}")
        limit = self.options.command_timeout if timeout is None else timeout
        started = time.monotonic()
        code, out, err = self.execute(command, stdin, limit)
        seconds = time.monotonic() - started
        ui.detail(2, self.host.name, f"exit {code} in {seconds:.2f} s")
        return CommandResult(
            host=self.host.name,
            command=command.line,
            exit_code=code,
            stdout=out.decode(errors="replace"),
            stderr=err.decode(errors="replace"),
            seconds=seconds,
        )

    @abc.abstractmethod
    def execute(
        self, command: Command, stdin: bytes | BinaryIO | None, timeout: float
    ) -> tuple[int, bytes, bytes]:
        """``run``'s part that differs by connection: the command run, stdin sent and
        closed, and its (exit status, stdout, stderr) awaited; ``timed_out`` past
        ``timeout`` seconds."""

    def timed_out(self, command: Command, timeout: float) -> CommandTimeout:
        return CommandTimeout(
            self.host.name, f"command timed out after {timeout:g} s: {command.shown}"
        )

    def start(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> Process:
        """Start argv and return at once; its stdin stays open until Process.close()."""
        command = Command.of(argv, env, cwd)
        ui.detail(2, self.host.name, f"$ {command.shown} &")
        return self.spawn(command)

    @abc.abstractmethod
    def spawn(self, command: Command) -> Process:
        """``start``'s part that differs by connection."""

    # Why rsync cannot reach the host over this connection (the sync then sends a tar).
    rsync_refusal: str | None = None

    def rsync(
        self,
        flags: Sequence[str],
        source: str | list[str],
        dest: str,
        *,
        stdin: bytes | None = None,
        on_line: Callable[[str], None] | None = None,
    ) -> RsyncResult:
        """Push ``source`` (a path on the controller, or several) to ``dest`` on the host with
        ``rsync FLAGS``; its stdout lines go to on_line, or into the result."""
        if self.rsync_refusal is not None:
            return RsyncResult(1, [], f"{self.host.name} {self.rsync_refusal}")
        route = self.rsync_route(dest)
        argv = rsync_argv(flags, source, route.dest, route.ssh)
        ui.detail(2, self.host.name, f"$ {shown_rsync(argv)}{route.note}")
        result = run_rsync(argv, stdin=stdin, on_line=on_line)
        refused = None
        if not result.ok and route.ssh is not None:
            refused = openssh.refused_key(result.stderr, list(route.hops))
        if refused is not None:  # ssh's words are lost under rsync's last line otherwise
            raise HostKeyError(self.host.name, refused[0], hint=refused[1])
        return result

    def rsync_route(self, dest: str) -> RsyncRoute:
        """How rsync reaches ``dest`` on the host: by default the host's own ssh (its
        user, port, key, hops and host-key policy), run from the controller."""
        hops = openssh.jump_hops(self.host)
        ssh = openssh.ssh_argv(self.host, self.options, hops)
        return RsyncRoute(openssh.remote_spec(self.host, dest), ssh, hops, " (on the controller)")

    @property
    def rsync_ok(self) -> bool:
        """rsync's protocol runs over it (not through srun: sync sends a tar)."""
        return self.rsync_refusal is None

    def ssh_argv(self) -> list[str]:
        """``ssh`` and its options for a tool that starts ssh itself (rsync, MPI's
        ssh.sh): this host's user, port, key and host-key policy."""
        return openssh.ssh_argv(self.host, self.options)

    def failure(self, exit_code: int, stderr: str) -> HostError | None:
        """The connection's own error behind a started command's end (``start`` has no
        result to translate, as ``run`` does); None when the command itself failed."""
        return None

    def host_key(self) -> str | None:
        """The host key this connection verified ("TYPE BASE64"), for the run's own
        known_hosts; None when no ssh is involved."""
        return None

    def lost(self) -> bool:
        """True when this connection was open and has died (keepalives unanswered)."""
        return False

    @abc.abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> Connector:
        self.connect()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


# What the resolver (or ssh quoting it) says when a name has no address.
_UNRESOLVED = (
    "could not resolve hostname",
    "name or service not known",
    "temporary failure in name resolution",
    "nodename nor servname",
    "no address associated with hostname",
)


def cannot_connect(host: Host, where: str, reason: str) -> Unreachable:
    """A failed connect to ``where`` (address:port, and any ProxyJump), in the same words
    from every connector: a name that does not resolve is said so, with its fix."""
    lowered = reason.lower()
    if any(words in lowered for words in _UNRESOLVED):
        name = host.address
        if "could not resolve hostname " in lowered:  # ssh names the one it tried
            start = lowered.index("could not resolve hostname ") + len(
                "could not resolve hostname "
            )
            name = reason[start:].split(":", 1)[0].strip() or name
        said = reason.rsplit(": ", 1)[-1]  # the resolver's own words
        return Unreachable(
            host.name,
            f"cannot connect to {where}: the name {name} does not resolve ({said})",
            hint=f"set ansible_host to its address, or add {name} to DNS or /etc/hosts",
        )
    return Unreachable(
        host.name,
        f"cannot connect to {where}: {reason}",
        hint="is the host up and sshd running? check ansible_host/ansible_port",
    )
