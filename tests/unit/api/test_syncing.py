"""``cpuaccel.api.syncing``: ``sync()`` of a tiny project to this machine returns typed
per-node reports and the ``--json`` object, with ``check`` changing nothing; bad keywords
and refused input are UsageErrors (the CLI's message for a flag's), with nothing
written; and nothing is printed by default."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cpuaccel.api.syncing import SyncResult, default_dest, sync
from cpuaccel.errors import EXIT_USAGE, UsageError
from cpuaccel.executor import Status
from cpuaccel.projectsync.manifest import build
from cpuaccel.projectsync.node_result import NodeReport
from tests.unit.projectsync.trees import make_tree
from testsupport.command import cpuaccel, inherited_env

pytestmark = pytest.mark.usefixtures("private_hash_cache")


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project folder, the current one, with no inventory: the host is this machine."""
    proj = make_tree(tmp_path / "proj", {"a.py": "1", "conf/b.yaml": "x: 1\n"})
    monkeypatch.chdir(proj)
    monkeypatch.delenv("CPUACCEL_INVENTORY", raising=False)
    return proj


def workdir(project: Path) -> dict[str, str]:
    return {"cpuaccel_workdir": str(project.parent / "work")}


def test_sync_check_and_sync_again_on_this_machine(project: Path) -> None:
    landed = project.parent / "work" / "proj"
    first = sync(extra_vars=workdir(project))
    assert isinstance(first, SyncResult)
    assert first.ok and first.exit_code == 0
    assert first.files == 3 and first.manifest == build([str(project)]).hash
    report = first.hosts["localhost"].value
    assert isinstance(report, NodeReport)
    assert report.in_sync and report.dest == str(landed)
    assert sorted(report.changed) == ["a.py", "conf", "conf/b.yaml"]
    assert (landed / "conf" / "b.yaml").read_text() == "x: 1\n"

    (project / "a.py").write_text("2")
    dry = sync(extra_vars=workdir(project), check=True)
    assert not dry.ok and dry.exit_code == 1  # would change: the CLI's --check exit
    assert dry.hosts["localhost"].value is not None
    assert dry.hosts["localhost"].value.changed == ["a.py"]
    assert (landed / "a.py").read_text() == "1"

    again = sync(extra_vars=workdir(project))
    assert again.ok and (landed / "a.py").read_text() == "2"
    data = again.to_json()
    assert data["hosts"]["localhost"]["status"] == "ok"
    assert data["hosts"]["localhost"]["in_sync"] is True
    assert data["hosts"]["localhost"]["changed"] == ["a.py"]


def test_to_json_is_what_the_cli_prints(project: Path) -> None:
    found = sync(extra_vars=workdir(project), check=True)
    env = inherited_env(XDG_CACHE_HOME=str(project.parent / "xdg-cache"))
    extra = f"cpuaccel_workdir={project.parent / 'work'}"
    cli = cpuaccel("sync", "-e", extra, "--check", "--json", cwd=project, env=env)
    assert cli.returncode == found.exit_code == 1, cli.stderr
    printed = json.loads(cli.stdout)
    ours = found.to_json()
    for row in (printed["hosts"]["localhost"], ours["hosts"]["localhost"]):
        row.pop("seconds")
    assert printed == ours


def test_sources_and_dest_as_paths(project: Path, tmp_path: Path) -> None:
    dest = tmp_path / "elsewhere"
    found = sync(sources=[project / "a.py", Path("conf")], dest=dest)
    assert found.ok
    assert (dest / "a.py").read_text() == "1"
    assert (dest / "conf" / "b.yaml").is_file()  # several sources: each under its name
    assert sync(sources="conf", dest=dest / "c").ok
    assert (dest / "c" / "b.yaml").is_file()  # one folder: its contents at dest


def test_default_dest_is_the_one_folder_or_this_one(project: Path) -> None:
    assert default_dest(["conf"]) == "{{ cpuaccel_workdir }}/conf"
    assert default_dest(["a.py", "conf"]) == "{{ cpuaccel_workdir }}/proj"


@pytest.mark.parametrize(
    ("keywords", "said"),
    [
        ({"sources": 5}, "sources=5: expected a path or a list of paths"),
        ({"sources": ["a.py", None]}, "sources=['a.py', None]: expected a path"),
        ({"dest": 3}, "dest=3: expected a path"),
        ({"exclude": [b"x"]}, "exclude=[b'x']: expected a gitignore pattern"),
        ({"delete": "yes"}, "delete='yes': expected True or False"),
        ({"check": 1}, "check=1: expected True or False"),
        ({"forks": 0}, "forks=0: expected a whole number from 1 to 1024"),
        ({"progress": None}, "progress=None: expected True or False"),
    ],
)
def test_a_bad_keyword_is_a_usage_error_naming_it(
    project: Path, keywords: dict[str, Any], said: str
) -> None:
    with pytest.raises(UsageError) as caught:
        sync(**keywords)
    assert caught.value.message.startswith(said) and caught.value.hint
    assert not (project.parent / "work").exists()


@pytest.mark.parametrize(
    ("keywords", "flags"),
    [
        ({"sources": "nope"}, ["nope"]),
        ({"dest": "rel/dir"}, ["--dest", "rel/dir"]),
        ({"dest": "/"}, ["--dest", "/"]),
        ({"exclude": "a/**b/[z-a]"}, ["--exclude", "a/**b/[z-a]"]),
    ],
)
def test_refused_input_says_what_the_cli_says_and_writes_nothing(
    project: Path, keywords: dict[str, Any], flags: list[str]
) -> None:
    with pytest.raises(UsageError) as caught:
        sync(extra_vars=workdir(project), **keywords)
    assert caught.value.exit_code == EXIT_USAGE
    env = inherited_env(XDG_CACHE_HOME=str(project.parent / "xdg-cache"))
    extra = f"cpuaccel_workdir={project.parent / 'work'}"
    cli = cpuaccel("sync", "-e", extra, *flags, cwd=project, env=env)
    assert cli.returncode == EXIT_USAGE
    assert " ".join(f"error: {caught.value}".split()) in " ".join(cli.stderr.split())
    assert not (project.parent / "work").exists()


def test_nothing_is_printed_by_default(project: Path, capfd: pytest.CaptureFixture[str]) -> None:
    assert sync(extra_vars=workdir(project)).ok
    assert sync(extra_vars=workdir(project), check=True).ok
    assert capfd.readouterr() == ("", "")


def test_an_unreachable_node_is_a_result(project: Path) -> None:
    (project.parent / "inv.yaml").write_text(
        "all:\n  hosts:\n    nowhere:\n      ansible_host: 127.0.0.1\n      ansible_port: 1\n"
    )
    found = sync(str(project.parent / "inv.yaml"), dest="/tmp/x", connect_timeout=2)
    assert found.hosts["nowhere"].status is Status.UNREACHABLE
    assert not found.ok and found.exit_code == 69
