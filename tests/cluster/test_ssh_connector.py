"""The SSH connector (paramiko, connectors/ssh.py) against real nodes: arguments and
environment values arrive literally, and so does an rsync destination with spaces and
shell characters (rsync's secluded args and ``--``), "~/" landing in the node's home;
stdin (its end while the output is read on), exit codes and timeouts."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

import pytest

from cpuaccel.connectors.connect_options import ConnectOptions
from cpuaccel.connectors.ssh import SSHConnector
from cpuaccel.errors import CommandTimeout
from cpuaccel.inventory.inventory import Inventory
from cpuaccel.testbed.cluster import Cluster

pytestmark = pytest.mark.cluster


def _ssh(cluster: Cluster, name: str) -> SSHConnector:
    host = Inventory.load(cluster.inventory_path).hosts[name]
    return SSHConnector(host, ConnectOptions(command_timeout=30))


def test_remote_arguments_and_env_arrive_literally(cluster: Cluster) -> None:
    marker = f"/tmp/cpxl-test-{uuid.uuid4().hex}"
    words = [f"$(touch {marker})", f"`touch {marker}`", 'it\'s "q"', "a b\nc", "*", "$HOME"]
    value = f"'$(touch {marker})' \"x\" $HOME"
    code = "import os, sys, json; print(json.dumps([sys.argv[1:], os.environ['V']]))"
    with _ssh(cluster, "node2") as conn:
        result = conn.run([sys.executable, "-c", code, *words], env={"V": value})
    assert result.ok, result.stderr
    assert json.loads(result.stdout) == [words, value]
    assert not Path(marker).exists()
    inside = cluster.exec("node2", ["test", "-e", marker])
    assert inside.returncode != 0


def test_ending_the_input_leaves_the_output_to_read(cluster: Cluster) -> None:
    """end_input: EOF to the command (a half-close), its output and status still come."""
    with _ssh(cluster, "node2") as conn:
        proc = conn.start(["sh", "-c", "cat; echo done"])
        proc.send(b"first\n")
        proc.end_input()
        assert list(proc.lines()) == [("out", "first"), ("out", "done")]
        assert proc.wait(10) == 0
        proc.close()


def test_remote_stdin_exit_code_and_timeout(cluster: Cluster) -> None:
    with _ssh(cluster, "node3") as conn:
        echoed = conn.run(["cat"], stdin=b"payload\n" * 10000)
        assert echoed.stdout == "payload\n" * 10000
        failed = conn.run(["sh", "-c", "echo oops >&2; exit 5"])
        assert (failed.exit_code, failed.stderr.strip()) == (5, "oops")
        with pytest.raises(CommandTimeout):
            conn.run(["sleep", "5"], timeout=0.5)
        assert conn.run(["hostname"]).stdout.strip() == "node3"


def test_rsync_destination_with_spaces_and_home_arrives_literally(
    cluster: Cluster, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "f.txt").write_text("payload\n")
    tag = f"cpxl-h12i-{uuid.uuid4().hex[:8]}"
    marker = f"/tmp/{tag}-ran"
    dest = f"~/{tag}/a b;$(touch {marker})"
    host = Inventory.load(cluster.inventory_path).hosts["node2"]
    with SSHConnector(host, ConnectOptions(command_timeout=30)) as conn:
        try:
            result = conn.rsync(["-a", "--mkpath"], f"{src}/", dest + "/")
            assert result.ok, result.error
            home = conn.run(["sh", "-c", 'printf %s "$HOME"']).stdout
            listed = conn.run(["cat", f"{home}/{tag}/a b;$(touch {marker})/f.txt"])
            assert listed.ok and listed.stdout == "payload\n", listed.stderr
            assert not conn.run(["test", "-e", marker]).ok  # no shell ran the $(...)
        finally:
            conn.run(["rm", "-rf", f"{conn.run(['sh', '-c', 'echo $HOME']).stdout.strip()}/{tag}"])
