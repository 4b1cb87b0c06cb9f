"""``python -m MODULE ARGS`` as a fork of an interpreter that has cpuaccel's CLI imported.

A fresh interpreter spends most of a short command importing click, rich, PyYAML and
cpuaccel's own modules. The tests run that command hundreds of times, so
:func:`run` asks a server process for each one instead. The server imported what
``cpuaccel --help`` imports and ran nothing.

For each command the server forks a waiter, and the waiter forks the command's process.
That process then does what ``python -m cpuaccel`` would have done:

- it takes the caller's stdin and two files for stdout and stderr;
- it closes every other descriptor;
- it takes the working directory, the environment and ``sys.argv``;
- it puts the working directory first on ``sys.path``;
- it runs the module as ``__main__`` and ends as the interpreter would. Non-daemon threads
  are joined, atexit runs, the streams are flushed, and an uncaught exception is
  printed with exit code 1.

The waiter sends back the process's pid, then its wait status.

A fork differs from a fresh start in three places. In each of them :func:`run` returns
None and the caller starts a real interpreter:

- the variables that Python reads at start-up (``PYTHON*``, the locale, ``TZ``) differ
  from the server's. One server runs for each set of them.
- the working directory holds a name that would shadow a module the server imported,
  which ``python -m`` would take from there.
- the caller wants a prelude (:func:`testsupport.command.cpuaccel_argv`).
"""

from __future__ import annotations

import atexit
import importlib
import importlib.machinery
import json
import locale
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

# Bytes of one request (argv, cwd, environment): a SOCK_SEQPACKET message.
REQUEST_MAX = 1 << 20
# How long the server may take to fork the command's process and name it.
ANSWER_BOUND = 30.0
# How long a killed command may take to be reported after the kill.
KILLED_BOUND = 10.0

# The server's interpreter: no folder of this process is put before the installed cpuaccel.
SERVER = (
    "import sys; del sys.path[0]; from testsupport.forkserver import serve; serve(int(sys.argv[1]))"
)
STATUS = struct.Struct("=qq")  # (pid, 0) when it started, then (pid, wait status)


def startup_vars(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The variables that shape an interpreter at its start: two environments equal here
    start the same interpreter."""
    return tuple(
        sorted(
            (key, value)
            for key, value in env.items()
            if key.startswith(("PYTHON", "LC_")) or key in ("LANG", "LANGUAGE", "TZ")
        )
    )


def shadows(cwd: Path, modules: frozenset[str]) -> bool:
    """Whether ``cwd`` holds a module or a folder named as one of ``modules``, which
    ``python -m`` there would import in place of the server's module. A folder counts
    whatever it holds (``cpuaccel.yaml`` is no module, a folder ``yaml`` may be one)."""
    try:
        entries = list(os.scandir(cwd))
    except OSError:
        return True  # a fresh interpreter decides what happens then
    suffixes = importlib.machinery.all_suffixes()
    for entry in entries:
        if entry.is_dir():
            stem = entry.name
        else:
            stem = next(
                (entry.name.removesuffix(x) for x in suffixes if entry.name.endswith(x)), ""
            )
        if stem in modules:
            return True
    return False


class Server:
    """One server process and the socket that sends it requests, for one set of
    :func:`startup_vars`."""

    def __init__(self, env: Mapping[str, str]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.lock = threading.Lock()
        self.channel = ours
        self.process = subprocess.Popen(
            [sys.executable, "-c", SERVER, str(theirs.fileno())],
            env=dict(startup_vars(env)),
            cwd="/",
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            pass_fds=(theirs.fileno(),),
        )
        theirs.close()
        ours.settimeout(ANSWER_BOUND * 4)  # the imports
        hello = ours.recv(REQUEST_MAX)
        ours.settimeout(None)
        if not hello:
            raise RuntimeError(f"the fork server ended at its start ({self.process.wait()})")
        self.modules = frozenset(json.loads(hello))

    def run(
        self, module: str, args: Sequence[str], cwd: Path, env: Mapping[str, str],
        timeout: float | None,
    ) -> subprocess.CompletedProcess[str]:  # fmt: skip
        argv = [sys.executable, "-m", module, *args]
        request = json.dumps(
            {"module": module, "args": list(args), "cwd": str(cwd), "env": dict(env)}
        )
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with (
            ours,
            tempfile.TemporaryFile() as out,
            tempfile.TemporaryFile() as err,
            open(os.devnull, "rb") as devnull,
        ):
            stdin = 0 if _is_open(0) else devnull.fileno()
            with theirs, self.lock:
                socket.send_fds(
                    self.channel,
                    [request.encode()],
                    [theirs.fileno(), stdin, out.fileno(), err.fileno()],
                )
            pid = _receive(ours, ANSWER_BOUND, argv)[0]
            try:
                status = _receive(ours, timeout, argv)[1]
            except TimeoutError:
                os.kill(pid, signal.SIGKILL)
                _receive(ours, KILLED_BOUND, argv)
                raise subprocess.TimeoutExpired(
                    argv, timeout or 0, _read(out), _read(err)
                ) from None
            return subprocess.CompletedProcess(
                argv, os.waitstatus_to_exitcode(status), _read(out), _read(err)
            )

    def close(self) -> None:
        self.channel.close()  # the server ends at this end of file
        try:
            self.process.wait(timeout=ANSWER_BOUND)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


_servers: dict[tuple[tuple[str, str], ...], Server] = {}
_servers_lock = threading.Lock()


def run(
    module: str, args: Sequence[str], *, cwd: Path | str | None, env: Mapping[str, str],
    timeout: float | None,
) -> subprocess.CompletedProcess[str] | None:  # fmt: skip
    """``python -m MODULE ARGS`` to its end, forked from a server, output captured as
    text; None where a fork could differ from a fresh interpreter (the module's
    docstring). The result names ``[sys.executable, "-m", module, *args]``."""
    folder = Path(cwd if cwd is not None else os.getcwd()).absolute()
    key = startup_vars(env)
    with _servers_lock:
        server = _servers.get(key)
        if server is None:
            if not _servers:
                atexit.register(_close_all)
            server = _servers[key] = Server(env)
    if shadows(folder, server.modules):
        return None
    return server.run(module, args, folder, env, timeout)


def _close_all() -> None:
    with _servers_lock:
        for server in _servers.values():
            server.close()
        _servers.clear()


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _receive(sock: socket.socket, timeout: float | None, argv: list[str]) -> tuple[int, int]:
    sock.settimeout(timeout)
    data = sock.recv(STATUS.size)  # TimeoutError past the timeout
    if len(data) != STATUS.size:
        raise RuntimeError(f"the fork server ended while it ran {argv[2:]}")
    pid, status = STATUS.unpack(data)
    return pid, status


def _read(file: IO[bytes]) -> str:
    """The file's bytes as ``subprocess.run(text=True)`` gives them."""
    file.seek(0)
    text = file.read().decode(locale.getpreferredencoding(False))
    return text.replace("\r\n", "\n").replace("\r", "\n")


# The server's side, in its own interpreter (SERVER).


def serve(fd: int) -> None:
    """Import the CLI, say which top-level modules are loaded, then fork one waiter per
    request until the channel ends."""
    channel = socket.socket(fileno=fd)
    from cpuaccel.cli import main as cli_main

    for target in cli_main.VERBS.values():
        importlib.import_module(target.partition(":")[0])
    channel.send(json.dumps(sorted({name.split(".")[0] for name in sys.modules})).encode())
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(channel, REQUEST_MAX, 4)
        except ConnectionError:
            break
        if not data:
            break
        while _reap():
            pass
        sys.stdout.flush()
        sys.stderr.flush()
        if os.fork() == 0:
            channel.close()
            _wait_for(json.loads(data), *fds)
        for passed in fds:
            os.close(passed)


def _reap() -> bool:
    try:
        pid, _ = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        return False
    return pid != 0


def _wait_for(request: dict[str, Any], reply: int, stdin: int, stdout: int, stderr: int) -> None:
    """The waiter: fork the command's process, name it, wait for it, send its status."""
    code = 0
    try:
        pid = os.fork()
        if pid == 0:
            _command(request, stdin, stdout, stderr)  # closes reply with the rest
        for passed in (stdin, stdout, stderr):
            os.close(passed)
        os.write(reply, STATUS.pack(pid, 0))
        _, status = os.waitpid(pid, 0)
        os.write(reply, STATUS.pack(pid, status))
    except BaseException:
        traceback.print_exc()
        code = 1
    os._exit(code)


def _command(request: dict[str, Any], stdin: int, stdout: int, stderr: int) -> None:
    """The command's process: ``python -m MODULE ARGS`` from here on."""
    code = 1
    try:
        for target, source in ((0, stdin), (1, stdout), (2, stderr)):
            os.dup2(source, target)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.path.insert(0, request["cwd"])
        sys.argv = ["-m", *request["args"]]  # runpy names sys.argv[0]
        code = _run_main(request["module"])
    finally:
        os._exit(code)


def _run_main(module: str) -> int:
    """Run ``module`` as ``__main__`` and end as the interpreter ends: the exit code it
    would give, after the same shutdown steps."""
    import runpy

    code = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()  # non-daemon threads, as Py_Finalize joins them
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            code = code or 120
    return code & 0xFF
