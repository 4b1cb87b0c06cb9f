"""The sync engine on local hosts (sync/engine.py): a sync, then nothing to do; rsync
without a temp folder only where the sync made the folder, given its entries as
arguments or on stdin; a shared destination written once."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from cpuaccel.connectors.connect_options import ConnectOptions
from cpuaccel.executor import Status
from cpuaccel.inventory.host import Host
from cpuaccel.node import tree as remote
from cpuaccel.projectsync import engine, transfer
from cpuaccel.projectsync.engine import SyncOptions
from cpuaccel.projectsync.manifest import build
from cpuaccel.projectsync.node_result import NodeReport
from tests.unit.projectsync.trees import make_tree

pytestmark = pytest.mark.usefixtures("private_hash_cache")


def local_host(name: str, workdir: Path, **vars: Any) -> Host:
    return Host(
        name,
        {
            "ansible_connection": "local",
            "cpuaccel_workdir": str(workdir),
            "cpuaccel_python": sys.executable,
            **vars,
        },
    )


def test_engine_syncs_then_has_nothing_to_do(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src", {"a.py": "a", "pkg/b.py": "b"})
    hosts = [local_host("one", tmp_path / "w1"), local_host("two", tmp_path / "w2")]
    options = SyncOptions("{{ cpuaccel_workdir }}/proj")

    def run(opts: SyncOptions = options) -> dict[str, NodeReport]:
        results = engine.sync(hosts, build([str(src)]), opts, forks=2, connect=ConnectOptions())
        assert all(r.status is Status.OK for r in results), [r.error for r in results]
        return {r.host.name: r.value for r in results if r.value is not None}

    first = run()
    for report in first.values():
        assert report.changed == ["a.py", "pkg", "pkg/b.py"] and report.in_sync
        assert report.method == "tar" and report.bytes == 2
    assert {r.dest for r in first.values()} == {
        str(tmp_path / "w1" / "proj"),
        str(tmp_path / "w2" / "proj"),
    }
    again = run()
    assert all(r.changed == [] and r.method == "none" and r.in_sync for r in again.values())
    (src / "pkg" / "b.py").write_text("bb")
    check = run(SyncOptions("{{ cpuaccel_workdir }}/proj", check=True))
    assert all(r.changed == ["pkg/b.py"] and not r.in_sync for r in check.values())
    assert (tmp_path / "w1" / "proj" / "pkg" / "b.py").read_text() == "b"


def test_a_small_change_is_packed_once_for_every_node_that_holds_the_same_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = make_tree(tmp_path / "src", {"a.py": "a", "pkg/b.py": "b"})
    hosts = [local_host(f"n{i}", tmp_path / f"w{i}") for i in range(3)]
    options = SyncOptions("{{ cpuaccel_workdir }}/proj")

    def run() -> list[NodeReport]:
        results = engine.sync(hosts, build([str(src)]), options, forks=3, connect=ConnectOptions())
        assert all(r.status is Status.OK for r in results), [r.error for r in results]
        return [r.value for r in results if r.value is not None]

    run()
    packed: list[Sequence[str]] = []
    real_tar = transfer.tar_stream

    def counted(source: Any, changed: Sequence[str], header: bytes) -> Any:
        packed.append(list(changed))
        return real_tar(source, changed, header)

    monkeypatch.setattr(transfer, "tar_stream", counted)
    (src / "pkg" / "b.py").write_text("bb")
    reports = run()
    assert [(r.changed, r.method, r.in_sync) for r in reports] == [(["pkg/b.py"], "tar", True)] * 3
    assert packed == [["pkg/b.py"]]  # one tar, sent to the three nodes
    for i in range(3):
        assert (tmp_path / f"w{i}" / "proj" / "pkg" / "b.py").read_text() == "bb"


def test_rsync_writes_without_a_temp_folder_only_where_the_sync_made_the_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """node/unfinished.py: a first sync to a folder it makes skips rsync's --temp-dir
    (its ~12 more system calls a file); a sync to a folder that was there keeps it."""
    from cpuaccel.connectors.local import LocalConnector

    flags: list[list[str]] = []
    real = LocalConnector.rsync

    def recorded(self: LocalConnector, given: Sequence[str], *args: Any, **kw: Any) -> Any:
        flags.append(list(given))
        return real(self, given, *args, **kw)

    monkeypatch.setattr(LocalConnector, "rsync", recorded)
    big = os.urandom(transfer.RSYNC_MIN_BYTES + 1)
    src = make_tree(tmp_path / "src", {"data.bin": big, "a.py": "a"})
    hosts = [local_host("one", tmp_path / "w1")]
    (tmp_path / "w1" / "there").mkdir(parents=True)
    for dest, temp in (("proj", False), ("there", True)):
        results = engine.sync(
            hosts, build([str(src)]), SyncOptions(f"{{{{ cpuaccel_workdir }}}}/{dest}"), forks=1,
            connect=ConnectOptions(),
        )  # fmt: skip
        assert results[0].value is not None and results[0].value.method == "rsync"
        assert results[0].value.in_sync
        assert any(f.startswith("--temp-dir=") for f in flags[-1]) is temp
        assert not (tmp_path / "w1" / dest / remote.STATE / "unfinished").exists()
    (src / "data.bin").write_bytes(big[::-1])
    # The same size, written within the same second: rsync's own quick check (size and
    # mtime) would skip it, and the node would keep the old bytes under the new digest.
    again = engine.sync(hosts, build([str(src)]), SyncOptions("{{ cpuaccel_workdir }}/proj"),
                        forks=1, connect=ConnectOptions())  # fmt: skip
    assert again[0].value is not None and again[0].value.in_sync
    assert any(f.startswith("--temp-dir=") for f in flags[-1])  # made by an earlier sync
    assert (tmp_path / "w1" / "proj" / "data.bin").read_bytes() == big[::-1]


@pytest.mark.parametrize("named", [True, False])
def test_rsync_gets_the_entries_as_arguments_or_past_their_room_on_stdin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, named: bool
) -> None:
    """Named as rsync's arguments (ROOT/./REL: no --files-from list read one byte a
    system call), the entries land as the list landed them: names rsync could read as
    a pattern, an option or HOST:PATH taken literally, nothing unlisted sent (a name
    like ``[ab]`` or ``*`` globbed would send the excluded ``a``, a listed folder
    recursed into its excluded ``secret``)."""
    from cpuaccel.connectors.local import LocalConnector

    calls: list[tuple[list[str], Any, Any]] = []
    real = LocalConnector.rsync

    def recorded(
        self: LocalConnector, flags: Sequence[str], source: Any, *a: Any, **kw: Any
    ) -> Any:
        calls.append((list(flags), source, kw.get("stdin")))
        return real(self, flags, source, *a, **kw)

    monkeypatch.setattr(LocalConnector, "rsync", recorded)
    if not named:  # no room on the command line: the list goes on stdin
        monkeypatch.setattr(transfer, "ARGV_SHARE", 1 << 40)
    files: dict[str, str | bytes] = {"data.bin": os.urandom(transfer.RSYNC_MIN_BYTES + 1)}
    names = ("[ab]", "*", "-x", "a:b", "we ird/h", "a", "sub/deep/f", "sub/deep/secret")
    files |= {name: name for name in names}
    src = make_tree(tmp_path / "src", files)
    (src / "link").symlink_to("sub/deep/f")
    source = build([str(src)], excludes=["/a", "secret"])  # a listed folder's, unlisted
    results = engine.sync([local_host("one", tmp_path / "w")], source,
                          SyncOptions("{{ cpuaccel_workdir }}/proj"), forks=1,
                          connect=ConnectOptions())  # fmt: skip
    assert results[0].value is not None and results[0].value.method == "rsync"
    assert results[0].value.in_sync
    flags, given, stdin = calls[-1]
    if named:
        assert stdin is None and "--files-from=-" not in flags
        assert sorted(given) == sorted(f"{src}/./{rel}" for rel in source.entries)
    else:
        assert isinstance(given, str) and "--files-from=-" in flags and stdin is not None
    dest = tmp_path / "w" / "proj"
    landed = {p.relative_to(dest).as_posix() for p in dest.rglob("*")} - {remote.STATE}
    assert {rel for rel in landed if not rel.startswith(remote.STATE + "/")} == set(source.entries)
    assert "a" not in landed and "sub/deep/secret" not in landed
    assert (dest / "[ab]").read_text() == "[ab]"
    assert os.readlink(dest / "link") == "sub/deep/f"


def test_engine_writes_a_shared_destination_once(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src", {"a.py": "a"})
    hosts = [local_host(f"n{i}", tmp_path / "w") for i in range(3)]
    results = engine.sync(
        hosts,
        build([str(src)]),
        SyncOptions("{{ cpuaccel_workdir }}/proj"),
        forks=3,
        connect=ConnectOptions(),
    )
    reports = {r.host.name: r.value for r in results if r.value is not None}
    assert len(reports) == 3 and all(r.in_sync for r in reports.values())
    writers = [name for name, r in reports.items() if r.shared_with is None]
    assert len(writers) == 1 and reports[writers[0]].changed == ["a.py"]
    followers = [r for name, r in reports.items() if name != writers[0]]
    assert [(r.shared_with, r.changed) for r in followers] == [(writers[0], [])] * 2
