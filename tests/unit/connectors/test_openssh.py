"""The ssh argv and its rules (connectors/openssh.py): a port only where the inventory
sets one (else ssh_config's, else 22), one keepalive setting with paramiko, the remote
spec (IPv6 in brackets, the home as the login folder, no other user's home), a proxy
refused, and ProxyJump hops taken in OpenSSH's order by both paths."""

from __future__ import annotations

from pathlib import Path

import pytest

from cpuaccel.connectors.connect_options import KEEPALIVE_COUNT, KEEPALIVE_INTERVAL, ConnectOptions
from cpuaccel.connectors.local import LocalConnector
from cpuaccel.connectors.openssh import jump_hops, port_of, remote_spec
from cpuaccel.connectors.ssh import SSHConnector
from cpuaccel.connectors.transports import hops
from cpuaccel.errors import HostError
from cpuaccel.inventory.host import Host

pytestmark = pytest.mark.usefixtures("home")

CHECKED = ConnectOptions()


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
