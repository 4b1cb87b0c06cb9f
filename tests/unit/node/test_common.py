"""The part every node program carries (node/common.py): PEP 503 names, the names and
versions of installed distributions read from their folders, and write_atomic."""

from __future__ import annotations

from pathlib import Path

from cpuaccel.node import common


def test_pep503_names() -> None:
    assert common.normalise("Oneccl_Bind.PT") == "oneccl-bind-pt"
    assert common.normalise("a--b__c..d") == "a-b-c-d"


def test_dist_infos_read_names_and_versions_from_folder_names(tmp_path: Path) -> None:
    for name in ("torch-2.13.0+cpu.dist-info", "Old_Pkg-0.5-py3.8.egg-info", "dev.egg-info"):
        (tmp_path / name).mkdir()
    (tmp_path / "torch").mkdir()
    found = {name: version for name, version, _ in common.dist_infos([str(tmp_path)])}
    assert found == {"torch": "2.13.0+cpu", "old-pkg": "0.5", "dev": None}


def test_write_atomic_creates_with_the_mode_and_leaves_no_temp(tmp_path: Path) -> None:
    dest = tmp_path / "secret.env"
    common.write_atomic(str(dest), b"K=V\n", 0o600)
    assert dest.read_bytes() == b"K=V\n" and dest.stat().st_mode & 0o777 == 0o600
    common.write_atomic(str(dest), b"K=W\n")  # a replaced file keeps its mode
    assert dest.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["secret.env"]
    assert common.TMP_MARK in common.temp_name(str(dest)) and "cpuaccel" in common.TMP_MARK
