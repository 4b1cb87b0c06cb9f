"""The node's tree program (node/tree.py) run in-process: it refuses paths outside the
destination, applies a stream and records the manifest, a cut stream leaves no partial
file, the scan keeps a virtualenv and files in flight; after a sync, one walk by
descriptors removes the leftovers of an interrupted sync and describes every entry, and
the tree must still be the manifest's, content included, for the sync to count; the
cleanup of leftovers never acts through a link, not even one swapped in for a folder
between its listing and its removal."""

from __future__ import annotations

import io
import os
import shutil
import signal
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from cpuaccel.node import tree
from cpuaccel.node import tree as remote
from cpuaccel.node.common import TMP_MARK
from cpuaccel.projectsync import receiver, transfer
from cpuaccel.projectsync.ignore import PRUNE_NAMES
from cpuaccel.projectsync.manifest import SourceManifest, build, plan
from tests.unit.projectsync.trees import make_tree

pytestmark = pytest.mark.usefixtures("private_hash_cache")

PRUNE = set(PRUNE_NAMES)


# ---------------------------------------------------------------- the node program


@pytest.mark.parametrize(
    "rel",
    [
        "../x",
        "a/../../x",
        "..",
        "/etc/passwd",
        "//etc/passwd",
        "",
        ".",
        ".cpuaccel/manifest",
        "a/../.cpuaccel/manifest",
        "../dest-sibling/x",
    ],
)
def test_node_program_refuses_paths_outside_the_destination(rel: str) -> None:
    with pytest.raises(ValueError, match="refusing"):
        remote._inside("/srv/dest", rel)


@pytest.mark.parametrize(
    ("rel", "path"),
    [("a/b", "/srv/dest/a/b"), ("a/../b", "/srv/dest/b"), ("x.cpuaccel", "/srv/dest/x.cpuaccel")],
)
def test_node_program_accepts_paths_below_the_destination(rel: str, path: str) -> None:
    assert remote._inside("/srv/dest", rel) == path
    assert remote._inside("/srv/dest/", rel) == path


def apply_stream(source: SourceManifest, changed: list[str], deleted: Sequence[str] = ()) -> bytes:
    header = receiver.request(source, deleted, tar=True)
    with transfer.tar_stream(source, changed, header) as stream:
        return stream.read()


def listing(root: Path) -> dict[str, tuple[Any, ...]]:
    found = remote.scan(str(root), PRUNE, create=False)
    return found["entries"]  # type: ignore[no-any-return]


def test_node_program_applies_a_stream_and_records_the_manifest(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src", {"a/b/c.txt": "c", "run.sh": "#!/bin/sh\n", "empty/": ""})
    (src / "run.sh").chmod(0o755)
    (src / "link").symlink_to("a/b/c.txt")
    source = build([str(src)])
    dest = tmp_path / "dest"
    assert remote.scan(str(dest), PRUNE, create=False)["exists"] is False
    assert not dest.exists()  # look mode changes nothing
    remote.scan(str(dest), PRUNE, create=True)
    result = remote.apply(
        str(dest), PRUNE, io.BytesIO(apply_stream(source, sorted(source.entries)))
    )
    assert result["mismatches"] == [] and result["hash"] == source.hash
    assert listing(dest) == source.entries
    scanned = remote.scan(str(dest), PRUNE, create=False)
    assert scanned["recorded"] == source.hash
    assert os.readlink(dest / "link") == "a/b/c.txt"
    assert (dest / "run.sh").stat().st_mode & 0o777 == 0o755


def test_a_cut_stream_leaves_no_partial_file_and_the_next_apply_converges(
    tmp_path: Path,
) -> None:
    src = make_tree(tmp_path / "src", {"small.txt": "s", "big.bin": os.urandom(3 << 20)})
    source = build([str(src)])
    dest = tmp_path / "dest"
    remote.scan(str(dest), PRUNE, create=True)
    full = apply_stream(source, ["big.bin", "small.txt"])
    with pytest.raises(Exception):  # noqa: B017 - whatever the stream's end raises
        remote.apply(str(dest), PRUNE, io.BytesIO(full[: len(full) // 2]))
    names = os.listdir(dest)
    assert "big.bin" not in names and "small.txt" not in names
    leftovers = [n for n in names if remote.TMP_MARK in n]
    assert leftovers, names  # the half-written file is there, under a temporary name
    look = remote.scan(str(dest), PRUNE, create=False)
    assert look["entries"] == {} and look["leftovers"] == len(leftovers)
    remote.scan(str(dest), PRUNE, create=True)  # what the next sync runs first
    result = remote.apply(str(dest), PRUNE, io.BytesIO(full))
    assert result["mismatches"] == []
    assert sorted(os.listdir(dest)) == [".cpuaccel", "big.bin", "small.txt"]
    assert listing(dest) == source.entries


def test_node_scan_skips_a_virtualenv_so_delete_keeps_it(tmp_path: Path) -> None:
    dest = make_tree(
        tmp_path / "dest",
        {"a.py": "", "nodeenv/pyvenv.cfg": "", "nodeenv/lib/site.py": "", "old.py": ""},
    )
    src = make_tree(tmp_path / "src", {"a.py": ""})
    node = remote.scan(str(dest), PRUNE, create=False)["entries"]
    assert set(node) == {"a.py", "old.py"}
    assert plan(build([str(src)]), node) == ([], ["old.py"])


def test_node_scan_does_not_remove_temporary_files_in_flight(tmp_path: Path) -> None:
    """Another node of a shared filesystem may be writing them right now."""
    dest = make_tree(tmp_path / "dest", {"a.py": ""})
    in_flight = dest / f".b.py{remote.TMP_MARK}0123abcd"
    in_flight.write_text("half")
    scanned = remote.scan(str(dest), PRUNE, create=True)
    assert in_flight.exists()
    assert set(scanned["entries"]) == {"a.py"}
    assert scanned["leftovers"] == 1


def make_source(root: Path, folders: int = 3, files: int = 4) -> SourceManifest:
    for f in range(folders):
        here = root / "/".join(f"d{f}{depth}" for depth in range(3))
        here.mkdir(parents=True)
        for i in range(files):
            (here / f"f{i}.py").write_text(f"content {f} {i}\n" * (i + 1))
    (root / "top.txt").write_text("top")
    (root / "link").symlink_to("top.txt")
    return build([str(root)])


def delivered(source: SourceManifest, dest: Path) -> None:
    """What rsync -a leaves: the same tree, modes and times (its own copy, not ours)."""
    remote.scan(str(dest), PRUNE, create=True)
    shutil.copytree(source.roots[0], dest, symlinks=True, dirs_exist_ok=True)


def delivered_tree(tmp_path: Path, **shape: int) -> tuple[SourceManifest, Path]:
    """A source below TMP_PATH and its copy as rsync left it, in ``dst``."""
    source = make_source(tmp_path / "src", **shape)
    delivered(source, tmp_path / "dst")
    return source, tmp_path / "dst"


def apply(source: SourceManifest, dest: Path, trusted: bool = False) -> dict[str, Any]:
    rels = list(source.entries) if trusted else []
    header = receiver.request(source, [], tar=False, trusted=rels)
    return remote.apply(str(dest), PRUNE, io.BytesIO(header))


@pytest.fixture
def no_hang() -> Iterator[None]:
    """A check that blocks (opening a FIFO) fails instead of hanging the suite."""
    signal.signal(signal.SIGALRM, lambda *_: pytest.fail("the check blocked"))
    signal.alarm(5)
    yield
    signal.alarm(0)


@pytest.mark.parametrize("trusted", [False, True])
def test_a_delivered_tree_is_verified_and_its_hash_is_the_manifests(
    tmp_path: Path, trusted: bool
) -> None:
    source, dest = delivered_tree(tmp_path)
    result = apply(source, dest, trusted)
    assert result["mismatches"] == []
    assert result["tree_hash"] == result["hash"] == source.hash
    assert remote.scan(str(dest), PRUNE, create=False)["hash"] == source.hash


def test_content_that_differs_is_found_unless_rsync_vouched_for_it(tmp_path: Path) -> None:
    source, dest = delivered_tree(tmp_path)
    target = dest / "d00" / "d01" / "d02" / "f1.py"
    target.write_text(target.read_text().upper())  # the same size, other bytes
    assert apply(source, dest)["mismatches"] == ["d00/d01/d02/f1.py"]
    (dest / "top.txt").write_text("longer than before")  # rsync's word covers no size
    result = apply(source, dest, trusted=True)
    assert result["mismatches"] == ["top.txt"] and result["tree_hash"] is None


def test_leftovers_go_and_an_extra_file_is_in_the_trees_hash(tmp_path: Path) -> None:
    source, dest = delivered_tree(tmp_path)
    leftover = dest / "d10" / (".f0.py" + TMP_MARK + "0123456789abcdef")
    leftover.write_text("partial")
    (dest / remote.STATE / remote.RSYNC_TMP / "f0.py.abc123").write_text("rsync's partial")
    result = apply(source, dest, trusted=True)
    assert result["mismatches"] == [] and result["tree_hash"] == source.hash
    assert not leftover.exists() and not os.listdir(dest / remote.STATE / remote.RSYNC_TMP)
    (dest / "extra.txt").write_text("the node's own")
    result = apply(source, dest, trusted=True)
    assert result["mismatches"] == [] and result["tree_hash"] not in (None, source.hash)
    assert result["tree_hash"] == remote.scan(str(dest), PRUNE, create=False)["hash"]


def test_a_fifo_where_a_file_belongs_is_a_mismatch_never_read(
    tmp_path: Path, no_hang: None
) -> None:
    source, dest = delivered_tree(tmp_path)
    (dest / "top.txt").unlink()
    os.mkfifo(dest / "top.txt")  # opening it to read would wait for a writer
    assert apply(source, dest)["mismatches"] == ["top.txt"]


def test_the_check_opens_each_folder_once_not_each_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source, dest = delivered_tree(tmp_path, folders=4, files=10)
    folders = sum(entry[0] == "d" for entry in source.entries.values())
    opened: list[Any] = []
    real_open = os.open

    def counting(path: Any, *args: Any, **kwargs: Any) -> int:
        opened.append(path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", counting)
    assert apply(source, dest, trusted=True)["mismatches"] == []
    # one descriptor a folder (a path by path check took three a file: 120 here),
    # and a few for the state folder, the hash cache and the record
    assert len(opened) <= folders + 12, opened


def test_a_fifo_in_the_nodes_tree_is_described_never_read_and_replaced(
    tmp_path: Path, no_hang: None
) -> None:
    """The look's scan (and the controller's plan after it) meets a FIFO where the source
    has a file, and one the source does not have: both are described as what they are,
    without opening them, and the plan replaces the one and deletes the other."""
    source, dest = delivered_tree(tmp_path)
    (dest / "top.txt").unlink()
    os.mkfifo(dest / "top.txt")
    os.mkfifo(dest / "extra.fifo")
    entries = remote.scan(str(dest), PRUNE, create=False)["entries"]
    assert entries["top.txt"][0] == entries["extra.fifo"][0] == "-"
    changed, deleted = plan(source, entries)
    assert changed == ["top.txt"] and deleted == ["extra.fifo"]


def test_a_fifo_swapped_in_after_the_walk_is_taken_as_gone(tmp_path: Path, no_hang: None) -> None:
    """A file replaced by a FIFO between the walk's stat and the read: not waited on."""
    regular = tmp_path / "was-a-file"
    regular.write_text("x")
    st = os.lstat(regular)
    regular.unlink()
    os.mkfifo(regular)
    with pytest.raises(FileNotFoundError):
        remote.entry_of(str(regular), st)


def test_a_folder_the_sync_made_is_marked_until_verified_and_only_then(tmp_path: Path) -> None:
    """A destination the scan makes is marked (rsync may write there without --temp-dir,
    node/unfinished.py); one that was there is not; the verifying apply removes the mark."""
    made = remote.scan(str(tmp_path / "new"), PRUNE, create=True)
    state = tmp_path / "new" / remote.STATE
    assert made["created"] and (state / "unfinished").is_file()
    (tmp_path / "old").mkdir()
    assert not remote.scan(str(tmp_path / "old"), PRUNE, create=True)["created"]
    assert not (tmp_path / "old" / remote.STATE / "unfinished").exists()
    assert not remote.scan(str(tmp_path / "new"), PRUNE, create=True)["created"]  # once
    assert not remote.scan(str(tmp_path / "other"), PRUNE, create=False)["created"]  # a look
    source = make_source(tmp_path / "src")
    shutil.copytree(source.roots[0], tmp_path / "new", symlinks=True, dirs_exist_ok=True)
    assert apply(source, tmp_path / "new", trusted=True)["mismatches"] == []
    assert not (state / "unfinished").exists()


def test_a_cut_first_sync_leaves_no_rsync_file_and_nothing_else_goes(tmp_path: Path) -> None:
    """In a folder marked unfinished, files named as rsync names its temporary ones beside
    a manifest file go with the apply; any other extra file stays, and so does the same
    name in a folder that is not marked (rsync wrote there with --temp-dir)."""
    source = make_source(tmp_path / "src")
    rsyncs = [
        "d00/d01/d02/.f1.py.Ab12Cd",
        ".top.txt.zzzzzz",
        "d10/d11/d12/.f0.py.000000",
    ]
    theirs = [
        ".top.txt.zz",  # not six characters
        ".notes.txt.Ab12Cd",  # no notes.txt in the folder's manifest
        "d00/.f1.py.Ab12Cd",  # f1.py is not in d00
        ".link.Ab12Cd",  # a link, not a file, in the manifest
    ]
    for name, marked in (("cut", True), ("kept", False)):
        dest = tmp_path / name
        remote.scan(str(dest), PRUNE, create=True)
        if not marked:
            (dest / remote.STATE / "unfinished").unlink()
        shutil.copytree(source.roots[0], dest, symlinks=True, dirs_exist_ok=True)
        (dest / "d00" / ".f1.py.Ab12Cd").parent.mkdir(exist_ok=True)
        for rel in rsyncs + theirs:
            (dest / rel).write_text("partial")
        result = apply(source, dest, trusted=True)
        assert result["mismatches"] == []
        assert all((dest / rel).exists() != marked for rel in rsyncs)
        assert all((dest / rel).exists() for rel in theirs)
        assert not (dest / remote.STATE / "unfinished").exists()


def test_two_nodes_that_both_made_a_shared_folder_mark_it_once(tmp_path: Path) -> None:
    from cpuaccel.node import unfinished

    state = tmp_path / remote.STATE
    state.mkdir()
    unfinished.mark_made(str(state))
    unfinished.mark_made(str(state))  # the other node, which also found no folder
    assert unfinished.is_unfinished(str(state))
    (state / unfinished.MARK).unlink()
    (state / unfinished.MARK).symlink_to(tmp_path / "elsewhere")  # never taken for a mark
    assert not unfinished.is_unfinished(str(state))


def test_a_folder_of_many_folders_needs_no_more_descriptors_than_its_depth(
    tmp_path: Path,
) -> None:
    """The check's walk holds open only the folders on the way down: 600 subfolders of
    one folder pass under a limit of 256 open files (each held until its turn, they ran
    out of descriptors: EMFILE), and every descriptor it opened is closed."""
    import resource
    import subprocess
    import sys

    dest = tmp_path / "dest"
    for i in range(600):
        (dest / "shards" / f"s{i:03}").mkdir(parents=True)
        (dest / "shards" / f"s{i:03}" / "part.bin").write_bytes(b"x")
    script = f"""
import os, resource
resource.setrlimit(resource.RLIMIT_NOFILE, (256, {resource.getrlimit(resource.RLIMIT_NOFILE)[1]}))
from cpuaccel.node.nofollow import open_folder, sweep
before = sorted(os.listdir("/proc/self/fd"))
root = open_folder({str(dest)!r})
seen = []
sweep(root, "{TMP_MARK}", lambda rel: False, lambda fd, name, rel, st: seen.append(rel))
os.close(root)
assert sorted(os.listdir("/proc/self/fd")) == before
print(len(seen))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1201"]  # shards, its 600 folders and their files


LEFTOVER = ".model.bin" + TMP_MARK + "0123456789abcdef"


def _inode(where: Any) -> int:
    return os.fstat(where).st_ino if isinstance(where, int) else os.stat(where).st_ino


def test_a_folder_swapped_for_a_link_mid_clean_leads_nowhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dest, elsewhere = tmp_path / "dest", tmp_path / "elsewhere"
    (dest / "sub").mkdir(parents=True)
    elsewhere.mkdir()
    (dest / "sub" / LEFTOVER).write_text("partial")
    (elsewhere / LEFTOVER).write_text("someone else's file")
    sub = (dest / "sub").stat().st_ino
    real_scandir = os.scandir

    def scandir_then_swap(where: Any = ".") -> Iterator[os.DirEntry[str]]:
        listed = list(real_scandir(where))
        if _inode(where) == sub and not (dest / "sub").is_symlink():
            # Between the listing and the removal: sub moves away, a link takes its name.
            (dest / "sub").rename(dest / "moved")
            (dest / "sub").symlink_to(elsewhere)
        return iter(listed)

    monkeypatch.setattr(os, "scandir", scandir_then_swap)
    tree._clean(str(dest), set())
    assert (elsewhere / LEFTOVER).read_text() == "someone else's file"
    assert not (dest / "moved" / LEFTOVER).exists()  # the real folder's leftover went


def test_leftovers_go_and_links_venvs_and_state_stay(tmp_path: Path) -> None:
    dest, elsewhere = tmp_path / "dest", tmp_path / "elsewhere"
    for folder in (dest / "a" / "b", dest / "venv", dest / tree.STATE / tree.RSYNC_TMP):
        folder.mkdir(parents=True)
    elsewhere.mkdir()
    (elsewhere / LEFTOVER).write_text("keep")
    (dest / "link").symlink_to(elsewhere)
    (dest / "a" / "b" / LEFTOVER).write_text("partial")
    (dest / ("x" + TMP_MARK + "1")).symlink_to(elsewhere / LEFTOVER)  # a link: itself goes
    (dest / "venv" / "pyvenv.cfg").write_text("")
    (dest / "venv" / LEFTOVER).write_text("the venv's own")
    (dest / tree.STATE / tree.RSYNC_TMP / "partial").write_text("rsync's")
    (dest / "keep.txt").write_text("a file")
    tree._clean(str(dest), set())
    assert not (dest / "a" / "b" / LEFTOVER).exists()
    assert not os.path.lexists(dest / ("x" + TMP_MARK + "1"))
    assert (elsewhere / LEFTOVER).read_text() == "keep"
    assert (dest / "venv" / LEFTOVER).exists() and (dest / "keep.txt").exists()
    assert list((dest / tree.STATE / tree.RSYNC_TMP).iterdir()) == []
