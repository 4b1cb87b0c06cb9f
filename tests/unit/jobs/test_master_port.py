"""A foreground run on this machine alone picks its own free master port, held from
the pick to the run's end (cpuaccel/jobs/master_port.py), as ``torchrun --standalone``
does; a port someone gave, or a run with a node elsewhere, keeps the fixed one."""

from __future__ import annotations

import errno
import json
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from cpuaccel.config.settings import DEFAULT_MASTER_PORT
from cpuaccel.errors import EXIT_OK
from cpuaccel.jobs import master_port
from testsupport.command import clean_env, cpuaccel, start_cpuaccel

# Two ranks meet through torch.distributed's own env:// rendezvous (rank 0's TCPStore on
# MASTER_PORT) and add up their ranks: the run succeeds only if they met on that port.
SCRIPT = """\
import os
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
total = torch.tensor([dist.get_rank()])
dist.all_reduce(total)
assert total.item() == 1, total
print("met on", os.environ["MASTER_PORT"], flush=True)
dist.destroy_process_group()
"""
RUN = ("run", "--nodes", "1", "--ppn", "2", "train.py")


def project(tmp_path: Path, name: str) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "train.py").write_text(SCRIPT)
    return folder


@pytest.fixture
def default_port_taken() -> Iterator[None]:
    """Something listens on the default master port (unless something already does)."""
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past earlier TIME_WAITs
    try:
        holder.bind(("", DEFAULT_MASTER_PORT))
        holder.listen(1)
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
    try:
        yield
    finally:
        holder.close()


def the_run(proj: Path) -> tuple[int, str]:
    """The one run's recorded master port, and its env.sh."""
    (folder,) = (proj / "runs").iterdir()
    record = json.loads((folder / "run.json").read_text())
    return record["master_port"], (folder / "env.sh").read_text()


def run_and_check(procs: list[subprocess.Popen[str]], projects: list[Path]) -> list[int]:
    """Each run succeeded, its ranks met on the port it recorded (run.json, env.sh)."""
    ports = []
    for proc, proj in zip(procs, projects, strict=True):
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == EXIT_OK, err
        port, env_sh = the_run(proj)
        assert port != DEFAULT_MASTER_PORT
        assert f"MASTER_PORT={port}" in env_sh
        assert out.count(f"met on {port}") == 2, out  # both ranks, on the recorded port
        ports.append(port)
    return ports


def test_two_local_runs_started_at_the_same_moment_both_succeed(tmp_path: Path) -> None:
    projects = [project(tmp_path, name) for name in ("one", "two")]
    procs = [start_cpuaccel(*RUN, cwd=p, env=clean_env(), stdout=-1, stderr=-1) for p in projects]
    first, second = run_and_check(procs, projects)
    assert first != second


def test_a_local_run_succeeds_while_the_default_port_is_taken(
    tmp_path: Path, default_port_taken: None
) -> None:
    proj = project(tmp_path, "taken")
    run_and_check([start_cpuaccel(*RUN, cwd=proj, env=clean_env(), stdout=-1, stderr=-1)], [proj])


def test_a_given_port_is_kept_and_a_taken_one_refused_with_the_fix(
    tmp_path: Path, default_port_taken: None
) -> None:
    proj = project(tmp_path, "given")
    args = ("run", "--master-port", str(DEFAULT_MASTER_PORT), *RUN[1:])
    proc = cpuaccel(*args, cwd=proj, env=clean_env(), timeout=120)
    assert proc.returncode != EXIT_OK
    assert f"master port {DEFAULT_MASTER_PORT} is in use on the head node" in proc.stderr
    assert "--master-port" in proc.stderr and "Traceback" not in proc.stderr


def test_a_dry_run_shows_the_default_a_run_with_nodes_elsewhere_keeps(tmp_path: Path) -> None:
    """Nothing is held without a run: the plan shows the default a multi-node run uses."""
    proj = project(tmp_path, "dry")
    proc = cpuaccel("run", "--dry-run", *RUN[1:], cwd=proj, env=clean_env())
    assert proc.returncode == EXIT_OK, proc.stderr
    assert f"MASTER_PORT={DEFAULT_MASTER_PORT}" in proc.stdout


def test_a_reserved_port_goes_to_no_other_pick_and_rank_zero_still_listens_on_it() -> None:
    held = master_port.reserve()
    try:
        port = held.getsockname()[1]
        others = [master_port.reserve() for _ in range(50)]
        assert port not in {s.getsockname()[1] for s in others}
        for s in others:
            s.close()
        from datetime import timedelta

        from torch.distributed import TCPStore  # type: ignore[attr-defined]

        store = TCPStore("127.0.0.1", port, 1, True, timedelta(seconds=10))
        store.set("k", "v")
        assert store.get("k") == b"v"
    finally:
        held.close()


def test_a_port_something_listens_on_is_passed_over() -> None:
    """A listener that took the kernel's pick with SO_REUSEADDR: the pick moves on."""
    held = master_port.reserve()
    port = held.getsockname()[1]
    held.close()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("", port))
    listener.listen(1)
    try:
        assert not master_port._listenable(port)
        again = master_port.reserve()
        assert again.getsockname()[1] != port
        again.close()
    finally:
        listener.close()
