"""`cpuaccel sync` against real nodes (namespaces with their own sshd).

Each node has a private /srv/cpuaccel-node (the inventory's workdir is below it); the rest
of the filesystem, /tmp included, is shared by all nodes like an NFS home. What arrived is
always read on the node itself (``cluster.exec``), never through the code under test.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import random
import shutil
import signal
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cpuaccel.errors import EXIT_NODE_FAILED, EXIT_USAGE
from cpuaccel.node.common import TMP_MARK
from cpuaccel.testbed.cluster import NODE_DIR, WORKDIR, Cluster
from testsupport.command import CLEAN_PATH, clean_env, cpuaccel, start_cpuaccel

pytestmark = pytest.mark.cluster

NODES = ("node1", "node2", "node3")
STATE = ".cpuaccel"
MB = 1 << 20

Tree = dict[str, list[Any]]


# ---------------------------------------------------------------- looking at files


def listing(root: str, detail: bool = False) -> dict[str, list[Any]] | None:
    """Every path below root: ["f", mode, sha256] (with detail, also inode and mtime),
    ["d", mode] or ["l", target]; None when root is not a folder.

    Its source also runs on the nodes, so it imports what it needs itself.
    """
    import hashlib
    import os
    import stat

    if not os.path.isdir(root):
        return None
    out: dict[str, list[Any]] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, root)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ["l", os.readlink(path)]
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ["d", stat.S_IMODE(st.st_mode)]
            else:
                with open(path, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
                out[rel] = ["f", stat.S_IMODE(st.st_mode), digest]
                if detail:
                    out[rel] += [st.st_ino, st.st_mtime_ns]
    return out


LISTING_PROGRAM = (
    "from __future__ import annotations\n"
    + inspect.getsource(listing)
    + "import json, sys\nprint(json.dumps(listing(sys.argv[1], sys.argv[2] == '1')))\n"
)


def on_node(cluster: Cluster, name: str, root: str | Path, detail: bool = False) -> Tree | None:
    """What node `name` holds below root, read inside the node (not via sync or ssh)."""
    proc = cluster.exec(name, [sys.executable, "-c", LISTING_PROGRAM, str(root), str(int(detail))])
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


def is_temporary(rel: str) -> bool:
    return TMP_MARK in rel.rsplit("/", 1)[-1] or rel.startswith(f"{STATE}/tmp/")


def real_paths(tree: Tree) -> Tree:
    """The tree without cpuaccel's state folder and temporary files."""
    return {
        rel: entry
        for rel, entry in tree.items()
        if rel != STATE and not rel.startswith(STATE + "/") and not is_temporary(rel)
    }


def temporaries(tree: Tree) -> list[str]:
    return sorted(rel for rel in tree if is_temporary(rel))


def without(tree: Tree, *tops: str) -> Tree:
    return {
        rel: entry
        for rel, entry in tree.items()
        if not any(rel == top or rel.startswith(top + "/") for top in tops)
    }


def source_tree(root: Path) -> Tree:
    tree = listing(str(root))
    assert tree is not None
    return tree


# ---------------------------------------------------------------- running the CLI


def cached_cpuaccel(
    *args: str, cwd: Path, cache: Path, path: str = CLEAN_PATH, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """`cpuaccel ARGS` from a plain shell with `path`, its cache in `cache`."""
    env = plain_env(path=path, XDG_CACHE_HOME=str(cache))
    return cpuaccel(*args, cwd=cwd, env=env, timeout=timeout)


def plain_env(path: str, **extra: str) -> dict[str, str]:
    """A user's plain shell, running the cpuaccel under test (a worktree's, when PYTHONPATH
    names one) rather than the one installed in the venv."""
    env = clean_env(path=path, **extra)
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return env


class Env:
    """One test's scratch space (shared /tmp) and its sync command."""

    def __init__(self, cluster: Cluster, scratch: Path) -> None:
        self.cluster = cluster
        self.scratch = scratch
        self.name = f"proj-{uuid.uuid4().hex[:10]}"
        self.src = scratch / self.name  # default dest: {{cpuaccel_workdir}}/<this name>
        self.dest = f"{WORKDIR}/{self.name}"
        self.src.mkdir()

    def run(self, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
        return cached_cpuaccel(
            "sync",
            "-i",
            str(self.cluster.inventory_path),
            *args,
            cwd=self.src,
            cache=self.scratch / "cache",
            **kw,
        )

    def sync(self, *args: str, expect: int = 0, **kw: Any) -> dict[str, Any]:
        proc = self.run("--json", *args, **kw)
        assert "Traceback" not in proc.stderr, proc.stderr
        assert proc.returncode == expect, proc.stdout + proc.stderr
        report: dict[str, Any] = json.loads(proc.stdout)
        return report

    def node(self, name: str, detail: bool = False) -> Tree | None:
        return on_node(self.cluster, name, self.dest, detail)


@pytest.fixture
def env(cluster: Cluster) -> Iterator[Env]:
    scratch = Path("/tmp") / f"cpxl-sync-test-{uuid.uuid4().hex[:10]}"
    scratch.mkdir()
    made = Env(cluster, scratch)
    try:
        yield made
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        for name in NODES:
            cluster.exec(name, ["sh", "-c", f'rm -rf "{made.dest}" "{made.dest}".*'])


def write(path: Path, content: str | bytes, mode: int | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    if mode is not None:
        path.chmod(mode)


IGNORED_TOPS = (".git", "runs", "myenv", "pkg0/__pycache__", "debug.log")


def make_project(root: Path) -> None:
    """~330 entries in nested folders, an executable, links inside, things left out."""
    rng = random.Random(3)
    for d in range(4):
        for s in range(5):
            for f in range(15):
                lines = "".join(f"x{i} = {rng.random()!r}\n" for i in range(rng.randint(1, 40)))
                write(root / f"pkg{d}" / f"sub{s}" / f"mod{f}.py", lines)
    write(root / "run.sh", "#!/bin/sh\necho trained\n", 0o755)
    write(root / "secret.yaml", "token: x\n", 0o600)
    write(root / "my notes é.txt", "spaces and unicode\n")
    write(root / "weights.bin", rng.randbytes(200_000))
    (root / "empty").mkdir()
    (root / "latest.py").symlink_to("pkg0/sub0/mod0.py")
    (root / "configs").symlink_to("pkg1")
    (root / "pkg2" / "sub1" / "up").symlink_to("../../pkg0")
    write(root / ".gitignore", "*.log\n")
    write(root / "debug.log", "left out by .gitignore\n")
    write(root / ".git" / "HEAD", "ref: refs/heads/main\n")
    write(root / "pkg0" / "__pycache__" / "mod0.cpython-311.pyc", b"\0")
    write(root / "runs" / "1" / "out.txt", "a run's output\n")
    write(root / "myenv" / "pyvenv.cfg", "home = /usr/bin\n")
    write(root / "myenv" / "lib" / "site.py", "")


def expected_tree(root: Path) -> Tree:
    return without(source_tree(root), *IGNORED_TOPS)


def assert_identical_everywhere(env: Env, expected: Tree, names: tuple[str, ...] = NODES) -> None:
    for name in names:
        tree = env.node(name)
        assert tree is not None, f"{env.dest} missing on {name}"
        assert real_paths(tree) == expected, name
        assert temporaries(tree) == [], name


# ---------------------------------------------------------------- the tests


def test_tree_arrives_identical_on_every_node(env: Env) -> None:
    make_project(env.src)
    expected = expected_tree(env.src)
    assert len([e for e in expected.values() if e[0] == "f"]) > 300
    report = env.sync()
    assert sorted(report["hosts"]) == list(NODES)
    for name, node in report["hosts"].items():
        assert node["status"] == "ok" and node["in_sync"] is True, name
        assert node["dest"] == env.dest and node["shared_with"] is None
        assert sorted(node["changed"]) == sorted(expected), name
        assert node["deleted"] == []
    assert report["files"] == len(expected)
    assert_identical_everywhere(env, expected)
    for name in NODES:
        tree = env.node(name)
        assert tree is not None
        assert tree["run.sh"][:2] == ["f", 0o755]
        assert tree["secret.yaml"][:2] == ["f", 0o600]
        assert tree["latest.py"] == ["l", "pkg0/sub0/mod0.py"]
        assert tree["configs"] == ["l", "pkg1"]
        assert tree["pkg2/sub1/up"] == ["l", "../../pkg0"]
        assert tree["empty"][0] == "d"
        for left_out in IGNORED_TOPS:
            assert left_out not in tree, (name, left_out)
        # The hash of what was synced is recorded for run's one-round-trip preflight.
        record = env.cluster.exec(name, ["cat", f"{env.dest}/{STATE}/manifest"])
        assert record.stdout.strip() == report["manifest"]
        ran = env.cluster.exec(name, [f"{env.dest}/run.sh"])
        assert ran.stdout == "trained\n", ran.stderr


def test_second_sync_changes_nothing(env: Env) -> None:
    make_project(env.src)
    env.sync()
    before = {name: env.node(name, detail=True) for name in NODES}
    report = env.sync()
    for name, node in report["hosts"].items():
        assert node["status"] == "ok" and node["in_sync"] is True
        assert (node["changed"], node["deleted"], node["bytes"]) == ([], [], 0), name
        assert node["method"] == "none"
    # Not a file rewritten, not even its mtime: same inodes, same times, same record.
    after = {name: env.node(name, detail=True) for name in NODES}
    for name in NODES:
        old, new = before[name] or {}, after[name] or {}
        assert real_paths(new) == real_paths(old), name
        assert new[f"{STATE}/manifest"] == old[f"{STATE}/manifest"], name
    lines = env.run()
    assert lines.returncode == 0
    for name in NODES:
        assert f"{name}: in sync ({env.dest}" in lines.stdout
    assert "3/3 node(s) match the source" in lines.stdout


def test_changing_one_file_moves_exactly_that_file(env: Env) -> None:
    make_project(env.src)
    env.sync()
    before = {name: env.node(name, detail=True) for name in NODES}
    target = env.src / "pkg1" / "sub2" / "mod3.py"
    os.utime(target, (1_000_000, 1_000_000))  # touched only: the content is what counts
    touched = env.sync()
    assert all(node["changed"] == [] for node in touched["hosts"].values())
    target.write_text(target.read_text() + "y = 2\n")
    report = env.sync()
    for name, node in report["hosts"].items():
        assert node["changed"] == ["pkg1/sub2/mod3.py"], name
        assert node["deleted"] == [] and node["bytes"] == target.stat().st_size
        assert node["in_sync"] is True
        after = env.node(name, detail=True)
        assert after is not None and before[name] is not None
        moved = {
            rel
            for rel in set(after) | set(before[name] or {})
            if after.get(rel) != (before[name] or {}).get(rel) and not rel.startswith(STATE)
        }
        assert moved == {"pkg1/sub2/mod3.py"}, name
        assert after["pkg1/sub2/mod3.py"][2] == hashlib.sha256(target.read_bytes()).hexdigest()


def test_delete_removes_stale_files_only_below_the_destination(env: Env) -> None:
    write(env.src / "keep.py", "keep\n")
    write(env.src / "pkg" / "a.py", "a\n")
    write(env.src / ".gitignore", "*.ckpt\n")
    env.sync()
    ex = env.cluster.exec
    # Stale things inside the destination, and neighbours outside it (same name prefix).
    ex("node1", ["sh", "-c", f"echo old > {env.dest}/stale.py"])
    ex("node2", ["sh", "-c", f"mkdir -p {env.dest}/old/deep && echo x > {env.dest}/old/deep/x"])
    for name in NODES:
        script = (
            f"echo n > {env.dest}.sibling && mkdir -p {env.dest}.d && echo n > {env.dest}.d/f "
            f"&& echo c > {env.dest}/model.ckpt && mkdir -p {env.dest}/runs/1 "
            f"&& echo r > {env.dest}/runs/1/log && mkdir -p {env.dest}/nodeenv "
            f"&& echo h > {env.dest}/nodeenv/pyvenv.cfg && echo p > {env.dest}/pkg/b.py"
        )
        assert ex(name, ["sh", "-c", script]).returncode == 0
    kept = env.sync()  # without --delete nothing goes
    assert all(n["deleted"] == [] and n["in_sync"] for n in kept["hosts"].values())
    assert (env.node("node1") or {}).get("stale.py") is not None
    report = env.sync("--delete")
    assert sorted(report["hosts"]["node1"]["deleted"]) == ["pkg/b.py", "stale.py"]
    assert sorted(report["hosts"]["node2"]["deleted"]) == ["old", "pkg/b.py"]
    assert report["hosts"]["node3"]["deleted"] == ["pkg/b.py"]
    for name in NODES:
        node = report["hosts"][name]
        assert node["changed"] == [] and node["in_sync"] is True
        tree = env.node(name)
        assert tree is not None
        assert set(real_paths(tree)) == {
            ".gitignore",
            "keep.py",
            "pkg",
            "pkg/a.py",
            # what the source's rules leave out is not the sync's to delete
            "model.ckpt",
            "runs",
            "runs/1",
            "runs/1/log",
            "nodeenv",
            "nodeenv/pyvenv.cfg",
        }
        outside = ex(name, ["cat", f"{env.dest}.sibling", f"{env.dest}.d/f"])
        assert outside.returncode == 0 and outside.stdout == "n\nn\n", name


def _some_file_arrived(root: Path) -> bool:
    """Whether root holds a file of the sync: a real one, a temporary one or rsync's."""
    for folder, _dirs, files in os.walk(root):
        rel = os.path.relpath(folder, root)
        in_state = rel == STATE or rel.startswith(STATE + "/")
        if files and (not in_state or rel == f"{STATE}/tmp"):
            return True
    return False


def _wait_for_transfer_start(cluster: Cluster, dest_name: str, proc: subprocess.Popen[Any]) -> None:
    roots = [cluster.node(name).private_dir / "work" / dest_name for name in NODES]
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        if any(_some_file_arrived(root) for root in roots):
            return
        time.sleep(0.01)


@pytest.mark.parametrize("method", ["rsync", "tar"])
def test_killed_sync_leaves_no_partial_file_and_the_next_run_converges(
    env: Env, method: str
) -> None:
    rng = random.Random(5)
    for i in range(20):
        write(env.src / "data" / f"shard{i:02}.bin", rng.randbytes(5 * MB))
    write(env.src / "train.py", "print('go')\n")
    expected = source_tree(env.src)
    # Without rsync on the controller the tar stream carries everything.
    path = CLEAN_PATH if method == "rsync" else str(env.scratch / "bin-without-rsync")
    proc = start_cpuaccel(
        "sync",
        "-i",
        str(env.cluster.inventory_path),
        cwd=env.src,
        env=plain_env(path=path, XDG_CACHE_HOME=str(env.scratch / "cache")),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own group: the controller and the rsync/ssh it started
    )
    try:
        _wait_for_transfer_start(env.cluster, env.name, proc)
        time.sleep(0.15)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, "the sync ended before it could be killed"
    for name in NODES:  # what the controller started on the node ends with its connection
        assert env.cluster.wait_idle(name, timeout=30) == [], name
    for name in NODES:
        tree = env.node(name) or {}
        for rel, entry in real_paths(tree).items():
            assert entry == expected.get(rel), f"{name}: {rel} is not the source's"
        for rel in temporaries(tree):
            assert TMP_MARK in rel or rel.startswith(f"{STATE}/tmp/"), (name, rel)
    report = env.sync(path=path)
    for name, node in report["hosts"].items():
        assert node["status"] == "ok" and node["in_sync"] is True, name
    assert_identical_everywhere(env, expected)


def test_shared_filesystem_is_written_once(env: Env) -> None:
    make_project(env.src)
    expected = expected_tree(env.src)
    shared = env.scratch / "shared" / "proj"  # /tmp: every node sees the same folder
    report = env.sync("--dest", str(shared))
    hosts = report["hosts"]
    writers = [name for name, node in hosts.items() if node["changed"]]
    assert len(writers) == 1, hosts
    writer = writers[0]
    assert sorted(hosts[writer]["changed"]) == sorted(expected)
    for name, node in hosts.items():
        assert node["status"] == "ok" and node["in_sync"] is True, name
        assert node["shared_with"] == (None if name == writer else writer), name
    for name in NODES:
        tree = on_node(env.cluster, name, shared)
        assert tree is not None and real_paths(tree) == expected, name
        assert temporaries(tree) == []
    again = env.sync("--dest", str(shared))
    assert all(node["changed"] == [] and node["in_sync"] for node in again["hosts"].values())


LATE_PYTHON = """#!{python}
# A node that answers late: its receiver (cpuaccel.node.treesession) gets its scan
# request only once another node of the shared filesystem is writing (temporary files
# in flight). The real interpreter runs behind it; requests pass through line by line.
import os, re, subprocess, sys, time
args = sys.argv[1:]  # [-S] -c BOOT LENGTH DEST ...
child = subprocess.Popen([{python!r}, *args], stdin=subprocess.PIPE)
boot = args.index("-c")
child.stdin.write(sys.stdin.buffer.read(int(args[boot + 2])))  # the program
child.stdin.flush()
dest = args[boot + 3]
for line in iter(sys.stdin.buffer.readline, b""):
    deadline = time.monotonic() + 30 if b'"mode": "scan"' in line else 0
    while time.monotonic() < deadline:
        tmp = os.path.join(dest, ".cpuaccel", "tmp")
        busy = os.path.isdir(tmp) and os.listdir(tmp)
        # rsync's own temporary names (.NAME.XXXXXX) in a folder the sync made, where it
        # writes without --temp-dir (cpuaccel.node.unfinished)
        names = os.listdir(dest) if os.path.isdir(dest) else []
        rsyncs = [n for n in names if re.fullmatch(r"[.].+[.][A-Za-z0-9]{{6}}", n)]
        busy = busy or [n for n in names if "{mark}" in n] or rsyncs
        if busy:
            with open({seen!r}, "w") as f:
                f.write(repr(busy))
            break
        time.sleep(0.003)
    child.stdin.write(line)
    child.stdin.flush()
child.stdin.close()
sys.exit(child.wait())
"""


def test_shared_filesystem_node_joining_during_the_write(env: Env, tmp_path: Path) -> None:
    """A late node's first look at a shared destination must not disturb the writer."""
    rng = random.Random(9)
    # enough bytes for rsync, in files below the broadcast's size (the nodes' scans then
    # come as each node's own transfer starts, which is the race exercised here)
    for i in range(8):
        write(env.src / f"part{i}.bin", rng.randbytes(MB - 1))
    expected = source_tree(env.src)
    seen = env.scratch / "late-node-saw-writes-in-flight"
    late = env.scratch / "late-python"
    write(late, LATE_PYTHON.format(python=sys.executable, mark=TMP_MARK, seen=str(seen)), 0o755)
    inventory = env.cluster.write_inventory(
        tmp_path / "late.yaml", host_overrides={"node3": {"cpuaccel_python": str(late)}}
    )
    shared = env.scratch / "shared" / "proj"
    proc = cached_cpuaccel(
        "sync",
        "-i",
        str(inventory),
        "--json",
        "--dest",
        str(shared),
        cwd=env.src,
        cache=env.scratch / "cache",
    )
    assert seen.exists(), "node3 never saw the writer at work; the race was not exercised"
    assert proc.returncode == 0, proc.stdout + proc.stderr
    hosts = json.loads(proc.stdout)["hosts"]
    assert hosts["node3"]["shared_with"] in ("node1", "node2")
    assert hosts[hosts["node3"]["shared_with"]]["method"] == "rsync"
    assert all(node["in_sync"] for node in hosts.values()), hosts
    for name in NODES:
        tree = on_node(env.cluster, name, shared)
        assert tree is not None and real_paths(tree) == expected, name
        assert temporaries(tree) == []


def test_unreachable_node_is_reported_while_the_others_sync(env: Env) -> None:
    make_project(env.src)
    expected = expected_tree(env.src)
    # Its sessions too: a connection kept from an earlier sync (an ssh master, as
    # Ansible's) outlives a stop of the listener alone, and would still reach node2.
    with env.cluster.sshd_stopped("node2", kill_sessions=True):
        report = env.sync(expect=EXIT_NODE_FAILED)
        lines = env.run()
        assert env.node("node2") is None  # nothing reached it
    node2 = report["hosts"]["node2"]
    assert node2["status"] == "unreachable" and "refused" in node2["error"].lower()
    for name in ("node1", "node3"):
        assert report["hosts"][name]["status"] == "ok"
        assert report["hosts"][name]["in_sync"] is True
    assert_identical_everywhere(env, expected, ("node1", "node3"))
    assert lines.returncode == EXIT_NODE_FAILED and "Traceback" not in lines.stderr
    assert any(line.startswith("node2: unreachable") for line in lines.stdout.splitlines()), (
        lines.stdout
    )
    assert "2/3 node(s) match the source" in lines.stdout
    # Back up, the next run brings node2 along and leaves the others alone.
    after = env.sync()
    assert after["hosts"]["node2"]["changed"] and after["hosts"]["node1"]["changed"] == []
    assert_identical_everywhere(env, expected)


def test_check_lists_changes_and_changes_nothing(env: Env) -> None:
    write(env.src / "a.py", "a = 1\n")
    write(env.src / "cfg" / "b.yaml", "b: 1\n")
    never = env.sync("--check", expect=1)  # a destination never synced
    for name, node in never["hosts"].items():
        assert sorted(node["changed"]) == ["a.py", "cfg", "cfg/b.yaml"] and not node["in_sync"]
        assert env.node(name) is None, f"--check created {env.dest} on {name}"
    env.sync()
    write(env.src / "a.py", "a = 2\n")
    write(env.src / "new.py", "new\n")
    env.cluster.exec("node1", ["sh", "-c", f"echo s > {env.dest}/stale.py"])
    before = {name: env.node(name, detail=True) for name in NODES}
    report = env.sync("--check", "--delete", expect=1)
    for name, node in report["hosts"].items():
        assert node["changed"] == ["a.py", "new.py"], name
        assert node["deleted"] == (["stale.py"] if name == "node1" else []), name
        assert node["method"] == "check" and node["in_sync"] is False
    # Every file, the state folder included, exactly as before.
    assert {name: env.node(name, detail=True) for name in NODES} == before
    lines = env.run("--check")
    assert lines.returncode == 1
    assert "node2: 2 would change, 0 deleted" in lines.stdout


def test_symlink_outside_the_tree_is_refused_unless_copy_links(env: Env) -> None:
    outside = env.scratch / "outside"
    write(outside / "shared.yaml", "lr: 0.1\n")
    write(outside / "dir" / "x.txt", "x\n")
    write(env.src / "train.py", "print(1)\n")
    (env.src / "config.yaml").symlink_to(outside / "shared.yaml")
    (env.src / "extra").symlink_to(outside / "dir")
    proc = env.run()
    assert proc.returncode == EXIT_USAGE, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    message = " ".join(proc.stderr.split())
    assert "symlink points outside the synced tree" in message
    assert "--copy-links" in message
    for name in NODES:
        assert env.node(name) is None, f"something was written on {name}"
    report = env.sync("--copy-links")
    assert all(node["in_sync"] for node in report["hosts"].values())
    digest = hashlib.sha256(b"lr: 0.1\n").hexdigest()
    for name in NODES:
        tree = env.node(name)
        assert tree is not None
        assert tree["config.yaml"][0] == "f" and tree["config.yaml"][2] == digest, name
        assert tree["extra"][0] == "d" and tree["extra/x.txt"][0] == "f", name
        assert tree["config.yaml"][1] == stat.S_IMODE((outside / "shared.yaml").stat().st_mode)


def test_copy_links_with_rsync(env: Env) -> None:
    """The same with enough bytes that rsync carries them."""
    outside = env.scratch / "outside"
    write(outside / "big.bin", random.Random(1).randbytes(5 * MB))
    write(env.src / "train.py", "print(1)\n")
    (env.src / "big.bin").symlink_to(outside / "big.bin")
    report = env.sync("--copy-links")
    assert {node["method"] for node in report["hosts"].values()} == {"rsync"}
    digest = hashlib.sha256((outside / "big.bin").read_bytes()).hexdigest()
    for name in NODES:
        tree = env.node(name)
        assert tree is not None and tree["big.bin"][::2] == ["f", digest], name


def test_a_node_changed_behind_the_controllers_back_still_converges(env: Env) -> None:
    """The one-trip path trusts the controller's memory only as far as the node agrees."""
    write(env.src / "a.py", "a = 1\n")
    write(env.src / "b.py", "b = 1\n")
    env.sync()
    memory = list((env.scratch / "cache" / "cpuaccel" / "sync").glob("*.json"))
    assert len(memory) == 1  # what each node holds now is remembered
    # node2's copy of a.py is edited on the node itself; then b.py changes at the source.
    env.cluster.exec("node2", ["sh", "-c", f"echo 'a = 999' > {env.dest}/a.py"])
    write(env.src / "b.py", "b = 2\n")
    report = env.sync()
    hosts = report["hosts"]
    assert hosts["node1"]["changed"] == ["b.py"] and hosts["node3"]["changed"] == ["b.py"]
    assert sorted(hosts["node2"]["changed"]) == ["a.py", "b.py"]  # found by its own scan
    for name in NODES:
        assert hosts[name]["in_sync"] is True
        tree = env.node(name)
        assert tree is not None
        got = env.cluster.exec(name, ["cat", f"{env.dest}/a.py", f"{env.dest}/b.py"])
        assert got.stdout == "a = 1\nb = 2\n", name
    # Nothing changed since: every node answers in one trip that it is in sync.
    again = env.sync()
    assert all(h["changed"] == [] and h["in_sync"] for h in again["hosts"].values())


# ---------------------------------------------------------------- where a sync may write


def top_of(cluster: Cluster, name: str, root: str) -> dict[str, int]:
    """root's entries (name: inode), read on the node: a sync that created, replaced or
    deleted anything directly in root changes them."""
    program = (
        "import json, os, sys\n"
        "print(json.dumps({e.name: e.inode() for e in os.scandir(sys.argv[1])}))\n"
    )
    proc = cluster.exec(name, [sys.executable, "-c", program, root])
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


def assert_untouched(before: dict[str, int], after: dict[str, int]) -> None:
    """Nothing removed or replaced, and nothing of the sync's added (a shared folder such
    as /root may gain other programs' files meanwhile)."""
    assert {k: after.get(k) for k in before} == before
    assert not {STATE, "one.py"} & set(after), sorted(after)


def assert_refused(env: Env, *args: str, words: tuple[str, ...]) -> None:
    proc = env.run(*args)
    assert proc.returncode == EXIT_USAGE, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    message = " ".join(proc.stderr.split())
    for word in words:
        assert word in message, message


@pytest.mark.parametrize(
    ("dest", "words"),
    [
        ("/root", ("node1: --dest resolves to /root on the node", "home folder", "fix:")),
        ("~/../../etc", ("--dest resolves to /etc on the node", "top-level", "fix:")),
        # refused by the controller's early check of the text (the node's: the next test)
        (str(NODE_DIR), ("is the workdir /srv/cpuaccel-node/work or a folder above", "fix:")),
    ],
)
def test_delete_into_a_home_system_or_workdir_parent_is_refused(
    env: Env, dest: str, words: tuple[str, ...]
) -> None:
    """`sync --dest <home> --delete` printed "3 deleted", exit 0."""
    write(env.src / "one.py", "x\n")
    resolved = {"~/../../etc": "/etc"}.get(dest, dest)
    before = {name: top_of(env.cluster, name, resolved) for name in NODES}
    # --check first: were the refusal missing, it would change nothing either
    assert_refused(env, "--check", "--dest", dest, words=words)
    assert_refused(env, "--delete", "--dest", dest, words=words)
    for name in NODES:
        assert_untouched(before[name], top_of(env.cluster, name, resolved))


def test_one_node_refusing_its_destination_changes_no_node(env: Env) -> None:
    """node2 resolves --dest to its workdir's parent (a link there); node1 and node3 would
    accept theirs, and yet none is changed: every node is asked before any is written."""
    write(env.src / "one.py", "x\n")
    alias = f"alias-{uuid.uuid4().hex[:8]}"
    ex = env.cluster.exec
    assert ex("node2", ["ln", "-s", str(NODE_DIR), f"{WORKDIR}/{alias}"]).returncode == 0
    try:
        before = {name: top_of(env.cluster, name, str(WORKDIR)) for name in NODES}
        node_dir = top_of(env.cluster, "node2", str(NODE_DIR))
        words = ("node2: --dest resolves to /srv/cpuaccel-node on the node", "workdir")
        assert_refused(env, "--delete", "--dest", "{{ cpuaccel_workdir }}/" + alias, words=words)
        assert {name: top_of(env.cluster, name, str(WORKDIR)) for name in NODES} == before
        assert top_of(env.cluster, "node2", str(NODE_DIR)) == node_dir
    finally:
        for name in NODES:
            ex(name, ["rm", "-rf", f"{WORKDIR}/{alias}"])


def test_a_link_on_the_node_where_the_source_has_a_folder_is_replaced_not_followed(
    env: Env,
) -> None:
    """With dst/data -> /elsewhere, a sync wrote /elsewhere/file.txt
    and chmodded /elsewhere to 0777."""
    write(env.src / "a.py", "a\n")
    write(env.src / "data" / "file.txt", "new\n")
    (env.src / "data").chmod(0o777)
    elsewhere = f"{NODE_DIR}/elsewhere-{uuid.uuid4().hex[:8]}"  # private to each node
    ex = env.cluster.exec
    for name in NODES:
        setup = f"mkdir -p {env.dest} {elsewhere} && chmod 750 {elsewhere}"
        setup += f" && ln -s {elsewhere} {env.dest}/data"
        assert ex(name, ["sh", "-c", setup]).returncode == 0
    try:
        report = env.sync()
        assert all(node["in_sync"] for node in report["hosts"].values())
        for name in NODES:
            assert on_node(env.cluster, name, elsewhere) == {}, name  # no new file
            assert ex(name, ["stat", "-c", "%a", elsewhere]).stdout.strip() == "750", name
            tree = env.node(name)
            assert tree is not None
            assert tree["data"] == ["d", 0o777], name  # a real folder now, not the link
            assert tree["data/file.txt"][0] == "f", name
        assert_identical_everywhere(env, expected_tree(env.src))
    finally:
        for name in NODES:
            ex(name, ["rm", "-rf", elsewhere])
