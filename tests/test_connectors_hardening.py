"""Issue 12 (items 4, 6, 10): `--` before every host and path rsync and ssh are given,
rsync's secluded args, fix hints for non-22 ports, the system known_hosts, and rsync's
ssh through ProxyJump hops."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import paramiko
import pytest

from cpuaccel.connectors import hostkeys, rsync
from cpuaccel.connectors.connect_options import ConnectOptions
from cpuaccel.connectors.hostkeys import add_key_hint, forget_key_hint, host_key_policy
from cpuaccel.connectors.local import LocalConnector
from cpuaccel.connectors.openssh import jump_hops, refused_key, remote_spec
from cpuaccel.connectors.ssh import SSHConnector
from cpuaccel.connectors.transports import hops
from cpuaccel.errors import HostError, HostKeyError
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


def _expand(command: str, host: str, port: str) -> str:
    """ssh's expansion of the %-tokens of a ProxyCommand (%%, %h, %p)."""
    return re.sub(r"%[%hp]", lambda m: {"%%": "%", "%h": host, "%p": port}[m.group()], command)


def _proxy_command(argv: list[str]) -> str:
    return next(w for w in argv if w.startswith("ProxyCommand=")).split("=", 1)[1]


def test_rsyncs_ssh_takes_the_proxyjump_hops_with_the_targets_host_key_policy(
    monkeypatch: pytest.MonkeyPatch, home: Path
) -> None:
    """Each hop's ssh gets the target's policy and known_hosts files (a ProxyJump left
    to ssh_config would check them against ~/.ssh/known_hosts alone), and the hops of
    the paramiko path: ProxyJump of the target, then of the hop, as Fabric follows them."""
    (home / ".ssh" / "config").write_text(
        "Host 10.0.0.2\n    ProxyJump hopper@10.0.0.1:2200\n"
        "Host 10.0.0.1\n    ProxyJump 10.0.0.5\n    IdentityFile ~/hop key\n"
    )
    calls = captured_rsync(monkeypatch)
    host = Host("n1", {"ansible_host": "10.0.0.2", "cpuaccel_known_hosts": "~/my kh"})
    SSHConnector(host, CHECKED).rsync(["-a"], "/src/", "/dst/")
    target = shlex.split(calls[0][calls[0].index("-e") + 1])
    policy = [
        "StrictHostKeyChecking=yes",
        f'UserKnownHostsFile={home}/.ssh/known_hosts "{home}/my kh"',
    ]
    assert all(option in target for option in policy)
    hop = shlex.split(_expand(_proxy_command(target), "10.0.0.2", "22"))
    assert hop[0] == "ssh" and hop[-4:] == ["-W", "[10.0.0.2]:22", "--", "10.0.0.1"]
    assert hop[hop.index("-p") + 1] == "2200" and hop[hop.index("-l") + 1] == "hopper"
    assert hop[hop.index("-i") + 1] == f"{home}/hop key"
    assert all(option in hop for option in [*policy, "BatchMode=yes"])
    # The hop's own hop: its %-tokens survived the first expansion, to be the hop's.
    outer = shlex.split(_expand(_proxy_command(hop), "10.0.0.1", "2200"))
    assert outer[-4:] == ["-W", "[10.0.0.1]:2200", "--", "10.0.0.5"]
    assert outer[outer.index("-p") + 1] == "22"
    assert all(option in outer for option in [*policy, "BatchMode=yes"])
    assert not any(word.startswith("ProxyCommand=") for word in outer)
    # No hop: no ProxyCommand (ssh_config's own, if any, is ssh's).
    calls.clear()
    SSHConnector(Host("n2", {"ansible_host": "10.0.0.7"}), CHECKED).rsync(["-a"], "/s/", "/d/")
    assert "ProxyCommand" not in calls[0][calls[0].index("-e") + 1]


def test_a_key_refused_by_rsyncs_ssh_is_a_host_key_error_naming_the_hop(
    monkeypatch: pytest.MonkeyPatch, home: Path
) -> None:
    (home / ".ssh" / "config").write_text("Host 10.0.0.2\n    ProxyJump 10.0.0.1:2200\n")
    said = (
        "Host key for [10.0.0.1]:2200 has changed and you have requested strict checking.\n"
        "Host key verification failed.\nrsync: connection unexpectedly closed\n"
    )
    monkeypatch.setattr(
        "cpuaccel.connectors.ssh.run_rsync", lambda *_, **__: rsync.RsyncResult(255, [], "", said)
    )
    conn = SSHConnector(Host("n1", {"ansible_host": "10.0.0.2"}), CHECKED)
    with pytest.raises(HostKeyError) as refused:
        conn.rsync(["-a"], "/src/", "/dst/")
    assert refused.value.reason == (
        "host key of the ProxyJump hop 10.0.0.1 has CHANGED since it was recorded (rsync's ssh)"
    )
    assert "ssh-keygen -R '[10.0.0.1]:2200'" in (refused.value.hint or "")
    unknown = "No ED25519 host key is known for 10.0.0.2 and you have requested strict checking."
    assert refused_key(unknown, []) == (
        "host key of 10.0.0.2 is not known (rsync's ssh)",
        add_key_hint("10.0.0.2", 22),
    )
    assert refused_key("rsync error: unexplained error (code 255)", []) is None


def test_proxyjump_hops_are_taken_in_openssh_order_by_both_paths(home: Path) -> None:
    """``ProxyJump a,b``: a first, then b, then the node (OpenSSH's order; Fabric's own
    reading turns it around), for paramiko's chain and rsync's ssh alike."""
    (home / ".ssh" / "config").write_text(
        "Host 10.0.0.9\n    ProxyJump ann@10.0.0.1,10.0.0.2:2200\n"
        "Host 10.0.0.1\n    ProxyJump 10.0.0.7\n"
    )
    host = Host("n9", {"ansible_host": "10.0.0.9"})
    addresses = [(hop.address, hop.port, hop.user) for hop in jump_hops(host)]
    assert addresses[:2] == [("10.0.0.2", 2200, addresses[0][2]), ("10.0.0.1", 22, "ann")]
    assert addresses[2][:2] == ("10.0.0.7", 22)  # the first hop's own, from its config
    conn = SSHConnector(host, CHECKED)._connection()
    assert [hop.host for hop in hops(conn)] == ["10.0.0.2", "10.0.0.1", "10.0.0.7"]
    direct = SSHConnector(Host("n8", {"ansible_host": "10.0.0.8"}), CHECKED)._connection()
    assert direct.gateway is False
