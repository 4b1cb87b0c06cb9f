"""Every inventory variable cpuaccel reads has a declared type, checked where the inventory
and -e are read, with file:line (or the -e) and exit 64: the inventory's own when it is
built, the run settings' (config/settings.py's table) when the config layer loads it."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from cpuaccel.api.keywords import parse_env
from cpuaccel.config.project import parse_project
from cpuaccel.config.settings import INVENTORY_VARIABLES
from cpuaccel.connectors.connect_options import ConnectOptions
from cpuaccel.connectors.hostkeys import host_key_policy
from cpuaccel.errors import EXIT_USAGE, InventoryError, ProjectFileError, UsageError
from cpuaccel.inventory.host import Host
from cpuaccel.inventory.inventory import Inventory, parse_extra_vars
from cpuaccel.inventory.variables import parse_bool
from testsupport.command import cpuaccel


def write(tmp_path: Path, text: str, name: str = "inventory.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


def load_error(tmp_path: Path, text: str, extra: dict[str, Any] | None = None) -> InventoryError:
    path = write(tmp_path, text)
    with pytest.raises(InventoryError) as info:
        Inventory.load(path, extra).check_declared(INVENTORY_VARIABLES)
    assert info.value.exit_code == EXIT_USAGE and info.value.hint
    return info.value


def host_with(var_line: str) -> str:
    return f"all:\n  hosts:\n    node1:\n      ansible_host: 10.0.0.1\n      {var_line}\n"


# --- bad values, each named at its line ---------------------------------------------------


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        (host_with("ansible_host_key_checking: ture"), 5, "ansible_host_key_checking must be"),
        (host_with("ansible_host_key_checking: 'nope'"), 5, "got 'nope'"),
        (host_with("ansible_host_key_checking: 2"), 5, "must be true or false"),
        (host_with("cpuaccel_ppn: four"), 5, "cpuaccel_ppn must be a whole number"),
        (host_with("cpuaccel_master_port: abc"), 5, "cpuaccel_master_port must be"),
        (host_with("cpuaccel_master_port: 70000"), 5, "must be 1 to 65535"),
        (host_with("cpuaccel_ccl_workers: many"), 5, "cpuaccel_ccl_workers must be"),
        (host_with("cpuaccel_launcher: pbs"), 5, "use one of auto, impi"),
        (host_with("cpuaccel_mixed_precision: fp16"), 5, "use one of auto, bf16"),
        (host_with("cpuaccel_env: [A, B]"), 5, "cpuaccel_env must be a mapping"),
        (host_with("cpuaccel_env: oops"), 5, "cpuaccel_env must be a mapping"),
        (host_with("cpuaccel_secret_env: oops"), 5, "cpuaccel_secret_env must be a mapping"),
        (host_with("cpuaccel_python: [1, 2]"), 5, "cpuaccel_python must be a plain string"),
        (host_with("cpuaccel_workdir: \"a\\nb\""), 5, "without control characters"),
        (host_with("cpuaccel_workdir: ../../etc"), 5, "absolute path or one below ~/"),
        (host_with("cpuaccel_workdir: work"), 5, "absolute path or one below ~/"),
        (host_with("cpuaccel_workdir: /srv/../etc"), 5, "must not climb with '..'"),
        (host_with("cpuaccel_workdir: ~/../root"), 5, "must not climb with '..'"),
        (host_with("ansible_user: -oProxyCommand=x"), 5, "not a login name"),
        (host_with("ansible_user: 'a b'"), 5, "not a login name"),
        (host_with("ansible_ssh_common_args: -o StrictHostKeyChecking=ture"), 5, "not a value"),
        (host_with("ansible_ssh_common_args: \"-o 'User=x\""), 5, "cannot be split into words"),
        (host_with("ansible_ssh_common_args: -o User=-oProxyCommand=x"), 5, "not a login name"),
        # env names: the bad key's own line, not the mapping's first
        (host_with("cpuaccel_env:\n        GOOD: 1\n        \"X;touch /tmp/p;Y\": v"), 7,
         "'X;touch /tmp/p;Y' is not a variable name"),
        (host_with("cpuaccel_secret_env:\n        1TOKEN: s"), 6, "'1TOKEN' is not a variable"),
        (host_with("cpuaccel_env: {A-B: 1}"), 5, "'A-B' is not a variable name"),
        (host_with("cpuaccel_env: {A: [1]}"), 5, "A: the value must be a plain"),
        # a credential's name in the plain environment: its own line; secret_env takes it
        (host_with("cpuaccel_env:\n        GOOD: 1\n        HF_TOKEN: hunter2"), 7,
         "cpuaccel_env HF_TOKEN looks like a credential"),
        ("all:\n  vars:\n    cpuaccel_env:\n      wandb_api_key: x\n  hosts:\n    n1:\n", 4,
         "cpuaccel_env wandb_api_key looks like a credential"),
        # a CPUACCEL_* value the ranks' runtime would refuse, refused at its own line
        (host_with("cpuaccel_env:\n        GOOD: 1\n        CPUACCEL_ATTENTION: fastest"), 7,
         "CPUACCEL_ATTENTION: 'fastest' is not a choice (attention's precision under bf16); "
         "use auto, autocast or fp32"),
        (host_with("cpuaccel_env: {CPUACCEL_TRACKERS: 'tensorboard,wandb'}"), 5,
         "CPUACCEL_TRACKERS: 'wandb' is not a choice (where ctx.log also writes)"),
        (host_with("cpuaccel_backend: nccl"), 5, "cpuaccel_backend is 'nccl'; use one of gloo"),
        # in a group's vars: that line, for every host that inherits it
        ("all:\n  vars:\n    cpuaccel_env:\n      \"é\": 1\n  hosts:\n    n1:\n", 4,
         "'é' is not a variable name"),
        # host names and ansible_host
        ("all:\n  hosts:\n    \"-oProxyCommand=x\":\n", 3, "must not start with '-'"),
        ("all:\n  hosts:\n    \"a\\nb\":\n", 3, "is not a host name"),
        ("all:\n  hosts:\n    \"a b\":\n", 3, "is not a host name"),
        ("all:\n  hosts:\n    \"n;id\":\n", 3, "is not a host name"),
        (host_with("ansible_host: -x").replace("ansible_host: 10.0.0.1\n      ", ""), 4,
         "must not start with '-'"),
        ("all:\n  hosts:\n    n1:\n      ansible_host: \"a$(id)\"\n", 4, "not a host name"),
        ("all:\n  hosts:\n    n1:\n      ansible_ssh_host: \"a\\nb\"\n", 4, "not a host name"),
        # an IPv6 scope id: an interface's name or number, never a second line or a command
        ("all:\n  hosts:\n    \"fe80::1%x\\necho aWQK|base64 -d|sh #\":\n", 3,
         "has the IPv6 scope id 'x\\necho aWQK|base64 -d|sh #'"),
        ("all:\n  hosts:\n    \"fe80::1%$(id)\":\n", 3, "scope id '$(id)'"),
        ("all:\n  hosts:\n    n1:\n      ansible_host: \"fe80::1%eth0;id\"\n", 4,
         "ansible_host 'fe80::1%eth0;id' has the IPv6 scope id"),
        ("all:\n  hosts:\n    n1:\n      ansible_ssh_host: \"fe80::1% x\"\n", 4, "scope id"),
        ("all:\n  hosts:\n    n1:\n      ansible_host: \"fe80::1%\"\n", 4, "not a host name"),
    ],
)  # fmt: skip
def test_bad_values_are_errors_at_their_line(
    tmp_path: Path, text: str, line: int, fragment: str
) -> None:
    error = load_error(tmp_path, text)
    assert error.source == str(tmp_path / "inventory.yaml")
    assert error.line == line, str(error)
    assert str(error).startswith(f"{tmp_path / 'inventory.yaml'}:{line}: "), str(error)
    assert fragment in str(error)


def test_the_settings_variables_are_checked_as_declared_from_above(tmp_path: Path) -> None:
    """The inventory layer knows only its own variables: the config layer declares the
    run settings' (check_declared), and a playbook's vars files are checked by them too."""
    path = write(tmp_path, host_with("cpuaccel_ppn: 2"))
    inventory = Inventory.load(path).check_declared(INVENTORY_VARIABLES)
    (tmp_path / "playbook" / "group_vars").mkdir(parents=True)
    write(tmp_path, "cpuaccel_ccl_workers: many\n", "playbook/group_vars/all.yaml")
    with pytest.raises(InventoryError, match="cpuaccel_ccl_workers must be a whole number"):
        inventory.with_playbook_vars(tmp_path / "playbook")
    write(tmp_path, host_with("cpuaccel_ppn: four"))
    assert Inventory.load(path).hosts["node1"].vars["cpuaccel_ppn"] == "four"


@pytest.mark.parametrize(
    ("name", "address"),
    [("node1", None), ("node-1.example.org", None), ("web_1", "10.0.0.2"),
     ("n1", "fe80::1"), ("n1", "2001:db8::5"), ("10.1.2.3", None), ("n1", "host-2"),
     ("n1", "fe80::1%eth0"), ("fe80::2%enp0s3.100", None), ("n1", "fe80::3%2")],
)  # fmt: skip
def test_good_names_and_addresses_load(tmp_path: Path, name: str, address: str | None) -> None:
    extra = f"\n      ansible_host: '{address}'" if address else ""
    inv = Inventory.load(write(tmp_path, f"all:\n  hosts:\n    '{name}':{extra}\n"))
    assert inv.hosts[name].address == (address or name)


def test_hostfile_names_are_restricted_too(tmp_path: Path) -> None:
    path = write(tmp_path, "node1\n-oProxyCommand=x\n", "hosts")
    with pytest.raises(InventoryError) as info:
        Inventory.load(path)
    assert str(info.value).startswith(f"{path}:2: ")


# --- -e -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("item", "fragment"),
    [
        ("cpuaccel_ppn=four", "-e cpuaccel_ppn: cpuaccel_ppn must be a whole number"),
        ("cpuaccel_master_port=abc", "-e cpuaccel_master_port: "),
        ("cpuaccel_env=oops", "-e cpuaccel_env: cpuaccel_env must be a mapping"),
        ("cpuaccel_secret_env=oops", "-e cpuaccel_secret_env: "),
        ("cpuaccel_ccl_workers=many", "-e cpuaccel_ccl_workers: "),
        ("ansible_host_key_checking=ture", "-e ansible_host_key_checking: "),
        ("ansible_host=-oProxyCommand=x", "-e ansible_host: "),
        ('{cpuaccel_env: {"A;B": 1}}', "-e cpuaccel_env: cpuaccel_env 'A;B' is not"),
        ("{cpuaccel_env: {API_KEY: x}}", "-e cpuaccel_env: cpuaccel_env API_KEY looks like"),
    ],
)
def test_bad_extra_vars_name_the_e(tmp_path: Path, item: str, fragment: str) -> None:
    error = load_error(tmp_path, "all:\n  hosts:\n    n1:\n", parse_extra_vars([item]))
    assert error.source is None and str(error).startswith(fragment), str(error)


def test_one_e_sets_several_variables_as_in_ansible() -> None:
    assert parse_extra_vars(["a=1 b=2"]) == {"a": 1, "b": 2}
    assert parse_extra_vars(['a="x y" b=2']) == {"a": "x y", "b": 2}
    with pytest.raises(InventoryError, match="'world' is not KEY=VALUE"):
        parse_extra_vars(["msg=hello world"])


# --- booleans and host-key checking ---------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [("true", True), ("True", True), ("YES", True), ("on", True), ("1", True), (1, True),
     (True, True), ("false", False), ("No", False), ("OFF", False), ("0", False), (0, False),
     (False, False), ("ture", None), ("", None), ("nope", None), (2, None), (None, None)],
)  # fmt: skip
def test_only_boolean_spellings_are_booleans(value: Any, expected: bool | None) -> None:
    assert parse_bool(value) is expected


@pytest.mark.parametrize(
    ("value", "checked"),
    [("false", False), ("NO", False), ("off", False), ("0", False), ("yes", True),
     ("ture", True), ("anything", True)],
)  # fmt: skip
def test_only_a_boolean_false_turns_checking_off(value: str, checked: bool) -> None:
    # Loading refuses the unknown word; a Host made by hand still fails safe (checked).
    policy = host_key_policy(Host("n", {"ansible_host_key_checking": value}), ConnectOptions())
    assert policy.check is checked


def test_accepted_spellings_load_and_decide(tmp_path: Path) -> None:
    inv = Inventory.load(write(tmp_path, host_with("ansible_host_key_checking: 'Off'")))
    assert host_key_policy(inv.hosts["node1"], ConnectOptions()).check is False


# --- the project file's env and --env ------------------------------------------------------


def test_project_env_names_are_checked_at_their_line() -> None:
    with pytest.raises(ProjectFileError) as info:
        parse_project("ppn: 2\nenv:\n  GOOD: 1\n  'X;id': 2\n", "cpuaccel.yaml")
    assert str(info.value).startswith("cpuaccel.yaml:4: env 'X;id' is not a variable name")


def test_project_env_refuses_a_credential_at_its_line() -> None:
    with pytest.raises(ProjectFileError) as info:
        parse_project("env:\n  GOOD: 1\n  DB_PASSWORD: hunter2\n", "cpuaccel.yaml")
    said = str(info.value)
    assert said.startswith("cpuaccel.yaml:3: env DB_PASSWORD looks like a credential"), said
    assert "pass --env DB_PASSWORD" in said and "hunter2" not in said


def test_secret_env_takes_credentials_and_the_plain_env_the_rest(tmp_path: Path) -> None:
    text = (
        "all:\n  hosts:\n    n1:\n  vars:\n    cpuaccel_env: {FI_PROVIDER: tcp}\n"
        "    cpuaccel_secret_env: {HF_TOKEN: t0k}\n"
    )
    inv = Inventory.load(write(tmp_path, text))
    assert inv.hosts["n1"].vars["cpuaccel_secret_env"] == {"HF_TOKEN": "t0k"}


@pytest.mark.parametrize("item", ["X;id=1", "1A=2", "A B=3", "é=1", "=1", "A"])
def test_env_flag_names_are_checked(item: str) -> None:
    with pytest.raises(UsageError, match="--env"):
        parse_env((item,))
    assert parse_env(("A_1=x y",)) == {"A_1": "x y"}


# --- no verb gives a traceback -------------------------------------------------------------

# (the verb's words, its arguments after the shared options)
VERBS = [
    (("check",), ()),
    (("sync",), ("--check",)),
    (("run",), ("--dry-run", "train.py")),
    (("config", "show"), ()),
    (("provision",), ("--list-tasks",)),
]
LOCAL = "all:\n  hosts:\n    localhost:\n      ansible_connection: local\n"


@pytest.mark.parametrize("verb", VERBS, ids=lambda v: v[0][-1])
@pytest.mark.parametrize(
    ("extra", "inventory", "fragment"),
    [
        (["-e", "cpuaccel_ppn=four"], LOCAL, "-e cpuaccel_ppn: "),
        (["-e", "cpuaccel_secret_env=oops"], LOCAL, "-e cpuaccel_secret_env: "),
        ([], LOCAL + "      cpuaccel_env: [A, B]\n", "inventory.yaml:5: host 'localhost': "),
    ],
    ids=["e-ppn", "e-secret", "inventory-env"],
)
def test_no_verb_gives_a_traceback(
    tmp_path: Path,
    verb: tuple[tuple[str, ...], tuple[str, ...]],
    extra: list[str],
    inventory: str,
    fragment: str,
) -> None:
    write(tmp_path, inventory)
    (tmp_path / "train.py").write_text("print('hi')\n")
    proc = cpuaccel(*verb[0], "-i", "inventory.yaml", *extra, *verb[1], cwd=tmp_path)
    assert proc.returncode == EXIT_USAGE, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith("error: " + fragment), proc.stderr
