"""The source's manifest and the plan from it (sync/manifest.py): modes and links inside
the tree, a hash of content and mode only, several sources, links out of the tree, clear
errors; what a node must get and delete, never what the source ignores."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from cpuaccel.errors import UsageError
from cpuaccel.projectsync.manifest import SourceManifest, build, plan
from tests.unit.projectsync.trees import make_tree

pytestmark = pytest.mark.usefixtures("private_hash_cache")


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
