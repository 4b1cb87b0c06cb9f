"""The fact probe, run for real on this machine through the local connector."""

from __future__ import annotations

import os
import socket
import sys
from importlib import metadata
from pathlib import Path

import pytest

from cpuaccel.connectors.connect_options import ConnectOptions
from cpuaccel.connectors.local import LocalConnector
from cpuaccel.errors import HostError
from cpuaccel.facts.gather import gather, names_to_resolve
from cpuaccel.inventory.host import Host
from cpuaccel.node import facts as probe


def local(**vars: str) -> LocalConnector:
    host = Host("localhost", {"ansible_connection": "local", **vars})
    return LocalConnector(host, ConnectOptions())


def test_gather_reports_this_machine(tmp_path: Path) -> None:
    facts = gather(
        local(cpuaccel_python=sys.executable, cpuaccel_workdir=str(tmp_path / "w")),
        ["localhost"],
    )
    assert facts["hostname"] == socket.gethostname()
    assert facts["python"]["executable"] == sys.executable
    assert facts["packages"]["torch"] == metadata.version("torch")
    assert facts["packages"]["intel_extension_for_pytorch"] is None
    assert facts["cpu"]["logical_cpus"] == os.cpu_count()
    assert 1 <= facts["cpu"]["physical_cores"] <= os.cpu_count()
    assert facts["workdir"] == str(tmp_path / "w") and facts["disk"]["exists"] is False
    assert facts["disk"]["free"] > 0
    assert "127.0.0.1" in facts["resolve"]["localhost"]["addresses"]
    assert abs(facts["clock_skew"]) < 2
    launchers = facts["mpi"]["launchers"]
    assert launchers[0]["path"] == str(Path(sys.executable).with_name("mpirun"))
    assert launchers[0]["flavour"] == "impi"


def test_missing_interpreter_is_a_clear_host_error() -> None:
    with pytest.raises(HostError, match="cannot be run on the node") as info:
        gather(local(cpuaccel_python="/nonexistent/python3"))
    assert info.value.hint and "cpuaccel_python" in info.value.hint


@pytest.mark.parametrize(
    ("name", "content", "flavour"),
    [
        ("mpirun", b"#!/bin/sh\n# Copyright Intel Corporation\nI_MPI_ROOT=x\n", "impi"),
        ("mpiexec.hydra", b"\x7fELF...HYDRA...", "mpich"),
        ("mpirun", b"\x7fELF... Open MPI ...", "openmpi"),
        ("orterun", b"\x7fELF", "openmpi"),
        ("mpirun", b"#!/bin/sh\necho hi\n", "unknown"),
    ],
)
def test_mpi_flavour_from_file_contents(
    tmp_path: Path, name: str, content: bytes, flavour: str
) -> None:
    target = tmp_path / name
    target.write_bytes(content)
    link = tmp_path / "link-to-it"
    link.symlink_to(target)
    assert probe.mpi_flavour(str(link)) == flavour


def test_names_to_resolve_skips_self_local_hosts_and_addresses() -> None:
    peers = [
        Host("node1"),
        Host("node2"),
        Host("10.1.2.3"),
        Host("localhost", {"ansible_connection": "local"}),
    ]
    assert names_to_resolve(peers[0], peers) == ["node2"]
    assert names_to_resolve(peers[3], peers) == []


@pytest.mark.skipif(os.path.exists("/opt/intel/oneapi/setvars.sh"), reason="oneAPI installed")
def test_oneccls_own_setvars_is_found_beside_its_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found on sys.path as the import system finds a package (no importlib.util on the
    node): the first entry holding it, before the usual places."""
    first, second = tmp_path / "a", tmp_path / "b"
    for root in (first, second):
        (root / "oneccl_bindings_for_pytorch" / "env").mkdir(parents=True)
        (root / "oneccl_bindings_for_pytorch" / "env" / "setvars.sh").write_text("true\n")
    (first / "oneccl_bindings_for_pytorch" / "env" / "setvars.sh").unlink()
    monkeypatch.setattr(sys, "path", [str(tmp_path / "none"), str(second), str(first)])
    assert probe.find_setvars(None)["path"] is None  # no __init__.py: not a package
    for root in (first, second):
        (root / "oneccl_bindings_for_pytorch" / "__init__.py").write_text("")
    found = probe.find_setvars(None)
    assert found == {
        "path": str(second / "oneccl_bindings_for_pytorch" / "env" / "setvars.sh"),
        "configured": False,
        "exists": True,
    }
    monkeypatch.setattr(sys, "path", [str(first), str(second)])  # the one imported: none
    assert probe.find_setvars(None)["path"] is None
