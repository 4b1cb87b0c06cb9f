"""The sync's ignore rules (sync/ignore.py): the default and the project's rules,
--exclude's gitignore syntax, the node's paths under the source's rules; matched per
folder, each decision held to pathspec's own (the rules' reference), and pathspec loaded
only for a tree with rules of its own (a sync must go at rsync's speed)."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import pathspec
import pytest

from cpuaccel.projectsync.ignore import DEFAULT_PATTERNS, Ignore, default_ignored
from cpuaccel.projectsync.manifest import build
from tests.unit.projectsync.trees import make_tree

pytestmark = pytest.mark.usefixtures("private_hash_cache")


def with_parents(paths: set[str]) -> set[str]:
    """The paths plus every folder above them, as manifest entries list them."""
    out = set(paths)
    for rel in paths:
        parts = rel.split("/")
        out |= {"/".join(parts[:i]) for i in range(1, len(parts))}
    return out


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


# Names near every default pattern, and glob, escape, space and case traps.
NAMES = [
    ".git", "git", ".gitx", "x.git", "__pycache__", "__pycache", "runs", "run", "runs ",
    " runs", ".cpuaccel", "cpuaccel", ".venv", "venv", "venv2", "myvenv", ".VENV", "Runs",
    ".pyc", "a.pyc", "a.pyc.txt", "a.PYC", "apyc", "a.py", "*.pyc", "[a].pyc", "a\\.pyc",
    "*", "?", "[", "!runs", "#runs", "runs/", "é.pyc", "a b.pyc", "a.pyc ", "a.pyo",
]  # fmt: skip
FOLDERS = ["", "pkg", "pkg/sub", "runs2", "venv2/x"]


def test_the_defaults_decide_as_pathspec_does() -> None:
    """default_ignored holds for every name, as a file and as a folder, at any depth
    below folders that are not ignored, to pathspec's answer for DEFAULT_PATTERNS."""
    spec = pathspec.GitIgnoreSpec.from_lines(DEFAULT_PATTERNS)
    for folder, name, is_dir in itertools.product(FOLDERS, NAMES, (False, True)):
        if "/" in name:
            continue  # not a name a folder listing holds
        rel = f"{folder}/{name}" if folder else name
        want = bool(spec.check_file(rel + ("/" if is_dir else "")).include)
        assert default_ignored(name, is_dir) is want, (rel, is_dir)
        assert Ignore("/nonexistent").ignored(rel, is_dir) is want, (rel, is_dir)


@pytest.mark.parametrize(
    ("extra", "rel", "is_dir", "ignored"),
    [
        ([], "pkg/a.pyc", False, True),
        (["!*.pyc"], "pkg/a.pyc", False, False),  # --exclude's negation beats a default
        (["!runs/"], "runs", True, False),
        (["*.bin"], "pkg/sub/w.bin", False, True),
        (["/top.bin"], "pkg/top.bin", False, False),  # anchored at the root only
        (["/top.bin"], "top.bin", False, True),
        (["pkg/sub/"], "pkg/sub", True, True),
    ],
)
def test_excludes_go_with_the_defaults(
    extra: list[str], rel: str, is_dir: bool, ignored: bool
) -> None:
    assert Ignore("/nonexistent", extra).ignored(rel, is_dir) is ignored


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_a_folders_rules_match_as_the_old_per_path_chain(tmp_path: Path) -> None:
    """Every path of a tree with nested rules files, decided per folder, against the
    decision of each rules file on the path below its own folder, deepest last."""
    rules = {
        ".gitignore": "*.log\n!keep.log\nbuild/\n/only-top.txt\n",
        "a/.cpuaccelignore": "!*.log\nsecret*\n",
        "a/b/.gitignore": "*.log\n!b2/x.log\n",
    }
    paths = [
        "x.log", "keep.log", "only-top.txt", "a/only-top.txt", "a/x.log", "a/secret.txt",
        "a/b/x.log", "a/b/keep.log", "a/b/b2/x.log", "a/b/b2/y.log", "a/b/secret",
        "c/build", "c/x.log", "a/b/b2/deep/z.log",
    ]  # fmt: skip
    root = _tree(tmp_path, {**rules, **{p: "" for p in paths}})
    specs = {
        os.path.dirname(rel): pathspec.GitIgnoreSpec.from_lines(text.splitlines())
        for rel, text in rules.items()
    }
    base = pathspec.GitIgnoreSpec.from_lines(DEFAULT_PATTERNS)
    ignore = Ignore(str(root))
    for rel, is_dir in [(p, False) for p in paths] + [("c/build", True), ("a/b", True)]:
        probe = rel + ("/" if is_dir else "")
        want = base.check_file(probe).include
        for folder, spec in sorted(specs.items(), key=lambda kv: kv[0].count("/") + bool(kv[0])):
            if folder and not rel.startswith(folder + "/"):
                continue
            found = spec.check_file(probe[len(folder) + 1 :] if folder else probe).include
            want = found if found is not None else want
        assert ignore.ignored(rel, is_dir) is bool(want), rel


def _modules_after_build(tmp_path: Path, files: dict[str, str], excludes: list[str]) -> str:
    src = _tree(tmp_path / "src", files)
    script = (
        "import sys\n"
        "from cpuaccel.projectsync.manifest import build\n"
        f"m = build([{str(src)!r}], excludes={excludes!r})\n"
        "print(sorted(m.entries), 'pathspec' in sys.modules)\n"
    )
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    argv = [sys.executable, "-c", script]
    return subprocess.run(argv, capture_output=True, text=True, check=True, env=env).stdout


def test_pathspec_loads_only_for_a_tree_with_rules_of_its_own(tmp_path: Path) -> None:
    plain = {"train.py": "", "pkg/m.py": "", "pkg/m.pyc": "", "runs/r/x": ""}
    assert _modules_after_build(tmp_path / "1", plain, []) == (
        "['pkg', 'pkg/m.py', 'train.py'] False\n"
    )
    with_rules = {**plain, "pkg/.gitignore": "m.py\n"}
    assert _modules_after_build(tmp_path / "2", with_rules, []) == (
        "['pkg', 'pkg/.gitignore', 'train.py'] True\n"
    )
    assert _modules_after_build(tmp_path / "3", plain, ["pkg/"]) == "['train.py'] True\n"


def test_a_whole_sync_without_rules_files_loads_no_pathspec(tmp_path: Path) -> None:
    """The verb's whole path (CLI, inventory, scan, node program, verify) to a local host,
    as tests/unit/cli/test_lazy_imports.py runs it: nothing on it imports pathspec by the way."""
    project = _tree(tmp_path / "project", {"train.py": "print('hi')\n", "pkg/m.py": ""})
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        "all:\n  hosts:\n    here:\n      ansible_connection: local\n"
        f"      cpuaccel_python: {sys.executable}\n"
    )
    argv = ["sync", "-i", str(inventory), str(project), "--dest", str(tmp_path / "dest")]
    script = (
        "import sys\n"
        "from cpuaccel.cli.main import main\n"
        f"sys.argv = ['cpuaccel', *{argv!r}, '--json']\n"
        "try:\n"
        "    main()\n"
        "except SystemExit as exc:\n"
        "    sys.stderr.write(f'PROBE {exc.code} {\"pathspec\" in sys.modules}\\n')\n"
    )
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=project, env=env
    )
    assert "PROBE 0 False" in proc.stderr, proc.stderr[-2000:]
    assert (tmp_path / "dest" / "pkg" / "m.py").exists()


def test_the_scan_keeps_the_defaults_out_at_every_depth(tmp_path: Path) -> None:
    src = _tree(
        tmp_path / "src",
        {
            "a/b/.git/HEAD": "",
            "a/b/c.pyc": "",
            "a/b/c.py": "",
            "a/runs": "",  # a file named runs: `runs/` is for folders only
            "a/b/venv/bin/python": "",
            "a/b/.cpuaccel/x": "",
        },
    )
    assert set(build([str(src)]).entries) == {"a", "a/b", "a/b/c.py", "a/runs"}


def test_a_pattern_pathspec_refuses_is_named_where_it_entered(tmp_path: Path) -> None:
    """A lone ``!`` or ``\\`` makes pathspec raise: a rules file's line (file:line), the
    project file's ``exclude`` (cpuaccel.yaml:line) and --exclude each say so in one line
    before anything is scanned (it was a traceback)."""
    from cpuaccel.config.project_choice import load_config
    from cpuaccel.errors import SourceError, UsageError
    from cpuaccel.projectsync.ignore import check_excludes

    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / ".gitignore").write_text("*.bin\n\n!\n")
    with pytest.raises(SourceError, match=r"sub/\.gitignore:3: not a gitignore pattern: '!'"):
        build([str(src)])
    (tmp_path / "cpuaccel.yaml").write_text("exclude:\n  - data/\n  - '\\'\n")
    with pytest.raises(SourceError, match=r"cpuaccel\.yaml:\d+: exclude holds '\\\\'"):
        load_config(tmp_path / "cpuaccel.yaml")
    with pytest.raises(UsageError, match=r"--exclude '!' is not a gitignore pattern"):
        check_excludes(["data/", "!"])
    check_excludes(["data/", "*.bin", "!keep.bin", "[", "\\!x"])  # every one git takes


def test_a_reversed_bracket_range_is_named_where_it_entered(tmp_path: Path) -> None:
    """``[z-a]`` passes pathspec's own check but fails as its regular expression: said in
    one line, as a rules file's file:line and as --exclude's pattern."""
    from cpuaccel.errors import SourceError, UsageError
    from cpuaccel.projectsync.ignore import check_excludes

    src = tmp_path / "src"
    src.mkdir()
    (src / ".cpuaccelignore").write_text("data/\n[z-a]\n")
    with pytest.raises(
        SourceError, match=r"\.cpuaccelignore:2: not a gitignore pattern: '\[z-a\]'"
    ):
        build([str(src)])
    with pytest.raises(UsageError, match=r"--exclude '\[z-a\]' is not a gitignore pattern"):
        check_excludes(["data/", "[z-a]"])
