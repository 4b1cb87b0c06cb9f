"""Issue 12 (items 6, 10): `--` before every host and path rsync and ssh are given,
rsync's secluded args, fix hints for non-22 ports, and the system known_hosts."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path
from typing import Any

import paramiko
import pytest

from cpuaccel.connectors import hostkeys, rsync
from cpuaccel.connectors.base import ConnectOptions
from cpuaccel.connectors.hostkeys import add_key_hint, forget_key_hint, host_key_policy
from cpuaccel.connectors.local import LocalConnector
from cpuaccel.connectors.openssh import remote_spec
from cpuaccel.connectors.ssh import SSHConnector
from cpuaccel.errors import HostError
from cpuaccel.inventory.host import Host

CHECKED = ConnectOptions()


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home" / ".ssh").mkdir(parents=True)
    return tmp_path / "home"


def captured_rsync(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    calls: list[list[str]] = []

    def fake(argv: list[str], **_: Any) -> rsync.RsyncResult:
        calls.append(list(argv))
        return rsync.RsyncResult(0, [], "")

    monkeypatch.setattr("cpuaccel.connectors.ssh.run_rsync", fake)
    monkeypatch.setattr("cpuaccel.connectors.local.run_rsync", fake)
    return calls


def test_ssh_rsync_ends_options_before_the_host_and_the_paths(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = captured_rsync(monkeypatch)
    host = Host("n1", {"ansible_host": "10.0.0.2", "ansible_port": 2222})
    SSHConnector(host, CHECKED).rsync(["-a"], "/src/", "/dst dir/")
    (argv,) = calls
    assert argv[:2] == ["rsync", *rsync.secluded_flag()][:2]
    assert argv[-3:] == ["--", "/src/", "10.0.0.2:/dst dir/"]
    ssh = shlex.split(argv[argv.index("-e") + 1])
    assert ssh[0] == "ssh" and ssh[-1] == "--"  # rsync appends the host after it
    assert ssh[ssh.index("-p") + 1] == "2222"


def test_local_rsync_expands_the_home_itself(monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    calls = captured_rsync(monkeypatch)
    LocalConnector(Host("localhost", {"ansible_connection": "local"}), CHECKED).rsync(
        ["-a"], "/src/", "~/dst"
    )
    assert calls[0][-3:] == ["--", "/src/", f"{home}/dst"]


@pytest.mark.parametrize(
    ("version", "flag"),
    [("3.5.0", ("--secluded-args",)), ("3.2.6", ("--secluded-args",)),
     ("3.2.5", ("--protect-args",)), ("3.0.9", ("--protect-args",)), ("2.6.9", ())],
)  # fmt: skip
def test_secluded_flag_follows_the_installed_rsync(
    monkeypatch: pytest.MonkeyPatch, version: str, flag: tuple[str, ...]
) -> None:
    out = f"rsync  version {version}  protocol version 31\n"
    seen: list[list[str]] = []

    def fake_run(argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        seen.append(argv)
        return subprocess.CompletedProcess(argv, 0, out, "")

    monkeypatch.setattr(rsync.subprocess, "run", fake_run)
    rsync.secluded_flag.cache_clear()
    try:
        assert rsync.secluded_flag() == flag
        assert rsync.secluded_flag() == flag  # asked once
        assert seen == [["rsync", "--version"]]
    finally:
        rsync.secluded_flag.cache_clear()


@pytest.mark.parametrize(
    ("address", "path", "spec"),
    [("n1", "~/cpuaccel", "n1:cpuaccel"), ("n1", "~", "n1:."), ("n1", "~/", "n1:."),
     ("n1", "/opt/a b", "n1:/opt/a b"), ("fe80::1", "~/x", "[fe80::1]:x"),
     ("n1", "rel/x", "n1:rel/x")],
)  # fmt: skip
def test_remote_spec_writes_the_home_as_the_login_folder(
    address: str, path: str, spec: str
) -> None:
    # With --secluded-args no shell expands "~" on the node: the path is said relative.
    assert remote_spec(Host("n", {"ansible_host": address}), path) == spec


def test_remote_spec_refuses_another_users_home() -> None:
    with pytest.raises(HostError, match="absolute path"):
        remote_spec(Host("n1"), "~bob/x")


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
