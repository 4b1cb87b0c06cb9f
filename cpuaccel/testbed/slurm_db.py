"""Accounting for a test cluster's Slurm: a private MariaDB and slurmdbd, so that ``sacct``
answers for finished jobs as on a real cluster.

The database is the bed's own: ``mariadbd`` on an empty datadir in the bed's directory,
on loopback at a port of this cluster id, started and ended by pid like the other daemons.
It runs with ``--skip-grant-tables``: no ``mariadb-install-db`` (most of the bed's start
otherwise), no password; anyone on this machine may reach it, as
anyone may reach the bed's Slurm, and it is gone with the bed. slurmdbd creates its own
database and tables.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from cpuaccel.testbed import slurm_files
from cpuaccel.testbed.netns import ClusterError

if TYPE_CHECKING:
    from cpuaccel.testbed.slurm_files import BedPaths

MARIADBD = "/usr/sbin/mariadbd"
SLURMDBD = "/usr/sbin/slurmdbd"
# Small enough to start quickly on a small shared machine; slurmdbd would like more, and
# says so in its log, but a test bed holds a few hundred jobs. Nothing is kept across a
# crash, so no flush at each commit and no doublewrite: less I/O on a shared machine.
_INNODB = [
    "--innodb-log-file-size=4M", "--innodb-buffer-pool-size=16M",
    "--innodb-flush-log-at-trx-commit=0", "--innodb-doublewrite=0",
]  # fmt: skip


def unavailable_reason() -> str | None:
    """Why accounting cannot run here (missing packages), or None."""
    needed = (MARIADBD, SLURMDBD, "/usr/bin/sacctmgr")
    missing = [path for path in needed if not Path(path).exists()]
    if missing:
        return (
            f"missing {', '.join(missing)} (tools/system-deps.sh installs slurmdbd and "
            "mariadb-server-core)"
        )
    return None


def _port_open(port: int, address: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.5):
            return True
    except OSError:
        return False


def start(
    paths: BedPaths,
    cluster_id: int,
    address: str,
    spawn: Callable[[str, list[str]], None],
    wait_for: Callable[[str, Callable[[], bool], float], None],
) -> None:
    """MariaDB, then slurmdbd (before slurmctld, which then registers its cluster), for
    the bed of cluster ``cluster_id`` whose controller side listens on ``address``;
    ``spawn`` and ``wait_for`` start a daemon and wait for it, as the bed does."""
    reason = unavailable_reason()
    if reason is not None:
        raise ClusterError(f"cannot start Slurm's accounting on the test cluster: {reason}")
    ports = slurm_files.ports(cluster_id)
    paths.db_dir.mkdir(mode=0o700)
    spawn("mariadbd", [
        MARIADBD, "--no-defaults", f"--datadir={paths.db_dir}", f"--socket={paths.db_socket}",
        f"--port={ports['mariadb']}", "--bind-address=127.0.0.1", "--user=root",
        "--skip-grant-tables",
        f"--pid-file={paths.root / 'run' / 'mariadbd.pid.own'}", "--skip-name-resolve",
        f"--log-error={paths.log('mariadbd')}", "--innodb-lock-wait-timeout=900", *_INNODB,
    ])  # fmt: skip
    wait_for("mariadbd", lambda: _port_open(ports["mariadb"]), 30.0)
    text = slurm_files.slurmdbd_conf(paths, cluster_id, address)
    fd = os.open(paths.dbd_conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    spawn("slurmdbd", [SLURMDBD, "-D"])
    wait_for("slurmdbd", lambda: _port_open(ports["slurmdbd"], address), 30.0)
    # slurmctld registers its cluster in slurmdbd itself when it first connects.
