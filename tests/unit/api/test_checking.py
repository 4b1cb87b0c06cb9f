"""``cpuaccel.api.checking``: ``check()`` on this machine returns typed results and the
``--json`` object, says a bad keyword as the CLI says its flag, prints nothing unless
asked; and its gathering keeps only the head's connection open."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from cpuaccel.api import checking
from cpuaccel.api.checking import CheckResult, check
from cpuaccel.api.target import api_text
from cpuaccel.connectors.base import Connector
from cpuaccel.connectors.connect_options import ConnectOptions
from cpuaccel.errors import EXIT_USAGE, InventoryError, UsageError
from cpuaccel.executor import ConnectionPool, HostResult, Status
from cpuaccel.inventory.host import Host
from testsupport.command import cpuaccel, inherited_env


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder without inventory.yaml or cpuaccel.yaml: the default hosts are this
    machine alone."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CPUACCEL_INVENTORY", raising=False)
    return tmp_path


def test_check_of_this_machine_is_typed_and_is_what_json_prints(here: Path) -> None:
    found = check()
    assert isinstance(found, CheckResult)
    assert list(found.hosts) == ["localhost"]
    local = found.hosts["localhost"]
    assert local.status is Status.OK and local.value is not None
    assert local.value["python"]["version"].startswith(f"{sys.version_info[0]}.")
    assert found.ok is (found.exit_code == 0)
    data = found.to_json()
    assert data["hosts"]["localhost"]["reachable"] is True
    assert data["problems"] == [p.to_json() for p in found.problems]
    # The CLI's --json has the same shape, from the same function.
    cli = cpuaccel("check", "--json", cwd=here, env=inherited_env())
    printed = json.loads(cli.stdout)
    assert cli.returncode == found.exit_code, cli.stderr
    assert set(printed) == set(data) == {"hosts", "problems", "notes", "network"}
    assert set(printed["hosts"]["localhost"]) == set(data["hosts"]["localhost"])


def test_an_unreachable_host_is_a_result_not_an_exception(here: Path) -> None:
    (here / "inv.yaml").write_text(
        "all:\n  hosts:\n    nowhere:\n      ansible_host: 127.0.0.1\n      ansible_port: 1\n"
    )
    found = check("inv.yaml", connect_timeout=2)
    assert found.hosts["nowhere"].status is Status.UNREACHABLE
    assert not found.ok and found.exit_code == 69
    assert found.to_json()["hosts"]["nowhere"]["reachable"] is False


@pytest.mark.parametrize(
    ("keywords", "said"),
    [
        ({"forks": 0}, "forks=0: expected a whole number from 1 to 1024"),
        ({"forks": "8"}, "forks='8': expected a whole number"),
        ({"limit": 5}, "limit=5: expected a string"),
        ({"connect_timeout": -1}, "connect_timeout=-1: expected seconds"),
        ({"slurm": 3}, "slurm=3: expected a partition's name"),
        ({"inventory": "x,", "slurm": ""}, "two inventories given: inventory='x,' and slurm=''"),
        ({"progress": "yes"}, "progress='yes': expected True or False"),
    ],
)
def test_a_bad_keyword_is_a_usage_error_naming_it(
    here: Path, keywords: dict[str, Any], said: str
) -> None:
    with pytest.raises(UsageError) as caught:
        check(**keywords)
    assert caught.value.exit_code == EXIT_USAGE
    assert caught.value.message.startswith(said) and caught.value.hint


@pytest.mark.parametrize(
    ("keywords", "flags"),
    [
        ({"inventory": "missing/inv.yaml"}, ["-i", "missing/inv.yaml"]),
        ({"limit": "nohost"}, ["--limit", "nohost"]),
    ],
)
def test_a_bad_inventory_or_limit_says_what_the_cli_says(
    here: Path, keywords: dict[str, Any], flags: list[str]
) -> None:
    # A wrong inventory or pattern is the inventory's error (exit 64), as the CLI's,
    # naming the keyword where the CLI names its flag.
    with pytest.raises(InventoryError) as caught:
        check(**keywords)
    assert caught.value.exit_code == EXIT_USAGE
    cli = cpuaccel("check", *flags, cwd=here, env=inherited_env())
    assert cli.returncode == EXIT_USAGE
    assert f"error: {caught.value}" in api_text(cli.stderr)
    assert flags[0] in cli.stderr and f"{flags[0]} " not in str(caught.value)


def test_nothing_is_printed_unless_progress(here: Path, capfd: pytest.CaptureFixture[str]) -> None:
    # A plain MPI hostfile is read with a warning, which the CLI prints on stderr.
    (here / "hosts").write_text("localhost slots=1\n")
    local = {"ansible_connection": "local", "cpuaccel_python": sys.executable}
    quiet = check("hosts", extra_vars=local)
    assert quiet.hosts["localhost"].ok
    assert capfd.readouterr() == ("", "")
    loud = check("hosts", extra_vars=local, progress=True)
    assert loud.hosts["localhost"].ok
    assert "hosts is a plain MPI hostfile" in capfd.readouterr().err


# ---------------------------------------------------------------- connections
LOCAL = {"ansible_connection": "local"}


def test_only_the_head_stays_connected_and_open_at_once_is_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hosts = [Host(f"h{i}", LOCAL) for i in range(6)]
    lock = threading.Lock()
    peak = [0]
    pool = ConnectionPool(ConnectOptions())

    def fake_gather(conn: Connector, resolve: Any = ()) -> dict[str, Any]:
        with lock:
            peak[0] = max(peak[0], len(pool.open_hosts()))
        return {"hostname": conn.host.name}

    monkeypatch.setattr(checking, "gather", fake_gather)
    target = SimpleNamespace(hosts=hosts, forks=2, connect=ConnectOptions())
    with pool:
        results = checking._gather(target, None, pool, keep="h3")  # type: ignore[arg-type]
        assert [r.status for r in results] == [Status.OK] * 6
        assert [r.value for r in results] == [{"hostname": h.name} for h in hosts]
        assert pool.open_hosts() == ["h3"]
    assert peak[0] <= 2 + 1  # forks at once, and the head kept


def test_without_a_head_to_keep_every_connection_stays(monkeypatch: pytest.MonkeyPatch) -> None:
    hosts = [Host(f"h{i}", LOCAL) for i in range(3)]
    monkeypatch.setattr(checking, "gather", lambda conn, resolve=(): {})
    target = SimpleNamespace(hosts=hosts, forks=3, connect=ConnectOptions())
    with ConnectionPool(ConnectOptions()) as pool:
        checking._gather(target, None, pool)  # type: ignore[arg-type]
        assert pool.open_hosts() == ["h0", "h1", "h2"]


def test_exit_code_follows_the_cli_verdict() -> None:
    up = HostResult(Host("a", LOCAL), Status.OK, {})
    down = HostResult(Host("b", LOCAL), Status.UNREACHABLE, error="refused")
    assert CheckResult((up,), ()).exit_code == 0
    assert CheckResult((up, down), ()).exit_code == 69
    error = checking.Problem("error", "a", "torch differs")
    warning = checking.Problem("warning", "a", "clock skew")
    assert CheckResult((up,), (warning,)).ok
    assert CheckResult((up,), (error,)).exit_code == 1
