"""The head's ssh masters of a run (part of the ``jobctl`` program, see ``cpuaccel.node``).

The preflight's launcher check (``jobctl reach --mux``) leaves its ssh connections open as
masters in ``/tmp/cpuaccel-mux-<run id>``, which MPI's ssh then reuses; the sweep ends
them (``end_masters``). ``cpuaccel check``'s (``jobctl reach --keep``) stay in a folder
named by what they were opened with (connectors/controlpath.head_folder), for the next
check, and end by themselves (ControlPersist). Here: making those folders, the check's
cheaper key exchange, the ending, and the removal of the folders whose masters ended
(``sweep_stale``: a killed controller's, or a check's).
"""

from __future__ import annotations

import os
import stat
import time

from cpuaccel.node.nofollow import lstat_at, remove_at

MUX_PREFIX = "/tmp/cpuaccel-mux-"  # + the run id (connectors/openssh.mux_dir)
_NAME = MUX_PREFIX.rsplit("/", 1)[1]
_FOLLOW = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
# A run id (jobs/plan.new_run_id, jobs/given_id's check), then what end_masters
# renames a folder to while it ends its masters.
_STALE = r"[A-Za-z0-9][A-Za-z0-9._-]{0,80}"
# A folder is taken for stale only this long after its last change (a socket made or
# removed): a run's check makes the folder, then its masters' sockets within the check's
# bound (REACH_TIMEOUT, 15 s), and a master removes its socket when it exits.
STALE_AFTER = 120.0


def make_folder(mux: str) -> None:
    """The folder for the masters: made here, 0700 and exclusively (never one someone
    else made, whose sockets would carry the job's commands to another user's
    connection), or this run's own from an earlier pass (--nodes MIN:MAX)."""
    if not mux.startswith(MUX_PREFIX) or "/" in mux[len(MUX_PREFIX) :]:
        raise SystemExit(f"refused: {mux} is not a folder of cpuaccel's ssh masters")
    sweep_stale()
    try:
        os.mkdir(mux, 0o700)
    except FileExistsError:
        st = os.lstat(mux)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise SystemExit(
                f"refused: {mux} exists and is not a private folder of this user"
            ) from None
    except OSError as exc:
        raise SystemExit(f"cannot make {mux} for the launcher's ssh: {exc.strerror}") from None


def own_masters(folder: str) -> str:
    """The block put first in the reach's ssh_config when no kept folder may hold its
    masters: each ``ssh -N`` becomes a master in ``folder`` (the reach's own, removed
    after), which, with no session, ends one second after it authenticated."""
    return f"Host *\n    ControlMaster auto\n    ControlPath {folder}/%C\n    ControlPersist 1\n"


def keep_folder(mux: str) -> bool:
    """Whether check's kept masters' folder may be used: made here (0700), or already
    a private folder of this user (an earlier check's). One someone else made, or that
    others may enter, is left alone (False: the check connects without masters, as a
    socket there could be another user's in place of a master); ended runs' and checks'
    folders are removed first."""
    if not mux.startswith(MUX_PREFIX) or "/" in mux[len(MUX_PREFIX) :]:
        raise SystemExit(f"refused: {mux} is not a folder of cpuaccel's ssh masters")
    sweep_stale()
    try:
        os.mkdir(mux, 0o700)
        return True
    except FileExistsError:
        st = os.lstat(mux)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            return False
        # Changed now: another check's sweep takes it for an ended one's no sooner than
        # STALE_AFTER s from here (its masters' sockets are made within REACH_TIMEOUT).
        os.utime(mux, follow_symlinks=False)
        return True
    except OSError:
        return False


# What KexAlgorithms takes away from ssh's defaults (the "-" form: OpenSSH 7.5+).
WITHOUT_SNTRUP = "-sntrup761x25519-sha512*"


def fast_kex(ssh: str = "ssh") -> str:
    """The ssh_config block that leaves out the sntrup761 key exchange, or "" where the
    head's ssh has none. sntrup761x25519 (OpenSSH 9.0-9.8's first choice) costs its
    client most of a handshake's CPU, and the check makes a handshake to every node at
    once. What remains first is mlkem768x25519 (OpenSSH 9.9+, post-quantum too) or
    curve25519: what the controller's own connections to the same nodes use (paramiko
    has no sntrup761), and they carry the same files, so the run is no weaker. OpenSSH
    knows the "-" form since 7.5; a client that lists sntrup761 (8.5+) has it."""
    return f"Host *\n    KexAlgorithms {WITHOUT_SNTRUP}\n" if lists_sntrup761(ssh) else ""


def lists_sntrup761(ssh: str = "ssh") -> bool:
    """Whether ``ssh -Q kex`` names sntrup761 (an ssh that cannot be run: False, and its
    caller's own ssh then says what is wrong). Also the controller's
    (connectors/kex.py)."""
    import subprocess  # here: a node program's start-up stays short

    try:
        listed = subprocess.run(
            [ssh, "-Q", "kex"], capture_output=True, text=True, timeout=10, check=False
        ).stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        return False
    return any(name.startswith("sntrup761") for name in listed)


def _live(path: str) -> bool:
    """Whether a master listens on the socket ``path`` (a connect is answered)."""
    import socket

    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(path)
        return True
    except OSError:
        return False
    finally:
        probe.close()


def _stale(parent: int, name: str, now: float) -> bool:
    """Provably an ended run's: cpuaccel's name, a real folder of this user that only
    they can enter, unchanged for STALE_AFTER s, holding sockets no master answers on."""
    st = lstat_at(parent, name)
    if st is None or not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        return False
    if st.st_mode & 0o077 or now - st.st_mtime < STALE_AFTER:
        return False
    folder = f"/tmp/{name}"
    try:
        entries = os.listdir(folder)
    except OSError:
        return False
    for entry in entries:
        inner = lstat_at(parent, f"{name}/{entry}")
        if inner is None or not stat.S_ISSOCK(inner.st_mode) or _live(f"{folder}/{entry}"):
            return False
    return True


def sweep_stale() -> list[str]:
    """Remove the masters' folders left by runs whose controller was killed between
    preflight and sweep (their masters end themselves after ControlPersist, their
    folder stays): what was removed."""
    import re  # only here: the sweep's `end` on every node does without it

    pattern = re.compile(re.escape(_NAME) + _STALE)
    parent = os.open("/tmp", _FOLLOW)
    removed = []
    try:
        now = time.time()
        for name in os.listdir(parent):
            if pattern.fullmatch(name) and _stale(parent, name, now):
                try:
                    remove_at(parent, name)
                except OSError:
                    continue  # another run's preflight (a shared /tmp) got there first
                removed.append(name)
    finally:
        os.close(parent)
    return removed


def end_masters(run_id: str) -> None:
    """End the run's ssh masters (reach's --mux) and remove their folder, if this node
    has it and it is ours: the job is over, nothing is left to reuse them. The folder
    is first renamed to one of this process: on a /tmp that nodes share, one node ends
    the masters, not every node each one."""
    name = _NAME + run_id
    if "/" in run_id or run_id in ("", ".", ".."):
        return
    taken = f"{name}.ending-{os.getpid()}"
    parent = os.open("/tmp", _FOLLOW)
    try:
        st = lstat_at(parent, name)
        if st is None or not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            return
        try:
            os.rename(name, taken, src_dir_fd=parent, dst_dir_fd=parent)
        except OSError:  # another node of a shared /tmp got there first
            return
        folder = f"/tmp/{taken}"
        import subprocess  # only here: most nodes have no masters, and pay no import

        # All at once. `-O stop`, not `exit`: a master may still carry a session (a
        # detached supervisor's sweep of another node goes through ssh.sh, i.e. through
        # it, while this node sweeps); stopped, it takes no new session and ends with
        # its last one.
        procs = [
            subprocess.Popen(
                ["ssh", "-o", f"ControlPath={folder}/{sock}", "-O", "stop", "cpuaccel-mux"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for sock in os.listdir(folder)
        ]
        for proc in procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        remove_at(parent, taken)
    finally:
        os.close(parent)
