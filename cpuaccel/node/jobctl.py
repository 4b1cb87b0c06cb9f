"""Node-side operations of ``cpuaccel run``: the node program ``jobctl`` (with ``common``).

Run as ``python -c BOOT LENGTH MODE ARG [ARG...]`` (cpuaccel.connectors.programs):

  write RUN_DIR      payload: JSON {"files": {name: [mode, text]}, "held": {name:
                     [mode, sha256]}}; each file created with its mode from the start
                     (secret.env is never readable by others), then renamed into place.
                     RUN_DIR is WORKDIR/runs/RUN_ID: ``runs`` and the run's folder are
                     made 0700 and never followed if links (refused). Answers which
                     ``held`` files the folder holds as they are (a regular file with
                     that mode and sha256, never through a link): the large files an
                     earlier attempt of the run got, which a restart need not send again
  procs RUN_ID       the processes of this job on this node
  signal RUN_ID PIDFILE SIG
                     signal the launcher's process group, after checking that its leader
                     really belongs to this job (a stale pid file must not hit another)
  end RUN_ID GRACE [RUN_DIR]
                     SIGTERM this job's processes, SIGKILL what is left after GRACE s;
                     then remove RUN_DIR/secret.env (the job is over)
  reach RUN_DIR TIMEOUT [--mux=DIR|--keep=DIR] HOST...
                     payload: JSON {name: [mode, text]} (ssh.sh and its files): run
                     ``ssh.sh -N HOST`` for every HOST at once, MPI's launcher's ssh
                     that authenticates and opens no session (no remote shell, no
                     ~/.bashrc), within TIMEOUT s; each leaves a master (ControlPersist),
                     which is what lets it return; a HOST whose master is alive already
                     is asked ``ssh -O check`` instead (through a master, -N would open
                     a session); the files and RUN_DIR are removed after.
                     With --mux, DIR is made first (0700, exclusively) for the ssh
                     masters the check leaves for the launch (ControlPersist; their
                     key exchange without sntrup761) and ended runs' folders are
                     removed (cpuaccel.node.mux); ``end`` ends them and removes DIR
                     With --keep (``check``), DIR is made, or taken when it is this
                     user's and private, and the masters the ssh_config keeps there
                     (ControlMaster auto) outlive the check: the next one logs in
                     through them; a DIR not ours is left alone, and the masters go to
                     a folder of the reach's own (as without either flag), removed
                     after: they end a second after they authenticated
  unmux RUN_ID       end the run's ssh masters and remove their folder (no job started)
  unreach RUN_DIR RUN_ID
                     end a reach still trying (the preflight named a cause already):
                     the ssh.sh processes it recorded in RUN_DIR/reach.pids, each
                     checked to be ours and to run from RUN_DIR; then unmux RUN_ID
  list RUN_DIR / read RUN_DIR NAME OFFSET LIMIT
                     a run's files (cpuaccel.node.runfiles)
  stacks RUN_ID TIMEOUT
                     payload: JSON {rank: [host, pid]}: ``py-spy dump`` of this node's
                     ranks that are this job's processes (run --hang-timeout;
                     cpuaccel.node.progress), where py-spy is installed

A process belongs to the job when its environment holds CPUACCEL_RUN_ID=<id> exactly,
and it is ours (same uid): never a pattern over command lines, which would also match
other people's jobs.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import stat
import sys
import time

from cpuaccel.node.boundedjson import loads
from cpuaccel.node.common import write_atomic
from cpuaccel.node.jobprocs import describe as _describe
from cpuaccel.node.jobprocs import environ_has as _environ_has
from cpuaccel.node.jobprocs import job_pids
from cpuaccel.node.mux import end_masters, fast_kex, keep_folder, make_folder, own_masters
from cpuaccel.node.nofollow import FOLDER, LinkRefused, folder_at, own_folder_at, remove_at
from cpuaccel.node.progress import stacks
from cpuaccel.node.runfiles import operation as run_files

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, BinaryIO


SECRET = "secret.env"
# The folder a path names, its last name allowed to be a link: the workdir and what
# holds it are the user's layout (~/cpuaccel may well lead to a scratch disk).
_FOLLOW = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def _run_folder(run_dir: str, create: bool) -> int | None:
    """A descriptor of RUN_DIR (WORKDIR/runs/RUN_ID). ``runs`` and the run's folder are
    cpuaccel's own: reached without following a link (what the job writes there, its
    secrets, must land there and nowhere else), made 0700 with ``create``. With
    ``create`` a link or file in their place is refused (LinkRefused, naming the path);
    without, None when they are missing or not real folders."""
    runs_path, run_id = os.path.split(run_dir.rstrip("/"))
    workdir, runs = os.path.split(runs_path)
    if create:
        os.makedirs(workdir or ".", mode=0o700, exist_ok=True)
    try:
        top = os.open(workdir or ".", _FOLLOW)
    except FileNotFoundError:
        if create:
            raise
        return None
    try:
        if not create:
            below = folder_at(top, runs, create=False)
            try:
                return None if below is None else folder_at(below, run_id, create=False)
            finally:
                if below is not None:
                    os.close(below)
        path = runs_path
        try:
            below = own_folder_at(top, runs)
            try:
                path = run_dir
                return own_folder_at(below, run_id)
            finally:
                os.close(below)
        except LinkRefused as exc:
            raise LinkRefused(exc.errno, str(exc.strerror), path) from None
    finally:
        os.close(top)


def _file_name(name: str) -> str:
    if "/" in name or name.startswith(".") or not name:
        raise ValueError(f"refusing file name {name!r}")
    return name


def _write_files(folder: int, files: dict[str, tuple[int, str]]) -> None:
    for name, (mode, text) in files.items():
        # Created with its mode (whatever the umask), then renamed into place.
        write_atomic(_file_name(name), text.encode(), mode, dir_fd=folder)


def _holds(folder: int, name: str, mode: int, sha256: str) -> bool:
    """Whether the run folder's ``name`` is a regular file (not reached through a link,
    nor opened if it is a fifo) with ``mode`` and content of ``sha256``."""
    try:
        fd = os.open(_file_name(name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
    except OSError:
        return False
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or stat.S_IMODE(info.st_mode) != mode:
            return False
        digest = hashlib.sha256()
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            digest.update(chunk)
        return digest.hexdigest() == sha256
    finally:
        os.close(fd)


def write(
    run_dir: str,
    files: dict[str, tuple[int, str]],
    held: dict[str, tuple[int, str]] | None = None,
) -> dict[str, Any]:
    folder = _run_folder(run_dir, create=True)
    assert folder is not None  # create=True: made, or refused
    try:
        # The run folder is the user's alone: its files may carry what the job must keep.
        os.fchmod(folder, 0o700)
        _write_files(folder, files)
        holding = [n for n, (mode, sha) in (held or {}).items() if _holds(folder, n, mode, sha)]
    finally:
        os.close(folder)
    return {"written": sorted(files), "held": sorted(holding)}


def reach(
    run_dir: str,
    timeout: float,
    hosts: list[str],
    files: Any,
    mux: str | None = None,
    *,
    kept: bool = False,
) -> dict[str, Any]:
    """Can the launcher's ssh.sh reach every host from here? {host: [code, last line]},
    code None when it did not answer within ``timeout``. ``mux``: the folder for the
    masters that the files' ssh_config keeps (made here: never one someone else made,
    whose sockets would carry the job's commands to another user's connection);
    ``kept``: check's folder, kept across checks (``keep_folder``).

    ``ssh -N`` opens no session, so no shell starts on the node (its ~/.bashrc is not
    paid a second time after the controller's probe); it returns once authenticated
    because it becomes a master; a host with a live master is asked ``ssh -O check``
    (``_live_masters``). Where no folder may keep masters, they go to a private folder
    made here and removed after."""
    import shutil
    import tempfile

    own = None  # the folder of masters no one reuses
    if "ssh_config" in files:
        mode, config = files["ssh_config"]
        if mux is None or (kept and not keep_folder(mux)):
            own = tempfile.mkdtemp(prefix="cpuaccel-r-", dir="/tmp")  # short: a socket path
            config = own_masters(own) + config  # ssh takes a keyword's first value
        # Every handshake without sntrup761 (node/mux.fast_kex): a check's or a run's.
        files = {**files, "ssh_config": (mode, config + fast_kex())}
    started = time.monotonic()
    lock = _one_at_a_time(mux, timeout) if kept and own is None and mux is not None else None
    left = max(1.0, timeout - (time.monotonic() - started))
    try:
        return {"reach": _reach_all(run_dir, left, hosts, files, mux, own or mux, kept=kept)}
    finally:
        if lock is not None:
            os.close(lock)  # and the lock with it
        if own is not None:
            shutil.rmtree(own, ignore_errors=True)


def _one_at_a_time(folder: str, timeout: float) -> int | None:
    """A descriptor of check's kept folder, locked (flock) for this reach, after the
    reach of another check at the same moment has ended (at most ``timeout`` s, then on
    without). Two at once would both try to become a node's master: the loser's
    ``ssh -N`` finds the socket taken, stays a plain connection and never returns; one
    after the other, the second finds the first's masters alive (``_live_masters``)."""
    import fcntl

    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except OSError:
            if time.monotonic() >= deadline:
                return fd
            time.sleep(0.02)


def _reach_all(
    run_dir: str,
    timeout: float,
    hosts: list[str],
    files: Any,
    mux: str | None,
    masters: str | None,
    *,
    kept: bool,
) -> dict[str, Any]:
    import subprocess

    if mux is not None and not kept:
        make_folder(mux)  # and the folders of killed runs removed
    created = []  # the folders made here, removed again: preflight leaves nothing
    above, name = os.path.split(run_dir.rstrip("/"))
    folder = above
    while not os.path.isdir(folder):
        created.append(folder)
        folder = os.path.dirname(folder)
    try:
        for folder in reversed(created):
            os.mkdir(folder, 0o700)
        parent = os.open(above, _FOLLOW)
    except OSError:
        _rmdirs(created)
        raise
    try:
        # Exclusive: never into a folder, or through a link, that someone else made.
        os.mkdir(name, 0o700, dir_fd=parent)
        try:
            fd = os.open(name, FOLDER, dir_fd=parent)
            try:
                _write_files(fd, files)
            finally:
                os.close(fd)
            deadline = time.monotonic() + timeout
            live = _live_masters(run_dir, hosts, masters, deadline)
            procs = {
                host: subprocess.Popen(
                    ["/bin/sh", os.path.join(run_dir, "ssh.sh"), "-N", host],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    start_new_session=True,  # its own group: a timeout ends ssh and its children
                )
                for host in hosts
                if host not in live
            }
            _record_pids(run_dir, [proc.pid for proc in procs.values()])
            found = {host: [0, ""] for host in live}
            found.update({host: _reached(proc, deadline) for host, proc in procs.items()})
            found = {host: found[host] for host in hosts}
        finally:
            remove_at(parent, name)  # by descriptors: a link inside is removed, not followed
    finally:
        os.close(parent)
        _rmdirs(created)
    return found


REACH_PIDS = "reach.pids"


def _record_pids(run_dir: str, pids: list[int]) -> None:
    """The reach's ssh.sh processes (each the leader of its group), for ``unreach``."""
    try:
        fd = os.open(
            os.path.join(run_dir, REACH_PIDS),
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
        )
    except OSError:
        return
    try:
        os.write(fd, "".join(f"{pid}\n" for pid in pids).encode())
    finally:
        os.close(fd)


def unreach(run_dir: str, run_id: str) -> dict[str, Any]:
    """End a reach of ``run_dir`` still trying: the groups of the ssh.sh processes it
    recorded, each one ours and running from that folder (a pid reused since is left
    alone); then the run's masters (``end_masters``)."""
    ended = []
    if (
        run_dir.startswith("/tmp/cpuaccel-reach-")
        and "/" not in run_dir[5:]
        and ".." not in run_dir
    ):
        try:
            fd = os.open(os.path.join(run_dir, REACH_PIDS), os.O_RDONLY | os.O_NOFOLLOW)
            try:
                text = os.read(fd, 1 << 16).decode(errors="replace")
            finally:
                os.close(fd)
        except OSError:
            text = ""
        mark = (run_dir + "/").encode()
        for word in text.split():
            if not word.isdigit():
                continue
            pid = int(word)
            try:
                if os.stat(f"/proc/{pid}").st_uid != os.getuid():
                    continue
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if mark not in f.read():
                        continue
                os.killpg(pid, signal.SIGKILL)
                ended.append(pid)
            except OSError:
                continue
    end_masters(run_id)
    return {"ended": ended}


def _live_masters(run_dir: str, hosts: list[str], folder: str | None, deadline: float) -> set[str]:
    """The hosts with a live master in ``folder`` (``ssh -O check``, with the files'
    ssh_config: no connection, no session): an earlier check's, or an earlier pass's of
    the same run. Through a master, ``ssh -N`` would open a session (a shell, its
    ~/.bashrc); the master is already logged in, to the key it verified. None are
    looked for in a folder without sockets (a run's first pass, the reach's own)."""
    import subprocess

    try:
        if folder is None or not os.listdir(folder):
            return set()
    except OSError:
        return set()
    config = os.path.join(run_dir, "ssh_config")
    try:
        procs = {
            host: subprocess.Popen(
                ["ssh", "-F", config, "-O", "check", "--", host],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            for host in hosts
        }
    except OSError:  # no ssh here: ssh.sh's own exit says so
        return set()
    live = set()
    for host, proc in procs.items():
        try:
            if proc.wait(timeout=max(0.0, deadline - time.monotonic())) == 0:
                live.add(host)
        except subprocess.TimeoutExpired:
            _kill([-proc.pid], signal.SIGKILL)
            proc.wait()
    return live


def _reached(proc: Any, deadline: float) -> list[Any]:
    import subprocess

    try:
        _, err = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        _kill([-proc.pid], signal.SIGKILL)
        proc.communicate()
        return [None, ""]
    lines = [line.strip() for line in err.decode(errors="replace").splitlines() if line.strip()]
    return [proc.returncode, lines[-1] if lines else ""]


def _rmdirs(folders: list[str]) -> None:
    """Remove empty folders, innermost first (what is not empty stays)."""
    for folder in folders:
        try:
            os.rmdir(folder)
        except OSError:
            pass


def signal_launcher(run_id: str, pidfile: str, signum: int) -> dict[str, Any]:
    try:
        with open(pidfile) as f:
            pid = int(f.read().strip())
    except (OSError, ValueError):
        return {"signalled": None}
    if not _environ_has(pid, b"CPUACCEL_RUN_ID=" + run_id.encode()):
        return {"signalled": None}
    try:
        os.killpg(pid, signum)
    except ProcessLookupError:
        return {"signalled": None}
    return {"signalled": pid}


def _kill(pids: list[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:  # ended on its own meanwhile
            continue


def forget_secrets(run_dir: str) -> bool:
    """Remove the run's secret.env (the job is over); whether there was one. Reached by
    descriptors: a link in the way leads to no one else's secret.env."""
    folder = _run_folder(run_dir, create=False)
    if folder is None:
        return False
    try:
        os.unlink(SECRET, dir_fd=folder)  # a link there is removed itself
    except FileNotFoundError:
        return False
    finally:
        os.close(folder)
    return True


def end(run_id: str, grace: float, run_dir: str | None = None) -> dict[str, Any]:
    end_masters(run_id)
    pids = job_pids(run_id)
    terminated = _describe(pids)
    _kill(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while pids and time.monotonic() < deadline:
        time.sleep(0.05)
        pids = job_pids(run_id)
    killed = _describe(pids)
    _kill(pids, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while pids and time.monotonic() < deadline:
        time.sleep(0.05)
        pids = job_pids(run_id)
    forgot = forget_secrets(run_dir) if run_dir else False
    return {"terminated": terminated, "killed": killed, "left": _describe(pids), "forgot": forgot}


def refused(exc: LinkRefused) -> str:
    """A write refused at a link: one line, the controller's error (no traceback)."""
    return (
        f"refused: {exc.filename} is a symbolic link or a file, where cpuaccel keeps "
        "a folder of its own; remove it (cpuaccel makes the folder)"
    )


def request(mode: str, args: list[str], stdin: BinaryIO) -> dict[str, Any]:
    """The answer to one request (MODE ARG...; its payload on ``stdin``): ``main``'s,
    and the kept prelaunch program's (cpuaccel.node.prelaunch) for its later requests."""
    if mode == "write":
        try:
            asked = loads(stdin.read())
            return write(args[0], asked["files"], asked.get("held"))
        except LinkRefused as exc:
            raise SystemExit(refused(exc)) from None
        except ValueError as exc:  # a name that is no file name of the run folder
            raise SystemExit(str(exc)) from None
    if mode == "procs":
        return {"pids": _describe(job_pids(args[0]))}
    if mode == "signal":
        return signal_launcher(args[0], args[1], int(args[2]))
    if mode == "end":
        return end(args[0], float(args[1]), args[2] if len(args) > 2 else None)
    if mode == "unmux":  # a preflight that failed: no job will use the masters
        end_masters(args[0])
        return {}
    if mode == "unreach":  # the preflight named a cause while the reach still tries
        return unreach(args[0], args[1])
    if mode == "reach":
        files = loads(stdin.read())
        hosts, mux, kept = args[2:], None, False
        if hosts and hosts[0].startswith(("--mux=", "--keep=")):  # no inventory name has "="
            flag, mux = hosts[0].split("=", 1)
            hosts, kept = hosts[1:], flag == "--keep"
        return reach(args[0], float(args[1]), hosts, files, mux, kept=kept)
    if mode in ("list", "read"):  # a run's files (cpuaccel ps, logs, fetch)
        return run_files(mode, args)
    if mode == "stacks":
        ranks = loads(stdin.read())
        return {"stacks": stacks(ranks, set(job_pids(args[0])), float(args[1]))}
    raise SystemExit(f"unknown mode {mode}")


def main() -> None:
    # After BOOT's LENGTH (cpuaccel.connectors.programs)
    result = request(sys.argv[2], sys.argv[3:], sys.stdin.buffer)
    sys.stdout.write(json.dumps(result) + "\n")
