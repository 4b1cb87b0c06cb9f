"""rsync as the connectors run it (connectors/rsync.py): a local push and its failures,
``--`` before every host and path, the secluded-args flag of the installed rsync, the
home expanded where no shell will, rsync's ssh through ProxyJump hops with the target's
host-key policy (a refused key a host-key error naming the hop), and the -vv line."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest

from cpuaccel.connectors import rsync
from cpuaccel.connectors.connect_options import ConnectOptions
from cpuaccel.connectors.hostkeys import (
    add_key_hint,
)
from cpuaccel.connectors.local import LocalConnector
from cpuaccel.connectors.openssh import refused_key
from cpuaccel.connectors.ssh import SSHConnector
from cpuaccel.errors import HostKeyError
from cpuaccel.inventory.host import Host

pytestmark = pytest.mark.usefixtures("home")

CHECKED = ConnectOptions()


def test_local_rsync_pushes_a_tree_and_reports_failures(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "a.txt").write_text("a")
    (src / "b.txt").write_text("bb")
    conn = LocalConnector(Host("localhost", {"ansible_connection": "local"}), CHECKED)
    result = conn.rsync(["-a", "--out-format=%n"], f"{src}/", str(tmp_path / "dest"))
    assert result.ok and {"b.txt", "sub/a.txt"} <= set(result.lines)
    assert (tmp_path / "dest" / "sub" / "a.txt").read_text() == "a"
    # A file list on stdin, and lines streamed to on_line instead of collected.
    seen: list[str] = []
    listed = conn.rsync(
        ["-a", "--from0", "--files-from=-", "--out-format=%l"],
        f"{src}/",
        str(tmp_path / "only"),
        stdin=b"b.txt\0",
        on_line=seen.append,
    )
    assert listed.ok and listed.lines == [] and seen == ["2"]
    assert not (tmp_path / "only" / "sub").exists()
    failed = conn.rsync(["-a"], str(tmp_path / "missing") + "/", str(tmp_path / "dest"))
    assert not failed.ok and failed.exit_code == 23 and "code 23" in failed.error


def test_rsync_line_for_vv_names_a_few_sources_and_counts_the_rest() -> None:
    from cpuaccel.connectors.commandline import shown_line
    from cpuaccel.connectors.rsync import rsync_argv, shown_rsync

    many = rsync_argv(["-a"], [f"/s/./f{i}" for i in range(10)], "10.0.0.1:/d/")
    line = shown_rsync(many)
    assert line.endswith("-- /s/./f0 /s/./f1 /s/./f2 10.0.0.1:/d/ (7 more sources)"), line
    assert "f3" not in line
    one = rsync_argv(["-a"], "/s/", "/d/")
    assert shown_rsync(one) == shown_line(one)


def captured_rsync(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    calls: list[list[str]] = []

    def fake(argv: list[str], **_: Any) -> rsync.RsyncResult:
        calls.append(list(argv))
        return rsync.RsyncResult(0, [], "")

    monkeypatch.setattr("cpuaccel.connectors.base.run_rsync", fake)
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
        "cpuaccel.connectors.base.run_rsync", lambda *_, **__: rsync.RsyncResult(255, [], "", said)
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
