"""`cpuaccel sync` without nodes: ignore rules, the manifest, planning, destinations,
the node program run in-process, and the CLI's answers to bad input."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from cpuaccel.connectors.connect_options import ConnectOptions
from cpuaccel.errors import EXIT_USAGE, UsageError
from cpuaccel.executor import Status
from cpuaccel.inventory.host import Host
from cpuaccel.node import tree as remote
from cpuaccel.sync import engine, receiver, transfer
from cpuaccel.sync.engine import SyncOptions
from cpuaccel.sync.ignore import PRUNE_NAMES
from cpuaccel.sync.location import render_dest
from cpuaccel.sync.manifest import SourceManifest, build, plan
from cpuaccel.sync.node_result import NodeReport
from cpuaccel.testing.command import cpuaccel, inherited_env

PRUNE = set(PRUNE_NAMES)


@pytest.fixture(autouse=True)
def _private_hash_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the controller's hash cache out of the real ~/.cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


def make_tree(root: Path, files: Mapping[str, str | bytes]) -> Path:
    """Files (with parent folders) below root; a key ending in '/' is an empty folder."""
    root.mkdir(parents=True, exist_ok=True)
    for rel, content in files.items():
        path = root / rel
        if rel.endswith("/"):
            path.mkdir(parents=True, exist_ok=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    return root


def with_parents(paths: set[str]) -> set[str]:
    """The paths plus every folder above them, as manifest entries list them."""
    out = set(paths)
    for rel in paths:
        parts = rel.split("/")
        out |= {"/".join(parts[:i]) for i in range(1, len(parts))}
    return out


# ---------------------------------------------------------------- ignore rules

IGNORE_CASES: list[tuple[str, dict[str, str], set[str], set[str]]] = [
    (
        "gitignore with negation",
        {".gitignore": "*.log\n!keep.log\n", "a.log": "", "keep.log": "", "x.py": ""},
        {".gitignore", "keep.log", "x.py"},
        {"a.log"},
    ),
    (
        "negation cannot re-include below an ignored folder (as git)",
        {".gitignore": "build/\n!build/x.txt\n", "build/x.txt": "", "src/build.py": ""},
        {".gitignore", "src/build.py"},
        {"build", "build/x.txt"},
    ),
    (
        "anchored pattern matches at its own level only",
        {".gitignore": "/top.txt\n", "top.txt": "", "sub/top.txt": ""},
        {".gitignore", "sub/top.txt"},
        {"top.txt"},
    ),
    (
        "nested gitignore: deeper negation overrides, its patterns apply below it only",
        {
            ".gitignore": "*.log\n",
            "sub/.gitignore": "!*.log\ndata/\n",
            "a.log": "",
            "sub/b.log": "",
            "sub/deeper/c.log": "",
            "sub/data/x": "",
            "data/y": "",
        },
        {".gitignore", "sub/.gitignore", "sub/b.log", "sub/deeper/c.log", "data/y"},
        {"a.log", "sub/data", "sub/data/x"},
    ),
    (
        ".cpuaccelignore",
        {
            ".cpuaccelignore": "secret.txt\n*.ckpt\n",
            "secret.txt": "",
            "sub/secret.txt": "",
            "m.ckpt": "",
            "train.py": "",
        },
        {".cpuaccelignore", "train.py", "sub"},
        {"secret.txt", "sub/secret.txt", "m.ckpt"},
    ),
    (
        "defaults: VCS data, bytecode, runs, cpuaccel state, usual venv names",
        {
            ".git/HEAD": "",
            ".git/objects/ab/cd": "",
            "pkg/__pycache__/m.cpython-311.pyc": "",
            "pkg/old.pyc": "",
            "pkg/m.py": "",
            "runs/r1/out.txt": "",
            "sub/runs/out.txt": "",
            ".cpuaccel/manifest": "",
            ".venv/bin/python": "",
            "venv/lib/x.py": "",
            "runs.py": "",
        },
        {"pkg/m.py", "runs.py", "sub"},
        {
            ".git",
            "pkg/__pycache__",
            "pkg/old.pyc",
            "runs",
            "sub/runs",
            ".cpuaccel",
            ".venv",
            "venv",
        },
    ),
    (
        "a virtualenv is found by its pyvenv.cfg, whatever its name",
        {
            "myenv/pyvenv.cfg": "home = /usr/bin\n",
            "myenv/lib/site.py": "",
            "tools/cfg": "",
            "tools/pyvenv.txt": "",
        },
        {"tools/cfg", "tools/pyvenv.txt"},
        {"myenv", "myenv/pyvenv.cfg", "myenv/lib/site.py"},
    ),
]


@pytest.mark.parametrize(
    ("files", "kept", "left_out"),
    [pytest.param(files, kept, out, id=name) for name, files, kept, out in IGNORE_CASES],
)
def test_ignore_rules(
    tmp_path: Path, files: dict[str, str], kept: set[str], left_out: set[str]
) -> None:
    src = make_tree(tmp_path / "src", files)
    entries = set(build([str(src)]).entries)
    assert with_parents(kept) <= entries
    assert not entries & left_out
    # Everything given is either kept or under something left out: nothing else leaked.
    assert entries == with_parents(kept)


@pytest.mark.parametrize(
    ("excludes", "left_out"),
    [
        (["data/*.bin"], {"data/a.bin"}),
        (["*.bin"], {"data/a.bin", "b.bin"}),
        (["data/"], {"data", "data/a.bin", "data/readme"}),
    ],
)
def test_exclude_option_uses_gitignore_syntax(
    tmp_path: Path, excludes: list[str], left_out: set[str]
) -> None:
    src = make_tree(tmp_path / "src", {"data/a.bin": "", "data/readme": "", "b.bin": ""})
    everything = {"data", "data/a.bin", "data/readme", "b.bin"}
    assert set(build([str(src)], excludes=excludes).entries) == everything - left_out


@pytest.mark.parametrize(
    ("rel", "is_dir", "ignored"),
    [
        ("runs/run-3/checkpoint.pt", False, True),
        ("sub/runs", True, True),
        ("a.log", False, True),
        ("keep.log", False, False),
        ("sub/b.log", False, False),  # sub/.gitignore re-includes *.log
        ("sub/data/x", False, True),
        ("other/data/x", False, False),  # sub's rule does not reach other/
        ("stale.py", False, False),
        ("pkg/__pycache__/m.pyc", False, True),
        (".git/config", False, True),
    ],
)
def test_node_paths_under_the_source_rules(
    tmp_path: Path, rel: str, is_dir: bool, ignored: bool
) -> None:
    src = make_tree(
        tmp_path / "src",
        {".gitignore": "*.log\n!keep.log\n", "sub/.gitignore": "!*.log\ndata/\n", "x.py": ""},
    )
    assert build([str(src)]).ignored_on_node(rel, is_dir) is ignored


# ---------------------------------------------------------------- the manifest


def test_manifest_keeps_modes_and_links_inside_the_tree(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src", {"run.sh": "#!/bin/sh\n", "cfg/a.yaml": "a: 1\n"})
    (src / "run.sh").chmod(0o755)
    (src / "latest").symlink_to("cfg/a.yaml")
    (src / "cfgdir").symlink_to("cfg")
    entries = build([str(src)]).entries
    assert entries["run.sh"][:3] == ("f", 0o755, 10)
    assert entries["latest"] == ("l", "cfg/a.yaml")
    assert entries["cfgdir"] == ("l", "cfg")
    assert entries["cfg"][0] == "d"
    assert "cfgdir/a.yaml" not in entries  # a link to a folder is a link, not walked


def test_manifest_hash_follows_content_and_mode_only(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src", {"a.py": "x = 1\n"})
    first = build([str(src)]).hash
    os.utime(src / "a.py", (1, 1))
    assert build([str(src)]).hash == first  # a touch is not a change
    (src / "a.py").chmod(0o700)
    second = build([str(src)]).hash
    assert second != first
    (src / "a.py").write_text("x = 2\n")
    assert build([str(src)]).hash not in (first, second)


def test_several_sources_land_under_their_own_names(tmp_path: Path) -> None:
    make_tree(tmp_path, {"src/a.py": "", "configs/c.yaml": "", "solo.txt": ""})
    entries = build([str(tmp_path / "src"), str(tmp_path / "configs"), str(tmp_path / "solo.txt")])
    assert set(entries.entries) == {"src", "src/a.py", "configs", "configs/c.yaml", "solo.txt"}


def test_symlink_outside_the_tree_is_refused_unless_copy_links(tmp_path: Path) -> None:
    (tmp_path / "outside.txt").write_text("shared data\n")
    src = make_tree(tmp_path / "src", {"a.py": ""})
    (src / "data").symlink_to(tmp_path / "outside.txt")
    with pytest.raises(UsageError) as refused:
        build([str(src)])
    assert "symlink points outside the synced tree" in refused.value.message
    assert str(src / "data") in refused.value.message
    assert refused.value.hint is not None and "--copy-links" in refused.value.hint
    copied = build([str(src)], copy_links=True).entries["data"]
    want = build([str(tmp_path / "outside.txt")]).entries["outside.txt"]
    assert copied[0] == "f" and copied == want  # what the link points to, as a file


def test_broken_link_outside_with_copy_links_is_refused(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src", {"a.py": ""})
    (src / "gone").symlink_to(tmp_path / "nowhere")
    with pytest.raises(UsageError, match="symlink is broken"):
        build([str(src)], copy_links=True)


@pytest.mark.parametrize(
    ("make", "sources", "words"),
    [
        (lambda p: None, ["missing"], ["missing: no such file or folder"]),
        (lambda p: None, [], ["nothing to sync"]),
        (
            lambda p: make_tree(p / "src", {"bad\nname.py": ""}),
            ["src"],
            ["newline", "bad\\nname.py"],
        ),
        (
            lambda p: make_tree(p / "src", {"sub/bad\rname": ""}),
            ["src"],
            ["newline"],
        ),
        (
            lambda p: make_tree(p, {"a/x/f": "", "b/x/g": ""}),
            ["a/x", "b/x"],
            ["would both land at x/"],
        ),
    ],
    ids=["missing source", "no source", "newline in a name", "carriage return", "same name"],
)
def test_manifest_errors_are_clear(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    make: Any,
    sources: list[str],
    words: list[str],
) -> None:
    make(tmp_path)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError) as err:
        build(sources)
    for word in words:
        assert word in err.value.message
    assert err.value.hint


def test_an_ignored_file_with_a_newline_is_no_error(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src", {"bad\nname.tmp": "", "a.py": "", ".gitignore": "*.tmp\n"})
    assert set(build([str(src)]).entries) == {"a.py", ".gitignore"}


# ---------------------------------------------------------------- planning

F1 = ("f", 0o644, 1, "1" * 64)
F2 = ("f", 0o644, 1, "2" * 64)
X1 = ("f", 0o755, 1, "1" * 64)
D = ("d", 0o755)
L = ("l", "a.py")


def manifest(entries: dict[str, tuple[Any, ...]]) -> SourceManifest:
    return SourceManifest(entries=dict(entries))


PLAN_CASES = [
    ("identical", {"a.py": F1, "d": D}, {"a.py": F1, "d": D}, [], []),
    ("missing on the node", {"a.py": F1, "d": D, "d/b": F2}, {"a.py": F1}, ["d", "d/b"], []),
    ("content differs", {"a.py": F1}, {"a.py": F2}, ["a.py"], []),
    ("mode differs", {"a.py": F1}, {"a.py": X1}, ["a.py"], []),
    ("link target differs", {"l": L}, {"l": ("l", "b.py")}, ["l"], []),
    ("a folder became a file", {"d": F1}, {"d": D, "d/x": F1}, ["d"], ["d/x"]),
    ("extra file", {"a.py": F1}, {"a.py": F1, "old.py": F2}, [], ["old.py"]),
    (
        "an extra folder is listed by its top only",
        {"a.py": F1},
        {"a.py": F1, "old": D, "old/x": F1, "old/deep": D, "old/deep/y": F2},
        [],
        ["old"],
    ),
    (
        "siblings sorting between a folder and its contents stay separate",
        {"a.py": F1},
        {"a.py": F1, "data": D, "data/x": F1, "data.csv": F1, "data-2": D, "data-2/y": F1},
        [],
        ["data", "data-2", "data.csv"],
    ),
]


@pytest.mark.parametrize(
    ("source", "node", "changed", "deleted"),
    [pytest.param(s, n, c, d, id=name) for name, s, n, c, d in PLAN_CASES],
)
def test_plan(
    source: dict[str, Any], node: dict[str, Any], changed: list[str], deleted: list[str]
) -> None:
    got_changed, got_deleted = plan(manifest(source), node)
    assert got_changed == changed
    assert sorted(got_deleted) == deleted


def test_plan_never_deletes_what_the_source_ignores(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src", {".gitignore": "*.ckpt\ndata/\n", "pkg/m.py": "x"})
    source = build([str(src)])
    node = dict(source.entries)
    node.update(
        {
            "model.ckpt": F1,
            "data": D,
            "data/big.bin": F1,
            "runs": D,
            "runs/1": D,
            "runs/1/log.txt": F1,
            "pkg/__pycache__": D,
            "pkg/__pycache__/m.cpython-311.pyc": F1,
            "pkg/stale.py": F2,
            "old": D,
            "old/x.py": F2,
        }
    )
    changed, deleted = plan(source, node)
    assert changed == []
    assert sorted(deleted) == ["old", "pkg/stale.py"]


# ---------------------------------------------------------------- destinations

WORKDIR = "/srv/cpuaccel/work"


def host(**vars: Any) -> Host:
    return Host("node7", {"cpuaccel_workdir": WORKDIR, **vars})


@pytest.mark.parametrize(
    ("template", "vars", "expected"),
    [
        ("{{ cpuaccel_workdir }}/proj", {}, f"{WORKDIR}/proj"),
        ("{{cpuaccel_workdir}}/proj/", {}, f"{WORKDIR}/proj"),
        ("/scratch/{{ inventory_hostname }}/job", {}, "/scratch/node7/job"),
        ("{{ data_root }}/x/../code", {"data_root": "/data"}, "/data/code"),
        ("~/cpuaccel/proj", {}, "~/cpuaccel/proj"),
        ("/data/{{ 'a' ~ 'b' | upper }}", {}, "/data/aB"),
    ],
)
def test_render_dest(template: str, vars: dict[str, Any], expected: str) -> None:
    assert render_dest(host(**vars), template) == expected


@pytest.mark.parametrize(
    ("template", "vars", "words"),
    [
        ("{{ cpuaccel_workdir }}/x", {"cpuaccel_workdir": "work"}, ["'work/x'", "absolute"]),
        ("proj", {}, ["not an absolute path"]),
        ("", {}, ["not an absolute path"]),
        ("/", {}, ["'/'", "top-level"]),
        ("//", {}, ["top-level"]),
        ("//srv/cpuaccel", {}, ["workdir", "above it"]),
        ("///srv//cpuaccel/work/", {}, ["workdir"]),
        ("/srv/..", {}, ["top-level"]),
        ("{{ cpuaccel_workdir }}/..", {}, ["workdir"]),
        ("/srv", {}, ["workdir"]),
        # A parent of the workdir was accepted without --delete; a sync owns its destination
        # (a file where the node has a folder replaces it), so it is refused either way.
        ("/srv/cpuaccel", {}, ["workdir"]),
        ("{{ cpuaccel_workdir }}", {}, ["workdir"]),
        ("{{ cpuaccel_workdir }}/./", {}, ["workdir"]),
        ("/data/a\nb", {}, ["newline"]),
        ("{{ name }}", {"name": "/data/a\rb"}, ["newline"]),
        ("{{ nope }}/x", {}, ["'nope' is undefined", "--dest"]),
        ("{{ cpuaccel_workdir }/x", {}, ["--dest"]),
        # Sandboxed, as playbooks are: this ran a shell command through an unsandboxed Jinja.
        ("/x/{{ cycler.__init__.__globals__.os.system('touch /tmp/pwn') }}", {}, ["unsafe"]),
        ("/x/{{ ''.__class__.__mro__[1].__subclasses__() }}", {}, ["unsafe"]),
    ],
)
def test_render_dest_refuses_bad_destinations(
    template: str, vars: dict[str, Any], words: list[str]
) -> None:
    with pytest.raises(UsageError) as err:
        render_dest(host(**vars), template)
    assert "node7" in err.value.message
    for word in words:
        assert word in err.value.message
    assert err.value.hint


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


# ---------------------------------------------------------------- the engine, locally


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


# ---------------------------------------------------------------- the command line


def cached_cpuaccel(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`cpuaccel ARGS` with a cache of the test's own, next to its project folder."""
    return cpuaccel(*args, cwd=cwd, env=inherited_env(XDG_CACHE_HOME=str(cwd.parent / "xdg-cache")))


@pytest.fixture
def local_inventory(tmp_path: Path) -> Path:
    inv = tmp_path / "inv.yaml"
    inv.write_text(
        "all:\n  hosts:\n    here:\n"
        f"      ansible_connection: local\n"
        f"      cpuaccel_python: {sys.executable}\n"
        f"      cpuaccel_workdir: {tmp_path / 'work'}\n"
    )
    return inv


BAD_INPUT = [
    ("missing source", {}, ["nope"], ["nope: no such file or folder"]),
    ("relative --dest", {}, ["--dest", "rel/dir"], ["not an absolute path"]),
    ("--dest /", {}, ["--dest", "/"], ["top-level"]),
    ("--delete on the workdir", {}, ["--delete", "--dest", "{{ cpuaccel_workdir }}"], ["workdir"]),
    ("the workdir's parent", {}, ["--dest", "{{ cpuaccel_workdir }}/.."], ["workdir"]),
    # Refused by the node, on the path as it resolves there: the text check cannot see it.
    ("--dest ~/../..", {}, ["--delete", "--dest", "~/../../etc"], ["resolves to /etc", "top-"]),
    ("--dest $HOME", {}, ["--delete", "--dest", os.path.expanduser("~")], ["home folder"]),
    ("--dest ~/.ssh", {}, ["--delete", "--dest", "~/.ssh"], ["refusing"]),
    ("--dest /usr/local", {}, ["--dest", "/usr/local"], ["resolves to /usr/local", "system"]),
    ("--dest in a sandbox", {}, ["--dest", "/x/{{ cycler.__init__.__globals__ }}"], ["unsafe"]),
    ("undefined variable", {}, ["--dest", "{out}/{{ nothing }}"], ["'nothing' is undefined"]),
    ("newline in --dest", {}, ["--dest", "{out}/a\nb"], ["newline"]),
    ("--dest //", {}, ["--delete", "--dest", "//"], ["top-level"]),
    ("newline in a name", {"bad\nname.py": ""}, [], ["newline"]),
    ("symlink outside", {}, ["../linked"], ["symlink points outside", "--copy-links"]),
    ("unknown option", {}, ["--no-such-option"], ["no-such-option"]),
]


@pytest.mark.parametrize(
    ("files", "args", "words"),
    [pytest.param(f, a, w, id=name) for name, f, a, w in BAD_INPUT],
)
def test_cli_bad_input_exits_64_without_traceback_and_writes_nothing(
    tmp_path: Path,
    local_inventory: Path,
    files: dict[str, str],
    args: list[str],
    words: list[str],
) -> None:
    make_tree(tmp_path / "proj", {"a.py": "", **files})
    (tmp_path / "linked").mkdir()
    (tmp_path / "linked" / "ext").symlink_to("/etc/hostname")
    out = str(tmp_path / "out")
    args = [a.replace("{out}", out) for a in args]
    proc = cached_cpuaccel("sync", "-i", str(local_inventory), *args, cwd=tmp_path / "proj")
    assert proc.returncode == EXIT_USAGE, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    message = " ".join(proc.stderr.split())
    for word in words:
        assert word in message
    assert not (tmp_path / "work").exists()
    assert not (tmp_path / "out").exists()


def test_cli_json_and_exit_codes_on_a_local_host(tmp_path: Path, local_inventory: Path) -> None:
    proj = make_tree(tmp_path / "proj", {"a.py": "1", "run.sh": "#!/bin/sh\n"})
    first = cached_cpuaccel("sync", "-i", str(local_inventory), "--json", cwd=proj)
    assert first.returncode == 0, first.stdout + first.stderr
    report = json.loads(first.stdout)
    assert report["files"] == 2 and report["manifest"] == build([str(proj)]).hash
    here = report["hosts"]["here"]
    assert here["status"] == "ok" and here["in_sync"] is True
    assert here["dest"] == str(tmp_path / "work" / "proj")
    assert sorted(here["changed"]) == ["a.py", "run.sh"]
    (proj / "a.py").write_text("2")
    check = cached_cpuaccel("sync", "-i", str(local_inventory), "--check", cwd=proj)
    assert check.returncode == 1, check.stdout + check.stderr
    assert "here: 1 would change, 0 deleted" in check.stdout
    assert "0/1 node(s) match the source" in check.stdout
    assert (tmp_path / "work" / "proj" / "a.py").read_text() == "1"
    second = cached_cpuaccel("sync", "-i", str(local_inventory), cwd=proj)
    assert second.returncode == 0 and "1/1 node(s) match the source" in second.stdout
    assert (tmp_path / "work" / "proj" / "a.py").read_text() == "2"
