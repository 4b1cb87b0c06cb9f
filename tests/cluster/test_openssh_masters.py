"""check and sync on ssh masters kept across commands, against real nodes: the second
command reuses the first one's master, no paramiko is loaded on that path, an unknown
key is still refused, and a node re-keyed while an old master lives gets a new one."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cpuaccel.connectors.choose import connector_for
from cpuaccel.connectors.connect_options import ConnectOptions
from cpuaccel.connectors.openssh_session import OpenSSHConnector
from cpuaccel.errors import EXIT_NODE_FAILED, EXIT_OK, Unreachable
from cpuaccel.inventory.inventory import Inventory
from cpuaccel.testbed.cluster import Cluster
from testsupport.command import cpuaccel

pytestmark = pytest.mark.cluster


@pytest.fixture
def scratch() -> Iterator[Path]:
    folder = Path("/tmp") / f"cpxl-persist-{uuid.uuid4().hex[:10]}"  # a path every node sees
    (folder / "project").mkdir(parents=True)
    (folder / "project" / "train.py").write_text("print('hi')\n")
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _conn(inventory: Path, name: str) -> OpenSSHConnector:
    host = Inventory.load(inventory).hosts[name]
    conn = connector_for(host, ConnectOptions(keep=True))
    assert isinstance(conn, OpenSSHConnector)
    return conn


def _master_pid(path: str) -> int | None:
    """The pid ``ssh -O check`` gives for the master at ``path``, None if none answers."""
    proc = subprocess.run(
        ["ssh", "-o", f"ControlPath={path}", "-O", "check", "any"],
        capture_output=True,
        text=True,
        timeout=10,
    )
    found = re.search(r"Master running \(pid=(\d+)\)", proc.stderr)
    return int(found.group(1)) if proc.returncode == 0 and found else None


def _sync(inventory: Path, scratch: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    dest = str(scratch / "dest")
    argv = ["sync", "-i", str(inventory), "--limit", "node1", "--dest", dest, "--json", *extra]
    return cpuaccel(*argv, str(scratch / "project"), timeout=120)


def test_a_second_sync_reuses_the_first_ones_master(cluster: Cluster, scratch: Path) -> None:
    path = _conn(cluster.inventory_path, "node1").control_path()
    first = _sync(cluster.inventory_path, scratch)
    assert first.returncode == EXIT_OK, first.stdout + first.stderr
    pid = _master_pid(path)
    assert pid is not None  # the first sync left a master, which outlived it
    check = cpuaccel("check", "-i", str(cluster.inventory_path), "--limit", "node1", timeout=120)
    assert check.returncode == EXIT_OK, check.stdout
    second = _sync(cluster.inventory_path, scratch)
    assert second.returncode == EXIT_OK, second.stdout + second.stderr
    assert json.loads(second.stdout)["hosts"]["node1"]["in_sync"]
    assert _master_pid(path) == pid  # the same master served check and the second sync


PROBE = """
import sys
from cpuaccel.cli.main import main
sys.argv = ["cpuaccel", *sys.argv[1:]]
try:
    main()
except SystemExit as exc:
    code = exc.code
heavy = ("paramiko", "cryptography", "fabric", "invoke", "nacl")
loaded = sorted(m for m in sys.modules if m.split(".")[0] in heavy)
sys.stderr.write("PROBE " + repr((code, loaded)) + "\\n")
"""


def test_sync_and_check_over_openssh_load_no_paramiko(cluster: Cluster, scratch: Path) -> None:
    inventory = str(cluster.inventory_path)
    dest = str(scratch / "dest")
    for argv in (
        ["sync", "-i", inventory, "--dest", dest, str(scratch / "project")],
        ["check", "-i", inventory],
    ):
        proc = subprocess.run(
            [sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=120
        )
        said = [line for line in proc.stderr.splitlines() if line.startswith("PROBE ")]
        assert said, proc.stderr[-2000:]
        assert said[-1] == f"PROBE {(EXIT_OK, [])!r}", (argv[0], proc.stdout[-2000:])


def test_checks_connected_line_is_built_only_for_v(cluster: Cluster) -> None:
    """The -v line's user (getpass) and port (ssh_config read) are looked up only when
    -v asks for the line: after the probe's answer, on a one-node check's path; with -v
    it is still said."""
    argv = ["check", "-i", str(cluster.inventory_path), "--limit", "node1", "--json"]
    script = PROBE.replace(
        '("paramiko", "cryptography", "fabric", "invoke", "nacl")', '("getpass",)'
    )
    for extra, loaded in (([], []), (["-v"], ["getpass"])):
        proc = subprocess.run(
            [sys.executable, "-c", script, *argv, *extra],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert f"PROBE {(EXIT_OK, loaded)!r}" in proc.stderr, proc.stderr[-2000:]
        assert ("node1: connected as root@" in proc.stderr) == bool(extra)


def test_an_unknown_key_is_refused_by_sync_over_openssh(cluster: Cluster, scratch: Path) -> None:
    empty = scratch / "known_hosts"
    empty.write_text("")
    inventory = cluster.write_inventory(
        scratch / "unknown.yaml",
        cpuaccel_known_hosts=str(empty),
        ansible_ssh_common_args="-o UserKnownHostsFile=" + str(empty),
    )
    assert isinstance(_conn(inventory, "node1"), OpenSSHConnector)
    proc = _sync(inventory, scratch)
    assert proc.returncode == EXIT_NODE_FAILED
    error = json.loads(proc.stdout)["hosts"]["node1"]["error"]
    assert "host key of" in error and "is not known" in error
    assert not (scratch / "dest").exists() or not list((scratch / "dest").iterdir())


def test_a_node_rekeyed_while_a_master_lives_gets_a_new_checked_one(
    cluster: Cluster, scratch: Path
) -> None:
    """As a test cluster re-made at the same address: new host key, known_hosts
    rewritten. The old master (its session survives a listener restart) is not asked
    again: the next sync opens a new one, which checks the new key."""
    key = cluster.host_key_path("node1")
    saved = scratch / "saved-key"
    shutil.copy2(key, saved)
    shutil.copy2(str(key) + ".pub", str(saved) + ".pub")
    known = scratch / "known_hosts"
    node1 = cluster.node("node1")

    def trust(public: Path) -> None:
        kind, blob = public.read_text().split()[:2]
        known.write_text(f"{node1.address} {kind} {blob}\nnode1 {kind} {blob}\n")

    trust(Path(str(key) + ".pub"))
    inventory = cluster.write_inventory(
        scratch / "rekeyed.yaml",
        cpuaccel_known_hosts=str(known),
        ansible_ssh_common_args="-o UserKnownHostsFile=" + str(known),
    )
    old_path = _conn(inventory, "node1").control_path()
    assert _sync(inventory, scratch).returncode == EXIT_OK
    old_pid = _master_pid(old_path)
    assert old_pid is not None
    try:
        cluster.stop_sshd("node1")  # sessions survive: the old master stays alive
        key.unlink()
        Path(str(key) + ".pub").unlink()
        keygen = ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)]
        subprocess.run(keygen, check=True)
        cluster.start_sshd("node1")
        trust(Path(str(key) + ".pub"))
        new_path = _conn(inventory, "node1").control_path()
        assert new_path != old_path
        again = _sync(inventory, scratch)
        assert again.returncode == EXIT_OK, again.stdout + again.stderr
        assert _master_pid(old_path) == old_pid  # alive, but not what served the sync
        new_pid = _master_pid(new_path)
        assert new_pid is not None and new_pid != old_pid
    finally:
        cluster.stop_sshd("node1", kill_sessions=True)
        shutil.copy2(saved, key)
        shutil.copy2(str(saved) + ".pub", str(key) + ".pub")
        cluster.start_sshd("node1")


def test_a_commands_own_exit_255_is_its_result_a_master_gone_is_unreachable(
    cluster: Cluster,
) -> None:
    conn = _conn(cluster.inventory_path, "node1")
    conn.connect()
    assert conn.run(["true"]).ok  # a master now
    assert conn.run(["sh", "-c", "exit 255"]).exit_code == 255
    path = conn.control_path()
    ended = subprocess.Popen(["sh", "-c", f"sleep 1; ssh -o ControlPath={path} -O exit x"])
    try:
        with pytest.raises(Unreachable, match="ended"):
            conn.run(["sleep", "4"], timeout=60)
    finally:
        ended.wait(timeout=30)
    assert conn.run(["echo", "back"]).stdout == "back\n"  # a new master
    # The command the ended master carried runs out on its own (no tty, no signal):
    # gone within its 4 s, so no later test finds it on node1.
    assert cluster.wait_idle("node1", timeout=10) == []
