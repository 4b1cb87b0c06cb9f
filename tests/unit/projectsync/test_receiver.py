"""The sync receiver kept open (cpuaccel.node.treesession, sync.receiver.NodeSession):
look and apply on one interpreter, an apply to the tree just looked at without walking it
twice, and the whole scan whenever the tree is not as looked."""

from __future__ import annotations

import io
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from cpuaccel.connectors.connect_options import ConnectOptions
from cpuaccel.connectors.local import LocalConnector
from cpuaccel.errors import HostError
from cpuaccel.inventory.host import Host
from cpuaccel.node import tree, treesession
from cpuaccel.projectsync import transfer
from cpuaccel.projectsync.ignore import PRUNE_NAMES
from cpuaccel.projectsync.location import DestinationRefused
from cpuaccel.projectsync.manifest import SourceManifest, build, plan
from cpuaccel.projectsync.receiver import NodeSession

OPTIONS = ["--workdir=/nonexistent/cpuaccel", *PRUNE_NAMES]


def _request(mode: str, payload: bytes = b"", expect: str | None = None) -> bytes:
    line = {"mode": mode, "expect": expect, "length": len(payload)}
    return json.dumps(line).encode() + b"\n" + payload


def _serve(dest: Path, *requests: bytes) -> list[dict[str, Any]]:
    out = io.StringIO()
    treesession.serve(str(dest), OPTIONS, io.BytesIO(b"".join(requests)), out)
    return [json.loads(line) for line in out.getvalue().splitlines()]


def _change(source: SourceManifest, before: dict[str, Any], base: str, fsid: str) -> bytes:
    """The one-trip apply the controller sends (engine.Syncer._one_trip)."""
    changed, deleted = plan(source, before)
    header = {"base": base, "fsid": fsid, "target": source.hash, "delete": deleted}
    header["tar"] = bool(changed)
    with transfer.tar_stream(source, changed, json.dumps(header).encode() + b"\n") as stream:
        return stream.read()


@pytest.fixture
def synced(tmp_path: Path) -> tuple[Path, Path, dict[str, Any]]:
    """A source and a node copy of it (through the session), and the node's look."""
    src, dest = tmp_path / "src", tmp_path / "dest"
    (src / "pkg" / "old").mkdir(parents=True)
    (src / "train.py").write_text("print(1)\n")
    (src / "pkg" / "a.py").write_text("a = 1\n")
    (src / "pkg" / "old" / "b.py").write_text("b = 1\n")
    source = build([str(src)])
    header = {"manifest": source.entries, "delete": [], "tar": True, "trusted": []}
    first = transfer.tar_stream(source, list(source.entries), json.dumps(header).encode() + b"\n")
    with first:
        scanned, applied = _serve(dest, _request("scan"), _request("apply", first.read()))
    assert applied["mismatches"] == [] and applied["tree_hash"] == source.hash
    return src, dest, {**scanned, "fsid": applied["fsid"], "entries": source.entries}


def test_an_apply_after_the_look_rewalks_stats_only_and_restats_what_it_wrote(
    synced: tuple[Path, Path, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    src, dest, node = synced
    before = build([str(src)])
    (src / "train.py").write_text("print(2)\n")
    (src / "pkg" / "new").mkdir()
    (src / "pkg" / "new" / "c.py").write_text("c = 1\n")
    source = build([str(src)])
    change = _change(source, before.entries, before.hash, node["fsid"])
    scans: list[bool] = []
    real_scan = tree.scan

    def counted(*args: Any, **kw: Any) -> Any:
        scans.append(True)
        return real_scan(*args, **kw)

    loads: list[str] = []
    real_load = tree._load_cache

    def loaded(state: str) -> dict[str, Any]:
        loads.append(state)
        return real_load(state)

    monkeypatch.setattr(tree, "scan", counted)
    monkeypatch.setattr(treesession, "scan", counted)
    monkeypatch.setattr(tree, "_load_cache", loaded)
    looked, applied = _serve(dest, _request("look", expect=before.hash), _request("apply", change))
    assert looked["hash"] == before.hash and looked["entries"] is None
    assert applied == {"hash": source.hash, "mismatches": [], "written": 15, "fsid": node["fsid"]}
    assert len(scans) == 1  # the look's walk only: no scan before nor after the apply
    assert len(loads) == 1  # the hash cache read by the look only, the apply keeps it
    cached = json.loads((dest / ".cpuaccel" / "hashcache.json").read_text())
    assert cached[str(dest / "pkg" / "new" / "c.py")][4] == source.entries["pkg/new/c.py"][3]
    assert cached[str(dest / "train.py")][4] == source.entries["train.py"][3]
    assert (dest / "pkg" / "new" / "c.py").read_text() == "c = 1\n"
    assert (dest / ".cpuaccel" / "manifest").read_text().strip() == source.hash
    assert tree.scan(str(dest), set(PRUNE_NAMES), create=False)["hash"] == source.hash


def test_a_tree_changed_between_look_and_apply_is_scanned_and_left_unchanged(
    synced: tuple[Path, Path, dict[str, Any]],
) -> None:
    src, dest, node = synced
    before = build([str(src)])
    (src / "train.py").write_text("print(2)\n")
    change = _change(build([str(src)]), before.entries, before.hash, node["fsid"])
    out = io.StringIO()
    stdin = io.BytesIO(_request("look", expect=before.hash))
    treesession.serve(str(dest), OPTIONS, stdin, out)  # the look, then someone writes
    (dest / "pkg" / "a.py").write_text("a = 'edited on the node'\n")
    # a fresh interpreter has no look: the same path as a changed tree's
    (applied,) = _serve(dest, _request("apply", change))
    assert applied["base_mismatch"] and "pkg/a.py" in applied["scan"]["entries"]
    assert (dest / "train.py").read_text() == "print(1)\n"  # nothing written
    # and in one session: the re-walk sees the edit
    (dest / "pkg" / "a.py").write_text("a = 1\n")
    looked_hash = tree.scan(str(dest), set(PRUNE_NAMES), create=False)["hash"]
    assert looked_hash == before.hash
    requests = io.BytesIO(_request("look", expect=before.hash) + _request("apply", change))
    out = io.StringIO()

    class EditAfterLook(io.BytesIO):
        lines = 0

        def readline(self, size: int | None = -1) -> bytes:
            self.lines += 1
            if self.lines == 2:  # the apply's request line: the look is done
                (dest / "pkg" / "a.py").write_text("a = 'edited meanwhile'\n")
            return super().readline(size)

    treesession.serve(str(dest), OPTIONS, EditAfterLook(requests.getvalue()), out)
    applied = json.loads(out.getvalue().splitlines()[1])
    assert applied.get("base_mismatch") is None or applied["base_mismatch"]
    assert applied["base_mismatch"] and (dest / "train.py").read_text() == "print(1)\n"


def test_a_deleted_folder_falls_back_to_the_whole_scan(
    synced: tuple[Path, Path, dict[str, Any]],
) -> None:
    src, dest, node = synced
    before = build([str(src)])
    for name in ("b.py",):
        (src / "pkg" / "old" / name).unlink()
    (src / "pkg" / "old").rmdir()
    source = build([str(src)])
    change = _change(source, before.entries, before.hash, node["fsid"])
    _, applied = _serve(dest, _request("look", expect=before.hash), _request("apply", change))
    assert applied["hash"] == source.hash and applied["mismatches"] == []
    assert not (dest / "pkg" / "old").exists()


def _conn(tmp_path: Path) -> LocalConnector:
    vars_ = {"cpuaccel_python": sys.executable, "cpuaccel_workdir": str(tmp_path / "work")}
    return LocalConnector(Host("box", vars_), ConnectOptions())


def test_one_interpreter_answers_look_then_scan_and_refuses_before_writing(
    tmp_path: Path,
) -> None:
    conn = _conn(tmp_path)
    session = NodeSession(conn, str(tmp_path / "proj"))
    looked = session.request("look")
    assert looked["fsid"] is None and not (tmp_path / "proj").exists()
    scanned = session.request("scan")
    assert scanned["fsid"] and (tmp_path / "proj" / ".cpuaccel").is_dir()
    session.close()
    session.wait(time.monotonic() + 10)
    refused = NodeSession(conn, str(tmp_path / "work" / ".."))
    with pytest.raises(DestinationRefused):
        refused.request("look")
    with pytest.raises(DestinationRefused):
        refused.request("scan")
    refused.close()
    assert not (tmp_path / "work").exists()


def test_a_last_request_ends_the_program_with_its_answer_and_a_later_one_starts_another(
    tmp_path: Path,
) -> None:
    """``last``: the program's input ends with the request, so that it ends right after
    answering, with no close; a request after it (the long way) gets a program of its
    own."""
    session = NodeSession(_conn(tmp_path), str(tmp_path / "proj"))
    first = session.start()
    assert session.request("look", last=True)["fsid"] is None
    assert first.alive  # never closed by the controller, and yet it ends
    assert first._process.wait(10) == 0
    scanned = session.request("scan")
    assert scanned["fsid"] and session.start() is not first
    session.close()
    session.wait(time.monotonic() + 10)


def test_a_receiver_that_dies_is_one_host_error(tmp_path: Path) -> None:
    session = NodeSession(_conn(tmp_path), str(tmp_path / "proj"))
    session.request("look")
    with pytest.raises(HostError, match=r"syncing to .*failed on the node"):
        session.request("bogus")  # the node program refuses a request it does not know
    with pytest.raises(HostError):  # and a request to the ended program says so too
        session.request("look", b"x" * (1 << 20))


def test_a_receiver_whose_controller_vanished_ends_within_its_bound(tmp_path: Path) -> None:
    """No request comes and the input stays open (a controller gone without closing its
    connection): the receiver ends by SIGALRM after its bound, having written nothing."""
    import signal
    import subprocess

    dest = tmp_path / "proj"
    code = (
        "import sys; from cpuaccel.node import treesession; "
        f"treesession.serve({str(dest)!r}, sys.argv[1:], sys.stdin.buffer, sys.stdout, 1)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, *OPTIONS], stdin=subprocess.PIPE)
    try:
        assert proc.wait(timeout=20) == -signal.SIGALRM
    finally:
        proc.kill()
        assert proc.stdin is not None
        proc.stdin.close()
    assert not dest.exists()


def test_hashing_left_to_finish_gives_the_same_manifest_and_never_caches_a_blank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sync's CLI walks first (every refusal) and the engine hashes after starting the
    nodes' connections: the same entries and hash as one build, and the hash cache
    saved only with real digests."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "train.py").write_text("print(1)\n")
    (src / "pkg" / "a.py").write_text("a = 1\n")
    whole = build([str(src)])
    later = build([str(src)], defer_hashing=True)
    assert sorted(rel for rel, _ in later.pending) == ["pkg/a.py", "train.py"]
    assert later.hash == "" and later.entries["train.py"][3] == ""
    later.save_cache()  # finishes first: no blank digest is ever kept
    assert later.pending == [] and later.entries == whole.entries and later.hash == whole.hash
    cached = build([str(src)], defer_hashing=True)  # the cache now knows both files
    assert cached.pending == [] and cached.entries == whole.entries
    cached.finish()
    assert cached.hash == whole.hash


def test_a_receiver_started_early_waits_for_its_first_request(tmp_path: Path) -> None:
    """start() returns at once; the program changes nothing until asked, and an EOF
    (close) ends it having created nothing."""
    session = NodeSession(_conn(tmp_path), str(tmp_path / "proj"))
    kept = session.start()
    assert session.start() is kept  # started once
    assert session.request("look")["fsid"] is None and session.start() is kept
    quiet = NodeSession(_conn(tmp_path), str(tmp_path / "other"))
    quiet.start()
    quiet.close()
    quiet.wait(time.monotonic() + 10)
    assert not (tmp_path / "other").exists()
    session.close()
    session.wait(time.monotonic() + 10)


def test_a_file_removed_between_the_walk_and_its_hashing_is_described_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("print(1)\n")
    (src / "swap.tmp").write_text("x")
    later = build([str(src)], defer_hashing=True)
    (src / "swap.tmp").unlink()  # an editor's file, gone since the walk
    later.finish()
    assert sorted(later.entries) == ["train.py"] and later.pending == []
    assert later.hash == build([str(src)]).hash
