"""The launch settings as keywords (cpuaccel.launch, cpuaccel.notebook.launch): every
setting of the table is one, settled as its flag would be, and a bad value is refused
with the CLI's own message and fix."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

import cpuaccel
from cpuaccel.api.keywords import setting_keywords
from cpuaccel.api.launching import settle
from cpuaccel.api.output import quiet_unless
from cpuaccel.api.target import HostKeywords
from cpuaccel.config.settings import FLAG, RUN, TABLE
from cpuaccel.errors import InsecureWarning, InventoryError, UsageError
from testsupport.command import cpuaccel as cpuaccel_command

# A value each keyword takes, and what the settled setting then holds (None: the same).
VALUES: dict[str, tuple[Any, Any]] = {
    "head": ("localhost", None),
    "num_processes": (2, None),
    "nodes": (1, None),
    "ppn": (2, None),
    "launcher": ("mpich", None),
    "master_port": (29612, None),
    "mixed_precision": ("fp32", "no"),  # fp32 is written "no", as Accelerate reads it
    "ccl_workers": (2, None),
    "python": (sys.executable, None),
    "workdir": ("~/cpuaccel-api-work", None),
    "env": ({"OMP_PROC_BIND": "close"}, None),
    "exclude": (["*.tmp"], None),
    "min_nodes": (1, None),
    "max_restarts": (2, None),
    "restart_delay": (1.5, None),
    "hang_timeout": (30, 30.0),
    "rendezvous_timeout": (30, 30.0),
    "network": ("10.1.2.3/16", "10.1.0.0/16"),
    "launcher_args": (["-prepend-rank"], ("-prepend-rank",)),
    "mpirun": ("/usr/bin/mpirun.mpich", None),
    "backend": ("gloo", None),
    "grad_reduce": ("library", None),
    "weights": ("bf16", None),
    "deterministic": (True, None),
    "fi_provider": ("tcp", None),
    "secret_env": ({"HF_TOKEN": "not-a-real-token"}, None),
    "allocator": ("jemalloc", None),
    "templates": ("job-templates", None),
    "timeout": (60, 60.0),
    "sync": (False, None),
    "module": (True, None),
    "no_python": (True, None),
}


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project folder with no inventory or project file: the hosts are this machine."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CPUACCEL_INVENTORY", raising=False)
    return tmp_path


def test_every_setting_of_the_table_is_a_keyword() -> None:
    names = {entry.name for entry in setting_keywords(RUN)}
    assert names == set(VALUES)
    # Only what is no setting of a run is left out: the derived hosts and each host's own
    # env, submit's Slurm block, and the host keywords of their own (inventory=, limit=).
    assert {e.name for e in TABLE} - names == {"hosts", "host_env", "slurm", "inventory", "limit"}


@pytest.mark.parametrize("name", sorted(VALUES))
def test_each_keyword_is_settled_as_its_flag_or_variable(here: Path, name: str) -> None:
    value, expected = VALUES[name]
    _, settings, flags = settle(HostKeywords(), {name: value})
    if name in ("module", "no_python"):  # the script's kind: in the flags, not a field
        assert flags[name] is True
        return
    if name == "num_processes":  # Accelerate's total: per node on the one node
        assert (settings.ppn.value, settings.ppn.source) == (2, FLAG)
        return
    setting = getattr(settings, name)
    want = value if expected is None else expected
    if name in ("env", "secret_env"):
        assert dict(setting.value) == want
    elif name == "exclude":
        assert setting.value == want
    else:
        assert setting.value == want, (name, setting)
    assert setting.source == FLAG, setting  # a keyword is given as its flag (or -e) is


def test_a_keyword_is_named_as_the_cli_names_its_flag(here: Path) -> None:
    _, settings, _ = settle(HostKeywords(), {"ppn": 2, "python": sys.executable})
    assert settings.ppn.where == "--ppn"
    assert settings.python.where == "-e cpuaccel_python"


def cli_error(*flags: str) -> str:
    """The error line `cpuaccel run FLAGS train.py` prints, with its fix line."""
    done = cpuaccel_command("run", *flags, "train.py", prelude="pass")  # named cpuaccel
    assert done.returncode == 64, done
    return done.stderr.strip().removeprefix("error: ")


@pytest.mark.parametrize(
    ("keywords", "flags"),
    [
        ({"ppn": 0}, ("--ppn", "0")),
        ({"mixed_precision": "fp8"}, ("--mixed-precision", "fp8")),
        ({"master_port": 70000}, ("--master-port", "70000")),
        ({"nodes": "two"}, ("--nodes", "two")),
        ({"restart_delay": -1}, ("--restart-delay", "-1")),
        ({"max_restarts": 5000}, ("--max-restarts", "5000")),
        ({"env": {"API_KEY": "s3cr3t"}}, ("--env", "API_KEY=s3cr3t")),
        ({"env": ["1BAD"]}, ("--env", "1BAD")),
    ],
)
def test_a_bad_value_raises_the_clis_message_and_fix(
    here: Path, keywords: dict[str, Any], flags: tuple[str, ...]
) -> None:
    (here / "train.py").write_text("print('hi')\n")
    with pytest.raises(UsageError) as raised:
        cpuaccel.launch("train.py", **keywords)
    assert str(raised.value) == cli_error(*flags)
    assert "s3cr3t" not in str(raised.value)


@pytest.mark.parametrize(
    ("keywords", "said"),
    [
        ({"ppm": 2}, "ppm=: no such setting"),
        ({"deterministic": "yes"}, "deterministic='yes': expected True or False"),
        ({"ppn": True}, "'--ppn': True is not"),
        ({"env": "A=1"}, "env=: expected a mapping"),
        ({"launcher_args": 3}, "launcher_args=3: expected a string or a list"),
        ({"nodes": (3, 2)}, "--nodes 3:2: MIN is above MAX"),
        ({"forks": 0}, "forks=0: expected a whole number from 1 to 1024"),
        ({"inventory": 5}, "inventory=5: expected a path"),
        ({"progress": "yes"}, "progress='yes': expected True or False"),
        ({"timeout": float("nan")}, "'--timeout': nan is not a number of seconds"),
    ],
)
def test_a_keyword_the_cli_has_no_flag_for_is_refused_in_one_line(
    here: Path, keywords: dict[str, Any], said: str
) -> None:
    (here / "train.py").write_text("print('hi')\n")
    with pytest.raises(UsageError) as raised:
        cpuaccel.launch("train.py", **keywords)
    assert said in raised.value.message
    assert raised.value.hint and "\n" not in raised.value.message


def test_a_setting_an_inventory_variable_gives_is_checked_where_e_is(here: Path) -> None:
    with pytest.raises(InventoryError) as raised:
        settle(HostKeywords(), {"workdir": "../escape"})
    assert raised.value.message.startswith("-e cpuaccel_workdir: ")


def test_nodes_min_max_is_a_pair_or_text(here: Path) -> None:
    for given in ((1, 1), "1:1"):
        _, settings, _ = settle(HostKeywords(), {"nodes": given})
        assert settings.nodes.value == 1


def test_an_opt_out_of_host_key_checks_warns_though_nothing_is_printed(
    here: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    (here / "inventory.ini").write_text("node9 ansible_host=192.0.2.9\n")
    with (
        pytest.warns(InsecureWarning, match=r"host keys are not checked for node9"),
        quiet_unless(False),  # as every API call runs
    ):
        settle(HostKeywords("inventory.ini", host_key_checking=False), {})
    assert capfd.readouterr() == ("", "")
