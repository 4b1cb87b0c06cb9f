"""The one quoting function: whatever a word holds, it arrives literally; and it is the one
``quote`` filter of playbooks and job templates alike."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from cpuaccel import templating
from cpuaccel.connectors import commandline
from cpuaccel.connectors.commandline import quote
from cpuaccel.connectors.connect_options import ConnectOptions
from cpuaccel.connectors.local import LocalConnector
from cpuaccel.errors import CommandTimeout
from cpuaccel.inventory.host import Host
from cpuaccel.jobs import rundir
from cpuaccel.jobs.plan import RunPlan

NASTY = [
    "$(touch {marker})",
    "`touch {marker}`",
    'it\'s "quoted"',
    "a b\tc\nd",
    "; touch {marker}; #",
    "*",
    "~",
    "$HOME",
    "",
    "-n",
]

ECHO_ARGV = [sys.executable, "-c", "import sys, json; print(json.dumps(sys.argv[1:]))"]


def _words(marker: Path) -> list[str]:
    return [w.format(marker=marker) for w in NASTY]


def test_render_runs_every_word_literally(tmp_path: Path) -> None:
    marker = tmp_path / "executed"
    words = _words(marker)
    line = commandline.shell_line([*ECHO_ARGV, *words])
    out = subprocess.run(["/bin/sh", "-c", line], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == words
    assert not marker.exists()


def test_env_values_are_not_interpolated(tmp_path: Path) -> None:
    marker = tmp_path / "executed"
    value = f"$(touch {marker}) 'x' \"y\""
    line = commandline.shell_line(
        [sys.executable, "-c", "import os; print(os.environ['V'])"], env={"V": value}
    )
    out = subprocess.run(["/bin/sh", "-c", line], capture_output=True, text=True, check=True)
    assert out.stdout.rstrip("\n") == value
    assert not marker.exists()


@pytest.mark.parametrize("name", ["A B", "1X", "X=Y", "$(x)", ""])
def test_bad_env_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="environment variable name"):
        commandline.shell_line(["true"], env={name: "v"})


def test_cwd_is_quoted_and_must_exist(tmp_path: Path) -> None:
    odd = tmp_path / "dir with 'quote' and $(x)"
    odd.mkdir()
    line = commandline.shell_line(["pwd"], cwd=str(odd))
    out = subprocess.run(["/bin/sh", "-c", line], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(odd)
    missing = commandline.shell_line(["pwd"], cwd=str(tmp_path / "missing"))
    assert subprocess.run(["/bin/sh", "-c", missing], capture_output=True).returncode != 0


def test_home_relative_path_keeps_tilde_for_the_shell() -> None:
    assert commandline.quote_path("~/a b") == "~/'a b'"
    assert commandline.quote_path("/x/~y") == "'/x/~y'"


def test_empty_command_is_refused() -> None:
    with pytest.raises(ValueError):
        commandline.shell_line([])


def test_local_connector_runs_with_stdin_and_reports_exit_code(tmp_path: Path) -> None:
    marker = tmp_path / "executed"
    conn = LocalConnector(Host("localhost", {"ansible_connection": "local"}), ConnectOptions())
    words = _words(marker)
    result = conn.run([*ECHO_ARGV, *words])
    assert result.ok and json.loads(result.stdout) == words
    assert not marker.exists()
    echoed = conn.run(["/bin/cat"], stdin=b"hello\x00world")
    assert echoed.stdout == "hello\x00world"
    failed = conn.run([sys.executable, "-c", "import sys; sys.exit(7)"])
    assert failed.exit_code == 7 and not failed.ok


def test_local_connector_timeout_kills_the_command(tmp_path: Path) -> None:
    conn = LocalConnector(Host("localhost"), ConnectOptions())
    marker = tmp_path / "late"
    with pytest.raises(CommandTimeout, match="timed out"):
        conn.run(["/bin/sh", "-c", f"sleep 1; touch {marker}"], timeout=0.3)
    subprocess.run(["sleep", "1.3"], check=True)
    assert not marker.exists()


def test_one_quote_filter_for_playbooks_and_job_templates() -> None:
    # Every filter is bounded (templating's size checks) around the one function.
    assert templating.environment().filters["quote"].__wrapped__ is quote
    assert templating.render_text("{{ x | quote }}", {"x": "a b'c"}) == "'a b'\"'\"'c'"
    assert quote(None) == "None" and quote(2) == "2"
    # run's job templates read only the plan's templates folder (none: cpuaccel's own)
    plan = cast(RunPlan, SimpleNamespace(templates=None))
    jobs = rundir._environment(plan)
    assert jobs.filters["quote"].__wrapped__ is quote and "shquote" not in jobs.filters
