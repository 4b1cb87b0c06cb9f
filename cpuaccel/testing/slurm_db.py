"""Accounting for a test cluster's Slurm: a private MariaDB and slurmdbd, so that ``sacct``
answers for finished jobs as on a real cluster.

The database is the bed's own: a datadir made by ``mariadb-install-db`` in the bed's
directory, ``mariadbd`` on loopback at a port of this cluster id (root without password,
only reachable from this machine), started and ended by pid like the other daemons. It is
ready in about 2.5 s here; slurmdbd then creates its tables itself.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cpuaccel.testing import slurm_files
from cpuaccel.testing.netns import ClusterError

if TYPE_CHECKING:
    from cpuaccel.testing.slurm import SlurmBed

MARIADBD = "/usr/sbin/mariadbd"
INSTALL_DB = "/usr/bin/mariadb-install-db"
SLURMDBD = "/usr/sbin/slurmdbd"
# Small enough to start in a second on a 2-core machine; slurmdbd would like more, and
# says so in its log, but a test bed holds a few hundred jobs.
_INNODB = ["--innodb-log-file-size=4M", "--innodb-buffer-pool-size=16M"]


def unavailable_reason() -> str | None:
    """Why accounting cannot run here (missing packages), or None."""
    needed = (MARIADBD, INSTALL_DB, SLURMDBD, "/usr/bin/sacctmgr")
    missing = [path for path in needed if not Path(path).exists()]
    if missing:
        return (
            f"missing {', '.join(missing)} (tools/system-deps.sh installs slurmdbd, "
            "mariadb-server-core, mariadb-client-core)"
        )
    return None


def _install_db(bed: SlurmBed) -> None:
    log = bed.paths.log("mariadb-install-db")
    argv = [
        INSTALL_DB, "--no-defaults", f"--datadir={bed.paths.db_dir}", "--user=root",
        "--auth-root-authentication-method=normal", "--skip-test-db", "--skip-name-resolve",
        *_INNODB,
    ]  # fmt: skip
    with log.open("wb") as out:
        try:
            done = subprocess.run(
                argv, stdout=out, stderr=subprocess.STDOUT, timeout=60, check=False, cwd="/"
            )
        except subprocess.TimeoutExpired:
            raise ClusterError(f"mariadb-install-db took over 60s; its log {log}") from None
    if done.returncode != 0:
        raise ClusterError(f"mariadb-install-db failed ({done.returncode}); its log {log}")


def _port_open(port: int, address: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.5):
            return True
    except OSError:
        return False


def start(bed: SlurmBed, spawn: Callable[..., None], wait_for: Callable[..., None]) -> None:
    """MariaDB, then slurmdbd, then this cluster registered in it (before slurmctld)."""
    reason = unavailable_reason()
    if reason is not None:
        raise ClusterError(f"cannot start Slurm's accounting on the test cluster: {reason}")
    paths, cluster = bed.paths, bed.cluster
    ports = slurm_files.ports(cluster.cluster_id)
    _install_db(bed)
    spawn(bed, "mariadbd", [
        MARIADBD, "--no-defaults", f"--datadir={paths.db_dir}", f"--socket={paths.db_socket}",
        f"--port={ports['mariadb']}", "--bind-address=127.0.0.1", "--user=root",
        f"--pid-file={paths.root / 'run' / 'mariadbd.pid.own'}", "--skip-name-resolve",
        f"--log-error={paths.log('mariadbd')}", "--innodb-lock-wait-timeout=900", *_INNODB,
    ])  # fmt: skip
    wait_for(bed, "mariadbd", lambda: _port_open(ports["mariadb"]), 30.0)
    text = slurm_files.slurmdbd_conf(paths, cluster.cluster_id, cluster.controller_address)
    fd = os.open(paths.dbd_conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    spawn(bed, "slurmdbd", [SLURMDBD, "-D"])
    address = cluster.controller_address
    wait_for(bed, "slurmdbd", lambda: _port_open(ports["slurmdbd"], address), 30.0)
    name = slurm_files.cluster_name(cluster.cluster_id)
    done = _sacctmgr(bed, ["add", "cluster", name])
    if done.returncode != 0 and "already exists" not in done.stdout + done.stderr:
        raise ClusterError(
            f"sacctmgr add cluster {name} failed: {done.stderr.strip() or done.stdout.strip()}; "
            f"slurmdbd's log {paths.log('slurmdbd')}"
        )


def _sacctmgr(bed: SlurmBed, args: list[str]) -> subprocess.CompletedProcess[Any]:
    return bed.client(["sacctmgr", "-i", *args], timeout=30)
