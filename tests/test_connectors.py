"""The transport boundary: one host-key policy, one ssh argv, one rsync, one port rule."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import paramiko
import pytest

from cpuaccel import templating
from cpuaccel.connectors.choose import connector_for
from cpuaccel.connectors.commandline import quote
from cpuaccel.connectors.connect_options import KEEPALIVE_COUNT, KEEPALIVE_INTERVAL, ConnectOptions
from cpuaccel.connectors.hostkeys import host_key_policy, opt_out_warnings
from cpuaccel.connectors.local import LocalConnector
from cpuaccel.connectors.openssh import port_of, remote_spec
from cpuaccel.connectors.ssh import SSHConnector, SSHProcess
from cpuaccel.errors import CommandTimeout, HostError, Unreachable
from cpuaccel.inventory.host import Host
from cpuaccel.jobs import rundir
from cpuaccel.jobs.plan import RunPlan

CHECKED = ConnectOptions()
UNCHECKED = ConnectOptions(host_key_checking=False)


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A HOME of the test's own, so that the user's ~/.ssh/config does not leak in."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home" / ".ssh").mkdir(parents=True)
    return tmp_path / "home"


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


def test_ssh_argv_passes_only_a_port_the_inventory_sets() -> None:
    plain = LocalConnector(Host("n1", {"ansible_user": "train"}), CHECKED).ssh_argv()
    assert plain[:5] == ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10"]
    assert "-p" not in plain and plain[plain.index("-l") + 1] == "train"
    for vars in ({"ansible_port": 22}, {"ansible_ssh_common_args": "-o Port=2200"}):
        argv = SSHConnector(Host("n1", vars), CHECKED).ssh_argv()
        assert argv[argv.index("-p") + 1] == str(Host("n1", vars).port)


def test_port_is_the_inventorys_else_ssh_configs_else_22(home: Path) -> None:
    assert Host("n1").port is None
    assert port_of(Host("n1")) == 22
    (home / ".ssh" / "config").write_text("Host n1\n    Port 2222\n")
    assert port_of(Host("n1")) == 2222
    assert port_of(Host("other", {"ansible_host": "n1"})) == 2222  # looked up by address
    assert port_of(Host("n1", {"ansible_port": 2300})) == 2300
    assert port_of(Host("n2")) == 22


def test_remote_spec_brackets_ipv6() -> None:
    assert remote_spec(Host("a", {"ansible_host": "fe80::1"}), "/x") == "[fe80::1]:/x"
    assert remote_spec(Host("a", {"ansible_host": "10.0.0.1"}), "/x") == "10.0.0.1:/x"


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


def test_one_quote_filter_for_playbooks_and_job_templates() -> None:
    assert templating.environment().filters["quote"] is quote
    assert templating.render_text("{{ x | quote }}", {"x": "a b'c"}) == "'a b'\"'\"'c'"
    assert quote(None) == "None" and quote(2) == "2"
    # run's job templates read only the plan's templates folder (none: cpuaccel's own)
    plan = cast(RunPlan, SimpleNamespace(templates=None))
    jobs = rundir._environment(plan)
    assert jobs.filters["quote"] is quote and "shquote" not in jobs.filters


def test_a_broken_ssh_config_port_is_an_error_of_the_host(home: Path) -> None:
    (home / ".ssh" / "config").write_text("Host n1\n    Port twenty\n")
    with pytest.raises(HostError, match="not a number"):
        port_of(Host("n1"))


def test_openssh_and_paramiko_share_one_keepalive_setting() -> None:
    argv = SSHConnector(Host("n1"), CHECKED).ssh_argv()
    options = {argv[i + 1] for i, word in enumerate(argv) if word == "-o"}
    assert f"ServerAliveInterval={KEEPALIVE_INTERVAL}" in options
    assert f"ServerAliveCountMax={KEEPALIVE_COUNT}" in options
    tuned = SSHConnector(Host("n1"), ConnectOptions(keepalive_interval=2, keepalive_count=4))
    assert {"ServerAliveInterval=2", "ServerAliveCountMax=4"} <= set(tuned.ssh_argv())
    assert tuned.options.keepalive_window == 8


class _FakeTransport:
    def __init__(self, active: bool) -> None:
        self.active = active

    def is_active(self) -> bool:
        return self.active


class _FakeChannel:
    """What SSHProcess.wait reads of a paramiko channel."""

    def __init__(self, status: int | None, transport_active: bool) -> None:
        self.status_event = threading.Event()
        self.exit_status = -1
        if status is not None:
            self.exit_status = status
            self.status_event.set()
        self._transport = _FakeTransport(transport_active)

    def get_transport(self) -> _FakeTransport:
        return self._transport


def test_a_process_whose_connection_died_names_its_node() -> None:
    # A dead transport closes its channels: the status event is set, with no status.
    chan = _FakeChannel(None, transport_active=False)
    chan.status_event.set()
    proc = SSHProcess(cast(paramiko.Channel, chan), "node2", CHECKED)
    with pytest.raises(Unreachable, match=r"^node2: the connection was lost") as info:
        proc.wait(1)
    assert f"after {CHECKED.keepalive_window} s" in str(info.value)
    # Killed by a signal on a live connection: no status either, but not a lost node.
    chan = _FakeChannel(None, transport_active=True)
    chan.status_event.set()
    assert SSHProcess(cast(paramiko.Channel, chan), "node2", CHECKED).wait(1) == -1
    chan = _FakeChannel(3, transport_active=True)
    assert SSHProcess(cast(paramiko.Channel, chan), "node2", CHECKED).wait(1) == 3


class _DeadChannel(_FakeChannel):
    """A channel whose transport's socket closed under it: paramiko raises EOFError."""

    def close(self) -> None:
        raise EOFError

    def sendall(self, data: bytes) -> None:
        raise EOFError


def test_a_channel_whose_socket_closed_closes_quietly_and_refuses_input() -> None:
    """A failed sudo's clean-up closes the agent's channel on a connection the node had
    dropped: paramiko's EOFError escaped, masking the become error as exit 130."""
    proc = SSHProcess(cast(paramiko.Channel, _DeadChannel(None, False)), "node2", CHECKED)
    proc.close()
    with pytest.raises(BrokenPipeError, match="input is closed"):
        proc.send(b"x")


def test_waiting_for_an_exit_status_is_bounded() -> None:
    chan = _FakeChannel(None, transport_active=True)
    proc = SSHProcess(cast(paramiko.Channel, chan), "node2", CHECKED)
    started = time.monotonic()
    with pytest.raises(CommandTimeout, match=r"^node2: no exit status 0.2 s"):
        proc.wait(0.2)
    assert time.monotonic() - started < 2
    local = LocalConnector(Host("localhost", {"ansible_connection": "local"}), CHECKED)
    waiting = local.start(["cat"])  # ends when its stdin closes
    try:
        with pytest.raises(CommandTimeout, match=r"^localhost: no exit status"):
            waiting.wait(0.2)
    finally:
        waiting.close()
    assert waiting.wait(10) == 0


@pytest.mark.parametrize("option", ["ProxyJump=jump", "ProxyCommand=nc %h %p"])
def test_a_proxy_in_ansible_ssh_args_is_refused_naming_the_host(option: str) -> None:
    host = Host("n1", {"ansible_host": "192.0.2.1", "ansible_ssh_common_args": f"-o '{option}'"})
    with pytest.raises(Unreachable, match=r"^n1: .* in ansible_ssh_common_args is not supported"):
        SSHConnector(host, CHECKED).connect()  # refused before any connection


def test_rsync_line_for_vv_names_a_few_sources_and_counts_the_rest() -> None:
    from cpuaccel.connectors.commandline import shown_line
    from cpuaccel.connectors.rsync import rsync_argv, shown_rsync

    many = rsync_argv(["-a"], [f"/s/./f{i}" for i in range(10)], "10.0.0.1:/d/")
    line = shown_rsync(many)
    assert line.endswith("-- /s/./f0 /s/./f1 /s/./f2 10.0.0.1:/d/ (7 more sources)"), line
    assert "f3" not in line
    one = rsync_argv(["-a"], "/s/", "/d/")
    assert shown_rsync(one) == shown_line(one)
