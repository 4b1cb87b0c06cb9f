"""The OpenSSH connector's pure parts: which hosts get a kept master, the socket's name
and folder (hostile folders refused), the argv, ssh's failures as cpuaccel's errors,
and the known_hosts lookup that gives the run's known_hosts its keys."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from cpuaccel.connectors import controlpath, known_lines
from cpuaccel.connectors.choose import connector_for, keeps_connection
from cpuaccel.connectors.connect_options import ConnectOptions
from cpuaccel.connectors.openssh_session import OpenSSHConnector
from cpuaccel.connectors.ssh import SSHConnector
from cpuaccel.errors import HostKeyError, Unreachable
from cpuaccel.inventory.host import Host

KEEP = ConnectOptions(keep=True)


@pytest.fixture(autouse=True)
def home(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A home of its own (short, as a socket's path must be): the control folder is
    made below it."""
    folder = Path(tempfile.mkdtemp(prefix="cpxh-", dir="/tmp"))
    monkeypatch.setenv("HOME", str(folder))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


# ---------------------------------------------------------------- which hosts


@pytest.mark.skipif(shutil.which("ssh") is None, reason="no ssh binary")
def test_check_and_sync_hosts_get_a_kept_master_others_paramiko() -> None:
    assert isinstance(connector_for(Host("n1"), KEEP), OpenSSHConnector)
    ssh = Host("n1", {"ansible_connection": "ssh"})
    assert isinstance(connector_for(ssh, KEEP), OpenSSHConnector)
    # run and provision do not ask (options.keep False): paramiko, as before.
    assert type(connector_for(Host("n1"), ConnectOptions())) is SSHConnector
    paramiko = Host("n1", {"ansible_connection": "paramiko"})
    assert type(connector_for(paramiko, KEEP)) is SSHConnector
    for off in (False, "false", "no"):
        opted_out = Host("n1", {"cpuaccel_ssh_persist": off})
        assert not keeps_connection(opted_out, KEEP)
    assert keeps_connection(Host("n1", {"cpuaccel_ssh_persist": "yes"}), KEEP)
    assert not keeps_connection(Host("here", {"ansible_connection": "local"}), KEEP)


def test_no_ssh_binary_means_paramiko(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    assert not keeps_connection(Host("n1"), KEEP)


def test_a_wrong_value_of_the_opt_out_is_refused_at_load(tmp_path: Path) -> None:
    from cpuaccel.errors import InventoryError
    from cpuaccel.inventory.inventory import Inventory

    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("all:\n  hosts:\n    n1:\n      cpuaccel_ssh_persist: maybe\n")
    with pytest.raises(InventoryError, match="cpuaccel_ssh_persist"):
        Inventory.load(inventory)


# ---------------------------------------------------------------- the folder


def test_the_folder_is_made_private(home: Path) -> None:
    folder = controlpath.ensure_dir()
    assert folder == str(home / ".cpuaccel-cp")
    assert os.stat(folder).st_mode & 0o777 == 0o700
    assert controlpath.ensure_dir() == folder  # made once, then accepted


def test_a_folder_others_may_enter_is_refused(home: Path) -> None:
    folder = home / ".cpuaccel-cp"
    folder.mkdir()
    folder.chmod(0o755)
    with pytest.raises(controlpath.ControlDirError, match="mode 0755, not 0700") as caught:
        controlpath.ensure_dir()
    assert caught.value.hint and "cpuaccel_ssh_persist: false" in caught.value.hint


def test_a_symlinked_folder_is_refused(home: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (home / ".cpuaccel-cp").symlink_to(elsewhere)
    with pytest.raises(controlpath.ControlDirError, match="symbolic link"):
        controlpath.ensure_dir()


def test_a_file_in_place_of_the_folder_is_refused(home: Path) -> None:
    (home / ".cpuaccel-cp").write_text("")
    with pytest.raises(controlpath.ControlDirError, match="is not a folder"):
        controlpath.ensure_dir()


def test_a_folder_of_another_user_is_refused(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = controlpath.ensure_dir()
    monkeypatch.setattr(os, "geteuid", lambda: os.stat(folder).st_uid + 1)
    with pytest.raises(controlpath.ControlDirError, match="belongs to uid"):
        controlpath.check_dir(folder)


# ---------------------------------------------------------------- the socket's name


def test_the_name_changes_with_the_connection_and_the_known_keys(tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text("10.0.0.1 ssh-ed25519 AAAA\n")
    argv = ["ssh", "-l", "root"]
    one = controlpath.control_path("/c", argv, "10.0.0.1", [str(known)])
    assert one == controlpath.control_path("/c", argv, "10.0.0.1", [str(known)])
    assert one != controlpath.control_path("/c", argv, "10.0.0.2", [str(known)])
    assert one != controlpath.control_path("/c", ["ssh", "-l", "alice"], "10.0.0.1", [str(known)])
    # The node re-made with new keys: known_hosts rewritten, so a new master.
    known.write_text("10.0.0.1 ssh-ed25519 BBBBBB\n")
    assert one != controlpath.control_path("/c", argv, "10.0.0.1", [str(known)])
    assert len(os.path.basename(one)) == 24


def test_a_folder_too_long_for_a_socket_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(controlpath.ControlDirError, match="too long a path for a socket"):
        controlpath.control_path("/" + "x" * 80, ["ssh"], "n1", [])
    monkeypatch.setenv("HOME", "/" + "h" * 60)  # such a home: paramiko, as before
    assert not controlpath.folder_fits()
    assert not keeps_connection(Host("n1"), KEEP)


def test_the_master_options_escape_what_ssh_expands() -> None:
    options = controlpath.mux_options("/home/a b/100%/cp/abc", 60)
    assert options == [
        "-o",
        "ControlMaster=auto",
        "-o",
        'ControlPath="/home/a b/100%%/cp/abc"',
        "-o",
        "ControlPersist=60",
    ]


def test_the_argv_carries_the_hosts_settings_and_the_master(home: Path) -> None:
    host = Host("n1", {"ansible_host": "10.0.0.1", "ansible_user": "root", "ansible_port": 2222})
    conn = OpenSSHConnector(host, KEEP)
    argv = conn.wrap("echo 'hi there'")
    assert argv[-3:] == ["--", "10.0.0.1", "echo 'hi there'"]
    assert argv[argv.index("-p") : argv.index("-p") + 2] == ["-p", "2222"]
    assert "StrictHostKeyChecking=yes" in argv and "BatchMode=yes" in argv
    assert "ControlMaster=auto" in argv and "ControlPersist=60" in argv
    path = conn.control_path()
    assert path.startswith(str(home / ".cpuaccel-cp") + "/")
    assert f"ControlPath={path}" in argv
    # rsync's ssh goes through the same master
    assert f"ControlPath={path}" in conn.ssh_argv()


def test_a_proxy_in_ssh_common_args_is_refused_on_this_path_too() -> None:
    host = Host("n1", {"ansible_ssh_common_args": "-o ProxyJump=hop"})
    with pytest.raises(Unreachable, match="proxyjump"):
        OpenSSHConnector(host, KEEP).connect()


# ---------------------------------------------------------------- ssh's failures


def test_ssh_refusals_are_the_same_errors_as_paramikos() -> None:
    conn = OpenSSHConnector(Host("n1", {"ansible_host": "10.0.0.1"}), KEEP)
    unknown = conn._failure(
        "No ED25519 host key is known for 10.0.0.1 and you have requested strict checking.\n"
        "Host key verification failed.\n"
    )
    assert isinstance(unknown, HostKeyError) and "is not known" in unknown.reason
    assert unknown.hint and "ssh-keyscan" in unknown.hint
    changed = conn._failure(
        "Host key for 10.0.0.1 has changed and you have requested strict checking.\n"
    )
    assert isinstance(changed, HostKeyError) and "CHANGED" in changed.reason
    refused = conn._failure("ssh: connect to host 10.0.0.1 port 22: Connection refused\n")
    assert type(refused) is Unreachable and "Connection refused" in refused.reason
    denied = conn._failure("root@10.0.0.1: Permission denied (publickey).\n")
    assert type(denied) is Unreachable and "authentication failed" in denied.reason
    ended = conn._failure("")  # a master ended under the session: ssh says nothing
    assert type(ended) is Unreachable and "ended" in ended.reason  # (no master here)
    # ... as a node that takes only the key exchange cpuaccel leaves out (connectors/kex.py)
    offered = "KexAlgorithms=" in " ".join(conn.ssh_argv())
    assert ended.hint is not None and ("sntrup761" in ended.hint) is offered
    # The remote command's own exit 255, with its own words: a result, not an error.
    assert conn._failure("my program failed\n") is None


# ---------------------------------------------------------------- known_hosts


def _hashed(name: str, salt: bytes = b"0123456789abcdefghij") -> str:
    digest = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"


def test_the_key_ssh_verifies_is_found_as_ssh_finds_it(tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(
        "# a comment\n"
        "10.0.0.9 ssh-ed25519 OTHER\n"
        "10.0.0.1,node1 ssh-rsa RSAKEY\n"
        f"{_hashed('10.0.0.1')} ssh-ed25519 EDKEY\n"
        "[10.0.0.1]:2222 ssh-ed25519 PORTKEY\n"
        "10.0.0.*,!10.0.0.3 ecdsa-sha2-nistp256 WILD\n"
        "@revoked 10.0.0.1 ssh-ed25519 OLDKEY\n"
        "10.0.0.1 ssh-ed25519 OLDKEY\n"
        "@cert-authority * ssh-ed25519 CAKEY\n"
    )
    files = [str(known), str(tmp_path / "absent")]
    assert known_lines.trusted_keys("10.0.0.1", files) == [
        "ssh-rsa RSAKEY",
        "ssh-ed25519 EDKEY",
        "ecdsa-sha2-nistp256 WILD",
    ]
    assert known_lines.preferred_key("10.0.0.1", files) == "ssh-ed25519 EDKEY"
    assert known_lines.preferred_key("[10.0.0.1]:2222", files) == "ssh-ed25519 PORTKEY"
    assert known_lines.preferred_key("10.0.0.3", files) is None  # negated
    assert known_lines.preferred_key("10.1.0.1", files) is None


@pytest.mark.parametrize("connector", [OpenSSHConnector, SSHConnector])
def test_an_inventory_known_hosts_that_is_no_file_is_refused_by_both(
    tmp_path: Path, connector: type[OpenSSHConnector | SSHConnector]
) -> None:
    # Judged before ssh or paramiko opens it: a FIFO would make either wait for good,
    # a missing file would make every key an unknown one.
    fifo = tmp_path / "kh"
    os.mkfifo(fifo)
    for path, reason in ((fifo, "FIFO"), (tmp_path / "absent", "No such file")):
        host = Host("n1", {"ansible_host": "127.0.0.1", "cpuaccel_known_hosts": str(path)})
        signal.alarm(20)  # a regression would block: fail, do not hang the suite
        try:
            with pytest.raises(
                Unreachable, match=f"cannot read known_hosts file {path}: .*{reason}"
            ):
                connector(host, KEEP).connect()
        finally:
            signal.alarm(0)
