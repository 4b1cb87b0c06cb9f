"""One host-key policy for paramiko and OpenSSH (connectors/hostkeys.py): what decides it
and what is said of an opt-out, the known_hosts files read (the user's, the
inventory's, the system's, paths with spaces), and the fix hints, which name the port."""

from __future__ import annotations

from pathlib import Path

import paramiko
import pytest

from cpuaccel.connectors import hostkeys
from cpuaccel.connectors.choose import connector_for
from cpuaccel.connectors.connect_options import ConnectOptions
from cpuaccel.connectors.hostkeys import (
    add_key_hint,
    forget_key_hint,
    host_key_policy,
    opt_out_warnings,
)
from cpuaccel.connectors.ssh import SSHConnector
from cpuaccel.errors import HostError
from cpuaccel.inventory.host import Host

pytestmark = pytest.mark.usefixtures("home")

CHECKED = ConnectOptions()
UNCHECKED = ConnectOptions(host_key_checking=False)


@pytest.mark.parametrize(
    ("vars", "options", "check", "why"),
    [
        ({}, CHECKED, True, None),
        ({"ansible_host_key_checking": False}, CHECKED, False, "ansible_host_key_checking"),
        ({"ansible_host_key_checking": "yes"}, CHECKED, True, None),
        (
            {"ansible_ssh_common_args": "-o StrictHostKeyChecking=no"},
            CHECKED,
            False,
            "StrictHostKeyChecking=no in ansible_ssh_common_args",
        ),
        ({"ansible_ssh_common_args": "-o StrictHostKeyChecking=yes"}, CHECKED, True, None),
        ({}, UNCHECKED, False, "--no-host-key-checking"),
        # The command line wins over the inventory, either way.
        ({"ansible_host_key_checking": False}, ConnectOptions(host_key_checking=True), True, None),
    ],
)
def test_one_policy_decides_for_paramiko_and_openssh(
    vars: dict[str, object], options: ConnectOptions, check: bool, why: str | None
) -> None:
    host = Host("n1", vars)
    policy = host_key_policy(host, options)
    assert policy.check is check
    assert (policy.opted_out_by is None) is (why is None)
    if why is not None:
        assert why in str(policy.opted_out_by)
    argv = connector_for(host, options).ssh_argv()
    assert ("StrictHostKeyChecking=yes" in argv) is check
    assert ("UserKnownHostsFile=/dev/null" in argv) is not check


def test_known_hosts_files_are_the_users_and_the_inventorys(home: Path) -> None:
    host = Host("n1", {"cpuaccel_known_hosts": "~/cluster_known_hosts"})
    policy = host_key_policy(host, CHECKED)
    assert policy.known_hosts == [f"{home}/.ssh/known_hosts", f"{home}/cluster_known_hosts"]
    argv = SSHConnector(host, CHECKED).ssh_argv()
    assert f"UserKnownHostsFile={home}/.ssh/known_hosts {home}/cluster_known_hosts" in argv


def test_an_opt_out_is_printed_with_its_reason() -> None:
    hosts = [Host(f"n{i}", {"ansible_host_key_checking": False}) for i in range(8)]
    hosts += [Host("checked"), Host("here", {"ansible_connection": "local"})]
    assert opt_out_warnings(hosts[-2:], CHECKED) == []
    (line,) = opt_out_warnings(hosts, CHECKED)
    assert "n0, n1, n2, n3 and 4 more (ansible_host_key_checking: false)" in line
    (flag,) = opt_out_warnings([Host("checked")], UNCHECKED)
    assert "checked (--no-host-key-checking)" in flag


@pytest.mark.parametrize(
    ("address", "port", "scan", "forget"),
    [("n1", 22, "ssh-keyscan n1 >>", "ssh-keygen -R n1;"),
     ("10.0.0.2", 2222, "ssh-keyscan -p 2222 10.0.0.2 >>", "ssh-keygen -R '[10.0.0.2]:2222';"),
     ("fe80::1", 2200, "ssh-keyscan -p 2200 fe80::1 >>", "ssh-keygen -R '[fe80::1]:2200';")],
)  # fmt: skip
def test_fix_hints_name_the_port(address: str, port: int, scan: str, forget: str) -> None:
    assert scan in add_key_hint(address, port)
    assert forget in forget_key_hint(address, port)


def test_unknown_key_hint_names_the_port_of_the_host() -> None:
    host = Host("n1", {"ansible_host": "10.0.0.2", "ansible_port": 2222})
    client = paramiko.SSHClient()
    SSHConnector(host, CHECKED)._apply(host_key_policy(host, CHECKED), client)
    key = paramiko.ECDSAKey.generate()
    with pytest.raises(HostError) as info:
        client._policy.missing_host_key(client, "[10.0.0.2]:2222", key)
    assert "ssh-keyscan -p 2222 10.0.0.2 >>" in str(info.value)


def test_paramiko_reads_the_system_known_hosts_too(
    tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    system = tmp_path / "ssh_known_hosts"
    key = paramiko.ECDSAKey.generate()
    system.write_text(f"10.0.0.9 {key.get_name()} {key.get_base64()}\n")
    (home / ".ssh" / "known_hosts").write_text("")
    monkeypatch.setattr(hostkeys, "SYSTEM_KNOWN_HOSTS", str(system))
    host = Host("n9", {"ansible_host": "10.0.0.9"})
    client = paramiko.SSHClient()
    SSHConnector(host, CHECKED)._apply(host_key_policy(host, CHECKED), client)
    found = client._system_host_keys.lookup("10.0.0.9")
    assert found is not None and found[key.get_name()] == key


def test_known_hosts_paths_with_spaces_stay_one_file(home: Path) -> None:
    host = Host("n1", {"cpuaccel_known_hosts": "~/my files/kh"})
    argv = SSHConnector(host, CHECKED).ssh_argv()
    value = next(word for word in argv if word.startswith("UserKnownHostsFile="))
    assert value == f'UserKnownHostsFile={home}/.ssh/known_hosts "{home}/my files/kh"'
