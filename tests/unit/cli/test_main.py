"""The command line as a user meets it: help, version, exit codes, no tracebacks."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from cpuaccel import __version__
from cpuaccel.errors import EXIT_USAGE
from testsupport.command import cpuaccel, inherited_env


def test_version_and_help_with_examples() -> None:
    assert cpuaccel("--version").stdout.strip() == f"cpuaccel, version {__version__}"
    top = cpuaccel("--help")
    assert top.returncode == 0 and "Examples:" in top.stdout and "Exit codes" in top.stdout
    sub = cpuaccel("check", "--help")
    assert sub.returncode == 0 and "cpuaccel check -i inventory.yaml" in sub.stdout
    assert "--limit" in sub.stdout and "--json" in sub.stdout


def test_check_without_inventory_runs_on_localhost(tmp_path: Path) -> None:
    proc = cpuaccel("check", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert list(report["hosts"]) == ["localhost"]
    facts = report["hosts"]["localhost"]["facts"]
    assert facts["python"]["executable"] == sys.executable
    assert report["problems"] == []


def test_plain_output_has_no_colour_codes(tmp_path: Path) -> None:
    proc = cpuaccel("check", cwd=tmp_path)
    assert proc.returncode == 0
    assert "\x1b[" not in proc.stdout and "localhost" in proc.stdout


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("all:\n  hosts:\n    a: {ansible_port: twenty}\n", ["inv.yaml:3", "port"]),
        ("all:\n  hosts: [a\n", ["inv.yaml:", "YAML"]),
        ("hosts:\n  a:\n", ["inv.yaml:1", "all:"]),
    ],
)
def test_bad_inventory_is_one_message_exit_64(tmp_path: Path, text: str, words: list[str]) -> None:
    (tmp_path / "inv.yaml").write_text(text)
    proc = cpuaccel("check", "-i", str(tmp_path / "inv.yaml"))
    assert proc.returncode == EXIT_USAGE
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: ")
    for word in words:
        assert word in proc.stderr
    assert "fix:" in proc.stderr


def test_limit_matching_nothing_and_bad_arguments(tmp_path: Path) -> None:
    nothing = cpuaccel("check", "--limit", "nosuchhost", cwd=tmp_path)
    assert nothing.returncode == EXIT_USAGE and "nosuchhost" in nothing.stderr
    assert "Traceback" not in nothing.stderr
    bad_forks = cpuaccel("check", "--forks", "0", cwd=tmp_path)
    assert bad_forks.returncode == EXIT_USAGE and "--forks" in bad_forks.stderr
    bad_extra = cpuaccel("check", "-e", "novalue", cwd=tmp_path)
    assert bad_extra.returncode == EXIT_USAGE and "novalue" in bad_extra.stderr


def test_inventory_from_environment_variable(tmp_path: Path) -> None:
    inv = tmp_path / "env-inv.yaml"
    # The Python with cpuaccel: check, like run's preflight, refuses a node without it.
    inv.write_text(f"all:\n  hosts:\n    localhost: {{cpuaccel_python: {sys.executable}}}\n")
    proc = cpuaccel("check", "--json", cwd=tmp_path, env=inherited_env(CPUACCEL_INVENTORY=str(inv)))
    assert proc.returncode == 0, proc.stderr
    assert list(json.loads(proc.stdout)["hosts"]) == ["localhost"]


@pytest.mark.parametrize(("cause", "code"), [(EOFError(), 1), (KeyboardInterrupt(), 130)])
def test_an_eof_that_escapes_a_command_is_not_taken_for_a_ctrl_c(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], cause: Exception, code: int
) -> None:
    """click turns both an EOFError and a Ctrl-C into Abort: only the Ctrl-C is exit 130
    (an escaped paramiko EOFError once made a refused sudo password look interrupted)."""
    import click

    from cpuaccel.cli import main as main_module

    def aborts(**_: object) -> None:
        raise click.exceptions.Abort() from cause

    monkeypatch.setattr(main_module.cli, "main", aborts)
    with pytest.raises(SystemExit) as info:
        main_module._main()
    assert info.value.code == code
    said = capsys.readouterr().err
    assert ("EOFError" in said) == (code == 1) and "Traceback" not in said


@pytest.mark.parametrize(
    ("verb", "fix"),
    [("chek", "did you mean 'cpuaccel check'?"), ("provison", "'cpuaccel provision'"),
     ("frobnicate", "see 'cpuaccel --help'")],
)  # fmt: skip
def test_an_unknown_verb_gets_the_closest_one(tmp_path: Path, verb: str, fix: str) -> None:
    proc = cpuaccel(verb, cwd=tmp_path, env=inherited_env(HOME=str(tmp_path)))
    assert proc.returncode == EXIT_USAGE
    lines = proc.stderr.strip().splitlines()
    assert lines[0] == f"error: No such command '{verb}' of cpuaccel", lines
    assert len(lines) == 2 and lines[1].startswith("  fix: ") and fix in lines[1], lines


def test_a_missing_inventory_file_lists_those_in_its_folder(tmp_path: Path) -> None:
    (tmp_path / "inventory.yaml").write_text("all:\n  hosts:\n    localhost:\n")
    (tmp_path / "cpuaccel.yaml").write_text("ppn: 1\n")
    proc = cpuaccel("check", "-i", "inventroy.yaml", cwd=tmp_path)
    assert proc.returncode == EXIT_USAGE
    lines = proc.stderr.strip().splitlines()
    assert lines == [
        "error: inventroy.yaml: inventory file not found",
        "  fix: did you mean -i inventory.yaml? (this folder holds inventory.yaml; cpuaccel "
        "config writes a new one)",
    ]
    assert "with the comma" not in proc.stderr
