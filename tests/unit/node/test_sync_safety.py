"""The sync receiver's safety on the node: where it may write (the node's verdict on the
resolved destination), never through a link, no setuid from a stream, a hash cache that
is plain data, and the one safe way node programs write a file."""

from __future__ import annotations

import io
import json
import os
import stat
import sys
from pathlib import Path

import pytest

from cpuaccel.node import common, destination
from cpuaccel.node import tree as remote
from cpuaccel.projectsync import receiver, transfer
from cpuaccel.projectsync.ignore import PRUNE_NAMES
from cpuaccel.projectsync.manifest import SourceManifest, build

PRUNE = set(PRUNE_NAMES)
HOMES = ["/home/alice"]
WORKDIR = "/home/alice/cpuaccel"


@pytest.mark.parametrize(
    ("dest", "words"),
    [
        ("/", "home folder"),  # "/" is above every home
        ("/data", "top-level"),
        ("/tmp", "top-level"),
        ("/usr", "top-level"),
        ("/usr/local", "system folder"),
        ("/etc/ssh", "system folder"),
        ("/var/lib", "system folder"),
        ("/lib64/x", "system folder"),
        ("/libx32/x", "system folder"),
        ("/srv/data", "system folder"),
        ("/root/x", "system folder"),
        ("/mnt/disk", "system folder"),
        ("/home/bob", "system folder"),
        ("/home", "home folder"),
        ("/home/alice", "home folder"),
        ("/home/alice/.ssh", "hidden folder .ssh"),
        ("/home/alice/cpuaccel", "workdir"),
        ("relative/x", "not an absolute"),
        ("/data/../etc/x", "not an absolute, resolved"),
    ],
)
def test_the_node_refuses_folders_a_sync_must_not_own(dest: str, words: str) -> None:
    why = destination.refusal(dest, HOMES, WORKDIR)
    assert why is not None and words in why, why


@pytest.mark.parametrize(
    "dest",
    [
        "/home/alice/cpuaccel/proj",
        "/home/alice/proj",
        "/home/alice/.cache/proj",  # hidden, but not directly in the home folder
        "/tmp/job",  # /tmp's first level: a scratch folder of its own
        "/usr/local/proj",
        "/srv/data/proj",
        "/data/proj",
        "/scratch/alice/job",
        "/library/x",  # lib* is top-level only
    ],
)
def test_the_node_accepts_a_folder_of_its_own(dest: str) -> None:
    assert destination.refusal(dest, HOMES, WORKDIR) is None


def test_resolve_expands_and_follows_links_before_judging(tmp_path: Path) -> None:
    home = os.path.realpath(os.path.expanduser("~"))
    assert destination.resolve("~", None) == (home, destination.resolve("~", None)[1])
    assert destination.resolve("~", None)[1] is not None
    assert destination.resolve("~/../../etc", None) == ("/etc", "it is a top-level folder")
    (tmp_path / "link").symlink_to("/usr/local")
    dest, why = destination.resolve(str(tmp_path / "link"), None)
    assert dest == "/usr/local" and why is not None and "system folder" in why
    work = tmp_path / "w" / "cpuaccel"
    dest, why = destination.resolve(str(work / ".."), str(work))
    assert dest == str(tmp_path / "w") and why is not None and "workdir" in why
    assert destination.resolve(str(work / "proj"), str(work)) == (str(work / "proj"), None)
    assert destination.resolve("../x", None)[1] == (
        "'../x' is not an absolute path (nor one below ~/)"
    )


def run_tree(mode: str, dest: str, *words: str) -> dict[str, object]:
    """The bundled node program, as a node runs it: ``tree`` for a look (srun's
    preflight), ``treesession`` for the modes that write (a sync's)."""
    import subprocess

    from cpuaccel.connectors import programs

    if mode == "look":
        argv = programs.argv(sys.executable, "tree", [mode, dest, *words])
        data = programs.node.program("tree")
    else:
        argv = programs.argv(sys.executable, "treesession", [dest, *words])
        request = json.dumps({"mode": mode, "length": 0}).encode() + b"\n"
        data = programs.node.program("treesession") + request
    done = subprocess.run(argv, input=data, capture_output=True, check=True, timeout=60)
    answer = json.loads(done.stdout)
    assert isinstance(answer, dict)
    return answer


def test_the_node_program_refuses_before_changing_anything(tmp_path: Path) -> None:
    work = tmp_path / "cpuaccel"
    (work / "runs").mkdir(parents=True)
    before = sorted(os.walk(tmp_path))
    for mode in ("scan", "look", "apply"):
        answer = run_tree(mode, str(work), f"--workdir={work}")
        assert answer == {"dest": str(work), "refused": answer["refused"]}
        assert "workdir" in str(answer["refused"])
    assert run_tree("scan", "~/../../usr/local")["refused"] == (
        "it is a system folder (/usr or a folder directly in it)"
    )
    assert sorted(os.walk(tmp_path)) == before
    assert "refused" not in run_tree("look", str(work / "proj"), f"--workdir={work}")


def make_source(root: Path) -> SourceManifest:
    (root / "data").mkdir(parents=True)
    (root / "data" / "file.txt").write_text("new")
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o4755)  # setuid on the controller: not on the node
    return build([str(root)])


def stream(source: SourceManifest, deleted: list[str] | None = None) -> io.BytesIO:
    header = receiver.request(source, deleted or [], tar=True)
    with transfer.tar_stream(source, sorted(source.entries), header) as s:
        return io.BytesIO(s.read())


def test_apply_replaces_a_link_where_a_folder_belongs_and_leaves_its_target(
    tmp_path: Path,
) -> None:
    source = make_source(tmp_path / "src")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o750)
    elsewhere.chmod(0o750)
    dest = tmp_path / "dst"
    remote.scan(str(dest), PRUNE, create=True)
    (dest / "data").symlink_to(elsewhere)
    result = remote.apply(str(dest), PRUNE, stream(source))
    assert result["mismatches"] == []
    assert os.listdir(elsewhere) == [] and stat.S_IMODE(elsewhere.stat().st_mode) == 0o750
    assert (dest / "data").is_dir() and not (dest / "data").is_symlink()
    assert (dest / "data" / "file.txt").read_text() == "new"
    assert stat.S_IMODE((dest / "run.sh").stat().st_mode) == 0o755  # no setuid from a stream


def test_a_file_behind_a_link_is_no_match_and_delete_never_follows_one(tmp_path: Path) -> None:
    source = make_source(tmp_path / "src")
    dest = tmp_path / "dst"
    remote.scan(str(dest), PRUNE, create=True)
    assert remote.apply(str(dest), PRUNE, stream(source))["mismatches"] == []
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "file.txt").write_text("new")
    (elsewhere / "keep").write_text("k")
    os.rename(dest / "data", tmp_path / "moved")
    (dest / "data").symlink_to(elsewhere)  # the same content, reached through a link
    header = receiver.request(source, ["data/keep"], tar=False)
    result = remote.apply(str(dest), PRUNE, io.BytesIO(header))
    assert "data/file.txt" in result["mismatches"]
    assert (elsewhere / "keep").exists()  # delete reached nothing behind the link


def test_the_state_folder_is_never_reached_through_a_link(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    dest = tmp_path / "dst"
    dest.mkdir()
    (dest / remote.STATE).symlink_to(elsewhere)
    remote.scan(str(dest), PRUNE, create=True)
    assert (dest / remote.STATE).is_dir() and not (dest / remote.STATE).is_symlink()
    assert os.listdir(elsewhere) == []


@pytest.mark.parametrize(
    "content",
    [b"\x00garbage", b"[1, 2]", b'{"x": 1}', b'{"/a": [1, 2]}', b"{" * 100000, b"\xff\xfe"],
)
def test_a_hash_cache_that_does_not_parse_is_ignored(tmp_path: Path, content: bytes) -> None:
    dest = tmp_path / "dst"
    (dest / "sub").mkdir(parents=True)
    (dest / "sub" / "a.txt").write_text("a")
    remote.scan(str(dest), PRUNE, create=True)
    cache = dest / remote.STATE / remote.CACHE
    assert json.loads(cache.read_text())  # plain data: JSON
    cache.write_bytes(content.replace(b"/a", str(dest / "sub" / "a.txt").encode()))
    scanned = remote.scan(str(dest), PRUNE, create=True)
    assert scanned["entries"]["sub/a.txt"][3] == remote.file_digest(str(dest / "sub" / "a.txt"))


def test_write_atomic_replaces_a_link_and_masks_the_mode(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_text("precious")
    target.chmod(0o600)
    link = tmp_path / "link"
    link.symlink_to(target)
    common.write_atomic(str(link), b"new", 0o4755)
    assert target.read_text() == "precious" and stat.S_IMODE(target.stat().st_mode) == 0o600
    assert not link.is_symlink() and link.read_text() == "new"
    assert stat.S_IMODE(link.stat().st_mode) == 0o755
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    common.write_atomic(str(dangling), b"x")
    assert not (tmp_path / "nowhere").exists() and dangling.read_text() == "x"
    assert not [n for n in os.listdir(tmp_path) if common.TMP_MARK in n]


def test_create_new_never_opens_an_existing_name_or_a_link(tmp_path: Path) -> None:
    (tmp_path / "there").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    for name in ("there", "link"):
        with pytest.raises(FileExistsError):
            common.create_new(str(tmp_path / name))
    assert not (tmp_path / "nowhere").exists()
    os.close(common.create_new(str(tmp_path / "new"), 0o6777))
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) & 0o7000 == 0
    names = {common.temp_name(str(tmp_path / "f")) for _ in range(100)}
    assert len(names) == 100


@pytest.mark.parametrize(
    "content",
    ['{"nodes": {"n": 1}, "manifests": {}}', '{"nodes": {"n": {"hash": 5}}}', "[", "{}", "7"],
)
def test_a_sync_memory_that_does_not_parse_is_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: str
) -> None:
    from cpuaccel.projectsync.memory import SyncMemory

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    memory = SyncMemory(["/src"], "/dest")
    memory.path.parent.mkdir(parents=True)
    memory.path.write_text(content)
    again = SyncMemory(["/src"], "/dest")
    assert again.last("n") is None
    again.confirm("n", "h", "fsid", {"a": ("d", 0o755)})
    again.save()
    assert SyncMemory(["/src"], "/dest").last("n") == ("h", "fsid", {"a": ("d", 0o755)})
    assert os.listdir(memory.path.parent) == [memory.path.name]  # no temporary file left


def test_a_state_folder_that_is_a_link_gives_no_filesystem_id(tmp_path: Path) -> None:
    """The controller skips the scan (which makes the state folder real) when a node's look
    reports an id: a link there must not report one, or rsync would write through it."""
    other = tmp_path / "other"
    remote.scan(str(other), PRUNE, create=True)
    dest = tmp_path / "dst"
    dest.mkdir()
    (dest / remote.STATE).symlink_to(other / remote.STATE)
    assert remote.scan(str(dest), PRUNE, create=False)["fsid"] is None
    assert remote.scan(str(dest), PRUNE, create=True)["fsid"] not in (None, "")
    assert not (dest / remote.STATE).is_symlink()
