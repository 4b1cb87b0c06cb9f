"""config spells its flags as the other verbs do; its launcher list is the one list."""

from __future__ import annotations

from pathlib import Path

import yaml

from cpuaccel.config.settings import LAUNCHER_CHOICES, LAUNCHER_WORDS
from cpuaccel.errors import EXIT_USAGE
from tests.unit.config.test_questionnaire import Terminal
from testsupport.command import cpuaccel

HOSTS = ("--yes", "--hosts", "192.0.2.1,192.0.2.2", "--ppn", "1")


def test_config_takes_u_and_private_key_as_every_verb(tmp_path: Path) -> None:
    proc = cpuaccel("config", *HOSTS, "-u", "train", "--private-key", "/k/id", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    group = yaml.safe_load((tmp_path / "inventory.yaml").read_text())["all"]["vars"]
    assert group["ansible_user"] == "train"
    assert group["ansible_ssh_private_key_file"] == "/k/id"


def test_the_old_spellings_still_work_and_are_not_shown(tmp_path: Path) -> None:
    proc = cpuaccel("config", *HOSTS, "--user", "train", "--key", "/k/old", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    group = yaml.safe_load((tmp_path / "inventory.yaml").read_text())["all"]["vars"]
    assert group["ansible_ssh_private_key_file"] == "/k/old"
    shown = cpuaccel("config", "--help").stdout
    assert "-u, --user USER" in shown
    assert "--private-key, --key-file FILE" in shown
    assert "--key FILE" not in shown


def test_two_different_keys_are_refused(tmp_path: Path) -> None:
    proc = cpuaccel("config", *HOSTS, "--private-key", "/a", "--key", "/b", cwd=tmp_path)
    assert proc.returncode == EXIT_USAGE
    assert proc.stderr.splitlines() == [
        "error: --private-key /a and --key /b name two keys",
        "  fix: give one: --private-key FILE",
    ]
    assert not (tmp_path / "inventory.yaml").exists()


def test_help_file_and_questions_name_the_same_launchers(tmp_path: Path) -> None:
    assert "slurm" in LAUNCHER_CHOICES
    shown = " ".join(cpuaccel("config", "--help").stdout.split())
    assert f"--launcher [{'|'.join(LAUNCHER_CHOICES)}]" in shown
    ok = cpuaccel("config", *HOSTS, "--launcher", "slurm", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    written = (tmp_path / "cpuaccel.yaml").read_text()
    assert f"launcher: slurm  # {LAUNCHER_WORDS}\n" in written
    t = Terminal(["config", "--single", "--ppn", "1", "--master-port", "29500"], tmp_path)
    t.expect(f"Which MPI launches the job? ({LAUNCHER_WORDS};")
    t.proc.kill()
    t.proc.wait()


def test_tune_documents_only_the_nodes_it_takes(tmp_path: Path) -> None:
    shown = cpuaccel("tune", "--help").stdout
    assert "--nodes N " in shown and "MIN:MAX" not in shown.split("Examples:")[0]
    (tmp_path / "train.py").write_text("")
    proc = cpuaccel("tune", "--nodes", "1:2", "train.py", cwd=tmp_path)
    assert proc.returncode == EXIT_USAGE
    assert proc.stderr.splitlines() == [
        "error: --nodes MIN:MAX: not for tune",
        "  fix: every trial runs on the same nodes: give --nodes N",
    ]
