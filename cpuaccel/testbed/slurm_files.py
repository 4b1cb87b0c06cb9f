"""The files of a test cluster's Slurm (munge key, ``slurm.conf``, ``slurmdbd.conf``), its
ports, and how its daemons are recognised on /proc.

Everything lives in ``{state_dir}/slurm/`` and every port follows from the cluster id, so
that clusters with other ids run their own Slurm at the same time. Each daemon the bed
starts carries :data:`MARKER` (the bed's directory) in its environment: a later process
(``down``, a crashed run's clean-up) finds exactly this bed's daemons by that, never by a
name that could match someone else's Slurm.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cpuaccel.testbed.netns import Node, _all_pids

MARKER = "CPXL_SLURM_BED"
PARTITION = "debug"
PORT_BASE = 21000
MUNGE_USER = "munge"
LIBPMI2 = Path("/usr/lib/x86_64-linux-gnu/libpmi2.so.0")


class _Below:
    """A BedPaths attribute: the path ``parts`` below the bed's root."""

    def __init__(self, *parts: str) -> None:
        self.parts = parts

    def __get__(self, paths: BedPaths, owner: type[BedPaths] | None = None) -> Path:
        return paths.root.joinpath(*self.parts)


@dataclass(frozen=True)
class BedPaths:
    """Where one bed keeps its files (all below ``root``, removed by ``down``)."""

    root: Path

    conf = _Below("slurm.conf")
    # slurmdbd has no -f: it reads slurmdbd.conf beside $SLURM_CONF.
    dbd_conf = _Below("slurmdbd.conf")
    munge_dir = _Below("munge")
    munge_socket = _Below("munge", "munge.socket")
    munge_key = _Below("munge", "munge.key")
    pids_file = _Below("pids.json")
    ctld_state = _Below("ctld")
    db_dir = _Below("db")
    db_socket = _Below("mysqld.sock")

    def log(self, daemon: str) -> Path:
        """The log of a daemon: ``munged``, ``slurmctld``, ``slurmd-node1``, ..."""
        return self.root / "log" / f"{daemon}.log"

    def stderr(self, daemon: str) -> Path:
        """A daemon's stdout and stderr (what it says before its log is open)."""
        return self.root / "log" / f"{daemon}.stderr"

    def pid_file(self, daemon: str) -> Path:
        return self.root / "run" / f"{daemon}.pid"


def bed_dir(state_dir: Path) -> Path:
    return state_dir / "slurm"


def ports(cluster_id: int) -> dict[str, int]:
    """The bed's TCP ports: 4 a cluster id, above the ephemeral-free 21000."""
    base = PORT_BASE + 4 * cluster_id
    return {"slurmctld": base, "slurmd": base + 1, "slurmdbd": base + 2, "mariadb": base + 3}


def cluster_name(cluster_id: int) -> str:
    return f"cpxl{cluster_id}"


def slurm_conf(
    paths: BedPaths,
    cluster_id: int,
    controller_address: str,
    nodes: Sequence[Node],
    cpus: int,
    accounting: bool,
) -> str:
    """slurm.conf: no cgroups (linuxproc, task/none), this bed's ports, paths and munge."""
    port = ports(cluster_id)
    root = paths.root
    settings = [
        ("ClusterName", cluster_name(cluster_id)),
        # slurmctld refuses to start unless this names the machine's real hostname.
        ("SlurmctldHost", f"{socket.gethostname()}({controller_address})"),
        ("SlurmctldPort", str(port["slurmctld"])),
        ("SlurmdPort", str(port["slurmd"])),
        ("SlurmUser", "root"),
        ("SlurmdUser", "root"),
        ("AuthType", "auth/munge"),
        ("CredType", "cred/munge"),
        ("AuthInfo", f"socket={paths.munge_socket}"),
        ("StateSaveLocation", str(paths.ctld_state)),
        ("SlurmdSpoolDir", str(root / "spool" / "%n")),
        ("SlurmctldPidFile", str(paths.pid_file("slurmctld"))),
        ("SlurmdPidFile", str(root / "run" / "slurmd-%n.pid")),
        ("SlurmctldLogFile", str(paths.log("slurmctld"))),
        ("SlurmdLogFile", str(root / "log" / "slurmd-%n.log")),
        ("ProctrackType", "proctrack/linuxproc"),
        ("TaskPlugin", "task/none"),
        ("JobAcctGatherType", "jobacct_gather/none"),
        ("SelectType", "select/cons_tres"),
        ("SelectTypeParameters", "CR_Core"),
        ("MpiDefault", "pmi2"),
        ("ReturnToService", "2"),
        # The nodes are namespaces of one machine: take the CPUs given, not the real ones.
        ("SlurmdParameters", "config_overrides"),
        ("MailProg", "/bin/true"),  # else slurmctld logs an error: there is no mail here
        ("KillWait", "2"),
        ("InactiveLimit", "0"),
        ("MinJobAge", "300"),
        # Schedule a batch job when it is submitted, not up to 3 s later (the default).
        ("SchedulerParameters", "batch_sched_delay=0"),
        ("JobCompType", "jobcomp/filetxt"),
        ("JobCompLoc", str(root / "jobcomp.txt")),
    ]
    if accounting:
        settings += _accounting(paths, controller_address, port["slurmdbd"])
    lines = [f"# Slurm of test cluster {cluster_id} (cpuaccel.testbed.slurm)"]
    lines += [f"{key}={value}" for key, value in settings]
    lines += [f"NodeName={n.name} NodeAddr={n.address} CPUs={cpus} State=UNKNOWN" for n in nodes]
    names = ",".join(n.name for n in nodes)
    lines.append(f"PartitionName={PARTITION} Nodes={names} Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def _accounting(paths: BedPaths, controller_address: str, port: int) -> list[tuple[str, str]]:
    return [
        ("AccountingStorageType", "accounting_storage/slurmdbd"),
        ("AccountingStorageHost", controller_address),
        ("AccountingStoragePort", str(port)),
        # For slurmdbd this is not a password but the munge socket to use (its AuthInfo
        # is not used for that connection): without it sacct tries /run/munge.
        ("AccountingStoragePass", str(paths.munge_socket)),
    ]


def slurmdbd_conf(paths: BedPaths, cluster_id: int, controller_address: str) -> str:
    """slurmdbd.conf: this bed's port, and its private MariaDB over TCP on loopback."""
    port = ports(cluster_id)
    settings = [
        ("DbdHost", socket.gethostname()),
        ("DbdAddr", controller_address),
        ("DbdPort", str(port["slurmdbd"])),
        ("SlurmUser", "root"),
        ("AuthType", "auth/munge"),
        ("AuthInfo", f"socket={paths.munge_socket}"),
        ("LogFile", str(paths.log("slurmdbd"))),
        ("PidFile", str(paths.pid_file("slurmdbd"))),
        ("StorageType", "accounting_storage/mysql"),
        ("StorageHost", "127.0.0.1"),
        ("StoragePort", str(port["mariadb"])),
        ("StorageUser", "root"),
        ("StorageLoc", f"slurm_{cluster_id}"),
    ]
    return "".join(f"{key}={value}\n" for key, value in settings)


def make_dirs(paths: BedPaths, nodes: Sequence[Node]) -> None:
    paths.root.mkdir(parents=True, exist_ok=True)
    # munged runs as the munge user and must reach its key and socket below these, even
    # when the cluster's state dir was made under a umask of 077.
    for path in (paths.root.parent, paths.root):
        path.chmod(0o755)
    for sub in ("log", "run", "ctld", "spool"):
        (paths.root / sub).mkdir(parents=True, exist_ok=True)
    for node in nodes:
        (paths.root / "spool" / node.name).mkdir(exist_ok=True)


def write_munge_key(paths: BedPaths) -> None:
    """A fresh key in a directory only the munge user may write (munged checks that)."""
    import pwd

    user = pwd.getpwnam(MUNGE_USER)
    paths.munge_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chown(paths.munge_dir, user.pw_uid, user.pw_gid)
    paths.munge_dir.chmod(0o755)  # clients (root) reach the socket through it
    fd = os.open(paths.munge_key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
    try:
        os.write(fd, os.urandom(1024))
    finally:
        os.close(fd)
    os.chown(paths.munge_key, user.pw_uid, user.pw_gid)
    # munged opens its log as the munge user.
    paths.log("munged").touch()
    os.chown(paths.log("munged"), user.pw_uid, user.pw_gid)


def marked_with(pid: int, root: Path) -> bool:
    """True if pid's environment carries this bed's marker (a daemon the bed started)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"{MARKER}={root}".encode() in raw.split(b"\0")


def bed_pids(state_dir: Path) -> set[int]:
    """Every live process carrying the marker of the bed in this state dir."""
    root = bed_dir(state_dir)
    found = set()
    for pid in _all_pids():
        with contextlib.suppress(OSError):
            if marked_with(pid, root):
                found.add(pid)
    found.discard(os.getpid())
    return found
