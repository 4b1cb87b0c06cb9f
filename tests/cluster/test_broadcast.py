"""The broadcast (cpuaccel/connectors/broadcast.py, cpuaccel/node/relay.py) on real
nodes: through `cpuaccel sync`, whose large files it carries, and through its own loop
where a node must fail in the middle.

What arrived is always read on the node itself (``cluster.exec``), never through the code
under test. The nodes share /tmp with the controller; /srv/cpuaccel-node is each one's own.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cpuaccel.connectors.broadcast import Broadcast, Listeners, payload_file
from cpuaccel.connectors.connect_options import ConnectOptions
from cpuaccel.executor import ConnectionPool
from cpuaccel.inventory.inventory import Inventory
from cpuaccel.node.common import TMP_MARK
from cpuaccel.testbed.cluster import NODE_DIR, WORKDIR, Cluster
from tests.cluster.fixtures import lying_python
from testsupport.command import cpuaccel

pytestmark = pytest.mark.cluster

NODES = ("node1", "node2", "node3")
MB = 1 << 20


@pytest.fixture
def scratch(cluster: Cluster) -> Iterator[Path]:
    """A project folder on the shared /tmp, and its destination on every node, removed after."""
    name = f"cpxl-bcast-{uuid.uuid4().hex[:10]}"
    folder = Path("/tmp") / name
    folder.mkdir()
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        for node in NODES:
            cluster.exec(node, ["rm", "-rf", f"{WORKDIR}/{name}", f"{NODE_DIR}/{name}"])


def digests(cluster: Cluster, node: str, root: str) -> dict[str, str]:
    """sha256 of every file below root on the node, read there; temporary files included."""
    program = (
        "import hashlib,json,os,sys\nout={}\n"
        "for d,_,fs in os.walk(sys.argv[1]):\n"
        " for f in fs:\n"
        "  p=os.path.join(d,f)\n"
        "  if not os.path.islink(p):\n"
        "   out[os.path.relpath(p,sys.argv[1])]=hashlib.sha256(open(p,'rb').read()).hexdigest()\n"
        "print(json.dumps(out))\n"
    )
    done = cluster.exec(node, [sys.executable, "-c", program, root])
    assert done.returncode == 0, done.stderr
    found: dict[str, str] = json.loads(done.stdout)
    return {rel: h for rel, h in found.items() if not rel.startswith(".cpuaccel/")}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sync(
    cluster: Cluster, src: Path, *args: str, inventory: Path | None = None
) -> tuple[dict, str]:  # type: ignore[type-arg]
    done = cpuaccel(
        "sync", "-i", str(inventory or cluster.inventory_path), "--json", *args,
        cwd=src, timeout=180,
    )  # fmt: skip
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout), done.stderr


def project(folder: Path, large: int = 24 * MB) -> dict[str, bytes]:
    files = {"train.py": b"print('hello')\n", "data/weights.bin": os.urandom(large)}
    for rel, data in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    return files


def every_node_holds(cluster: Cluster, dest: str, files: dict[str, bytes]) -> None:
    """Every node holds exactly these files below dest, read there (no temporary ones)."""
    want = {rel: sha(data) for rel, data in files.items()}
    for node in NODES:
        assert digests(cluster, node, dest) == want, node


def scratch_project(scratch: Path) -> tuple[Path, dict[str, bytes], str]:
    """A project in ``scratch``/proj (a large file among its files), its files, and
    where the nodes get it."""
    src = scratch / "proj"
    src.mkdir()
    return src, project(src), f"{WORKDIR}/{scratch.name}"


def methods(report: dict) -> dict[str, str]:  # type: ignore[type-arg]
    return {name: str(host["method"]) for name, host in report["hosts"].items()}


# ---------------------------------------------------------------- through sync


def test_sync_broadcasts_a_large_file_and_every_node_holds_its_bytes(
    cluster: Cluster, scratch: Path
) -> None:
    src, files, dest = scratch_project(scratch)
    report, stderr = sync(cluster, src, "--dest", dest)
    assert set(methods(report).values()) == {"broadcast+tar"}, report
    # through the chain: every hop's ssh came up, no node was served directly
    assert "served directly" not in stderr and "cannot reach" not in stderr, stderr
    every_node_holds(cluster, dest, files)
    # a second sync finds every node in step: nothing is sent again
    again, _ = sync(cluster, src, "--dest", dest)
    assert set(methods(again).values()) == {"none"}, again


def test_nodes_that_cannot_ssh_to_each_other_get_the_star_with_one_line(
    cluster: Cluster, scratch: Path
) -> None:
    # The key lives where only the controller sees it: the nodes' own /srv/cpuaccel-node
    # hides the controller's, so the relays' ssh between nodes has no key to offer.
    hidden = NODE_DIR / scratch.name
    hidden.mkdir(parents=True)
    try:
        shutil.copy(cluster.key_path, hidden / "id")
        (hidden / "id").chmod(0o600)
        inventory = cluster.write_inventory(
            scratch / "inventory.yaml", ansible_ssh_private_key_file=str(hidden / "id")
        )
        src, files, dest = scratch_project(scratch)
        _, stderr = sync(cluster, src, "--dest", dest, inventory=inventory)
    finally:
        shutil.rmtree(hidden, ignore_errors=True)
    lines = [line for line in stderr.splitlines() if "cannot reach each other over ssh" in line]
    assert len(lines) == 1, stderr
    assert "sending to each node from the controller" in lines[0]
    every_node_holds(cluster, dest, files)


def test_a_node_that_reports_a_wrong_hash_is_named_and_served_directly(
    cluster: Cluster, scratch: Path
) -> None:
    # node3's Python runs the relay with its report of a kept file's sha256 falsified.
    liar = lying_python(scratch)
    inventory = cluster.write_inventory(
        scratch / "inventory.yaml", {"node3": {"cpuaccel_python": str(liar)}}
    )
    src, files, dest = scratch_project(scratch)
    report, stderr = sync(cluster, src, "--dest", dest, inventory=inventory)
    named = [line for line in stderr.splitlines() if "node3" in line and "sha256" in line]
    assert named, stderr
    assert "not the sent" in named[0]
    used = methods(report)
    assert used["node3"] in ("tar", "rsync"), report  # the whole change, from the controller
    assert used["node1"] == used["node2"] == "broadcast+tar", report
    every_node_holds(cluster, dest, files)


def test_a_symlinked_destination_file_is_replaced_never_written_through(
    cluster: Cluster, scratch: Path
) -> None:
    src, files, dest = scratch_project(scratch)
    outside = f"{NODE_DIR}/{scratch.name}"
    for node in NODES:
        made = cluster.exec(
            node,
            ["sh", "-c", f"mkdir -p {dest} {outside}/dir && echo keep > {outside}/file && "
             f"ln -s {outside}/dir {dest}/data && ln -s {outside}/file {dest}/train.py"],
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
    sync(cluster, src, "--dest", dest)
    every_node_holds(cluster, dest, files)
    for node in NODES:
        assert digests(cluster, node, outside) == {"file": sha(b"keep\n")}, node


# ---------------------------------------------------------------- a node lost midway


def relay_pid(cluster: Cluster, node: str) -> int | None:
    """The pid of the relay listening in node's network namespace."""
    shown = subprocess.run(
        ["ip", "netns", "exec", cluster.node(node).namespace, "ss", "-xlpn"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    for line in shown.stdout.splitlines():
        if "@cpuaccel-relay-" in line and (found := re.search(r"pid=(\d+)", line)):
            return int(found.group(1))
    return None


@contextlib.contextmanager
def slow_links(cluster: Cluster, rate: str = "100mbit") -> Iterator[None]:
    """The controller's sends into the bridge at ``rate``: the broadcast lasts seconds."""
    device = f"cpxl{cluster.cluster_id}br"
    subprocess.run(
        ["tc", "qdisc", "replace", "dev", device, "root", "tbf", "rate", rate,
         "burst", "256kb", "latency", "50ms"],
        check=True,
    )  # fmt: skip
    try:
        yield
    finally:
        subprocess.run(["tc", "qdisc", "del", "dev", device, "root"], check=False)


def test_a_folder_where_a_file_goes_is_said_in_one_line_and_sync_replaces_it(
    cluster: Cluster, scratch: Path
) -> None:
    src, files, dest = scratch_project(scratch)
    made = cluster.exec("node2", ["mkdir", "-p", f"{dest}/data/weights.bin/inner"])
    assert made.returncode == 0, made.stderr
    report, stderr = sync(cluster, src, "--dest", dest)
    assert "another sha256" not in stderr, stderr
    said = [line for line in stderr.splitlines() if "data/weights.bin" in line]
    assert said == [
        "broadcast: node2: data/weights.bin not kept there: a folder stands where the file goes"
    ], stderr
    assert methods(report)["node2"] in ("tar", "rsync"), report  # then sent directly
    every_node_holds(cluster, dest, files)


def test_a_node_killed_mid_broadcast_is_named_and_the_others_complete(
    cluster: Cluster, scratch: Path
) -> None:
    data = os.urandom(40 * MB)
    (scratch / "big").write_bytes(data)
    files = [payload_file(str(scratch / "big"), "sub/big")]
    root = f"{NODE_DIR}/{scratch.name}"
    hosts = Inventory.load(cluster.inventory_path).select(None)
    options = ConnectOptions()
    notes: list[str] = []
    killed: list[int] = []

    def kill_node2_once_it_holds_bytes() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            held = cluster.exec("node2", ["sh", "-c", f"ls -a {root}/sub 2>/dev/null"])
            pid = relay_pid(cluster, "node2")
            if pid is not None and TMP_MARK in held.stdout:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                return
            time.sleep(0.05)

    with slow_links(cluster), ConnectionPool(options) as pool:
        killer = threading.Thread(target=kill_node2_once_it_holds_bytes)
        killer.start()
        listen = Listeners(note=notes.append)
        sender = Broadcast(pool, hosts, dict.fromkeys(NODES, root), files, listen=listen)
        started = time.monotonic()
        out = sender.run()
        took = time.monotonic() - started
        killer.join()
    assert killed, "node2's relay was never seen holding part of the file"
    assert out["node2"].error and not out["node2"].ok, out["node2"]
    assert any(n.startswith("node2 failed") for n in notes), notes
    assert out["node1"].ok and out["node3"].ok, out
    assert out["node3"].direct  # node2 fed it: the controller took over
    assert took < 60, took
    for node in ("node1", "node3"):
        assert digests(cluster, node, root) == {"sub/big": sha(data)}, node
    # node2 holds no file under its final name: at most its temporary one
    left = digests(cluster, "node2", root)
    assert "sub/big" not in left
    assert all(TMP_MARK in rel for rel in left), left
    # the next broadcast of that file (provision's next copy) sweeps what node2's killed
    # relay left, seconds after: no live relay holds it
    with ConnectionPool(options) as pool:
        again = Broadcast(pool, hosts, dict.fromkeys(NODES, root), files).run()
    assert all(delivery.ok for delivery in again.values()), again
    for node in NODES:
        assert digests(cluster, node, root) == {"sub/big": sha(data)}, node


# ---------------------------------------------------------------- what others on a node do

# Someone on every node who holds connections to each relay socket as it appears
# (abstract sockets are anyone's to connect to), HOLD at a time, never sending a byte,
# and opens new ones as the relay closes them; a line for each held connection.
SQUATTER = """import socket,sys,time
held={}
end=time.monotonic()+float(sys.argv[1])
while time.monotonic()<end:
 names=set()
 for line in open("/proc/net/unix").read().splitlines()[1:]:
  f=line.split()
  if len(f)>=8 and f[3]=="00010000" and f[7].startswith("@cpuaccel-relay-"):names.add(f[7][1:])
 for n in names:
  alive=[]
  for s in held.get(n,[]):
   try:
    if s.recv(1,socket.MSG_DONTWAIT)==b"":s.close();continue
   except BlockingIOError:pass
   except OSError:s.close();continue
   alive.append(s)
  while len(alive)<int(sys.argv[2]):
   s=socket.socket(socket.AF_UNIX);s.setblocking(False)
   try:s.connect("\\0"+n)
   except BlockingIOError:pass
   except OSError:s.close();break
   alive.append(s);print("held",n,flush=True)
  held[n]=alive
 time.sleep(0.02)
"""
HOLD = 8
SYNC_SECONDS = 40.0  # the sync of a 24 MB file to three nodes, while they squat


def squat(cluster: Cluster, host: str) -> subprocess.Popen[str]:
    """The squatter in ``host``'s network namespace (its abstract sockets), for 120 s."""
    argv = ["ip", "netns", "exec", cluster.node(host).namespace, sys.executable, "-c"]
    argv += [SQUATTER, "120", str(HOLD)]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)


def test_connections_squatting_every_relay_do_not_stall_a_sync(
    cluster: Cluster, scratch: Path
) -> None:
    src, files, dest = scratch_project(scratch)
    squatters = [squat(cluster, host) for host in NODES]
    try:
        started = time.monotonic()
        done = cpuaccel(
            "sync", "-i", str(cluster.inventory_path), "--json", "--dest", dest,
            cwd=src, timeout=300,
        )  # fmt: skip
        took = time.monotonic() - started
    finally:
        for squatter in squatters:
            squatter.kill()
    held = [squatter.communicate()[0] for squatter in squatters]
    assert all("held cpuaccel-relay-" in out for out in held), held  # every relay was squatted
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert took < SYNC_SECONDS, (took, done.stderr)
    report = json.loads(done.stdout)
    assert set(methods(report).values()) == {"broadcast+tar"}, (report, done.stderr)
    assert "cannot ssh" not in done.stderr, done.stderr
    every_node_holds(cluster, dest, files)


def deaf_python(folder: Path) -> Path:
    """An interpreter for a node whose broadcast relay refuses every feed's key (as one
    fooled or broken would); any other program (and the feed) runs as it is."""
    deaf = folder / "deaf"
    deaf.write_text(
        f"#!{sys.executable}\n"
        "import os, sys\n"
        "if len(sys.argv) < 5:  # not a node program (the feed): as it is\n"
        f"    os.execv({sys.executable!r}, [{sys.executable!r}, *sys.argv[1:]])\n"
        "source = sys.stdin.buffer.read(int(sys.argv[4]))\n"
        "source = source.replace(b'hmac.compare_digest(', b'0 and hmac.compare_digest(')\n"
        "sys.argv = [sys.argv[0], *sys.argv[4:]]\n"
        "exec(compile(source, 'cpuaccel', 'exec'))\n"
    )
    deaf.chmod(0o755)
    return deaf


def test_a_relay_that_takes_no_feed_is_named_and_its_node_served_directly(
    cluster: Cluster, scratch: Path
) -> None:
    inventory = cluster.write_inventory(
        scratch / "inventory.yaml", {"node2": {"cpuaccel_python": str(deaf_python(scratch))}}
    )
    src, files, dest = scratch_project(scratch)
    started = time.monotonic()
    report, stderr = sync(cluster, src, "--dest", dest, inventory=inventory)
    took = time.monotonic() - started
    # ssh from node1 to node2 worked: the relay there is named, not ssh
    assert "cannot ssh" not in stderr and "cannot reach each other" not in stderr, stderr
    named = [line for line in stderr.splitlines() if "node2's relay took no stream" in line]
    assert len(named) == 1 and "from node1" in named[0], stderr
    used = methods(report)
    assert used["node2"] in ("tar", "rsync"), report  # the direct path, from the controller
    assert used["node1"] == used["node3"] == "broadcast+tar", report
    assert took < SYNC_SECONDS, (took, stderr)
    every_node_holds(cluster, dest, files)
