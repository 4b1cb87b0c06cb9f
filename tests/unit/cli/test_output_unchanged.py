"""What a fixed set of commands prints, kept byte for byte: a change of the code behind
them (a refactoring of settings, requests or records) must not change what users see.

When a change is meant to change what is shown, write the new output and review its
diff with the change: ``CPUACCEL_UPDATE_OUTPUT=1 pytest tests/unit/cli/test_output_unchanged.py``.
The run id of a dry run is the only part that differs between two runs of a command,
and the only part replaced (by ``<run-id>``)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from testsupport.command import cpuaccel, inherited_env
from testsupport.fake_run import make_run

KEPT = Path(__file__).parent / "output"
UPDATE = os.environ.get("CPUACCEL_UPDATE_OUTPUT") == "1"
RUN_ID = re.compile(r"\b\d{8}-\d{6}-[0-9a-f]{6}\b")

INVENTORY = """\
all:
  hosts:
    node1: {ansible_host: 192.0.2.1}
    node2: {ansible_host: 192.0.2.2, cpuaccel_env: {DATA: /data/b}}
  vars:
    cpuaccel_ppn: 2
    cpuaccel_master_port: 29600
"""
PROJECT = "mixed_precision: fp32\nmax_restarts: 1\n"

# name -> argv: what each kept file holds the output of.
COMMANDS: dict[str, tuple[str, ...]] = {
    "help": ("--help",),
    "run-help": ("run", "--help"),
    "check-help": ("check", "--help"),
    "sync-help": ("sync", "--help"),
    "provision-help": ("provision", "--help"),
    "ps-help": ("ps", "--help"),
    "config-show": ("config", "show", "-i", "inventory.yaml"),
    "config-show-flags": ("config", "show", "-i", "inventory.yaml", "--ppn", "1", "--nodes", "1"),
    "run-dry-run": ("run", "--dry-run", "-i", "inventory.yaml", "train.py", "--steps", "3"),
    "run-dry-run-openmpi": (
        "run",
        "--dry-run",
        "-i",
        "inventory.yaml",
        "--launcher",
        "openmpi",
        "--network",
        "192.0.2.0/24",
        "train.py",
    ),
    "ps": ("ps",),
    "ps-json": ("ps", "--json"),
}


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("project")
    (folder / "inventory.yaml").write_text(INVENTORY)
    (folder / "cpuaccel.yaml").write_text(PROJECT)
    (folder / "train.py").write_text("print('step')\n")
    for run_id, state, nodes, started in (
        ("20261201-100000-aaaaaa", "succeeded", 2, 1796119200.0),
        ("20261201-110000-bbbbbb", "failed", 1, 1796122800.0),
    ):
        run = make_run(folder / "runs", run_id, state=state, nodes=nodes, metrics=20)
        for name in ("run.json", "status.json"):  # fixed times: STARTED and DURATION
            doc = json.loads((run.path / name).read_text())
            doc.update(started=started)
            if "ended" in doc:
                doc["ended"] = started + 754.0
            (run.path / name).write_text(json.dumps(doc))
    return folder


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_what_the_command_prints_is_unchanged(project: Path, name: str) -> None:
    env = inherited_env(COLUMNS="100", TZ="UTC", LC_ALL="C.UTF-8")
    done = cpuaccel(*COMMANDS[name], cwd=project, env=env)
    shown = f"exit {done.returncode}\n--- stdout\n{done.stdout}--- stderr\n{done.stderr}"
    shown = shown.replace(str(project), "<project>")
    if name.startswith("run-dry-run"):  # a new run's id: its time and a random part
        shown = RUN_ID.sub("<run-id>", shown)
    kept = KEPT / f"{name}.txt"
    if UPDATE:
        KEPT.mkdir(exist_ok=True)
        kept.write_text(shown)
    assert kept.exists(), f"no kept output for {name}: write it with CPUACCEL_UPDATE_OUTPUT=1"
    assert shown == kept.read_text()
