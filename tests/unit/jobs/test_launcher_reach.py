"""The head's launcher check (jobs/launcher_reach.py, the jobs program's ``reach``):
every node tried at once and nothing left, problems naming the pair and the fix, the
check started once every node is connected. The launch reuses its ssh: ``ssh.sh -N
NODE`` leaves ssh masters in a private folder, MPI's ssh reaches the nodes through them,
and the sweep ends them and removes the folder; check's own masters are kept the same
way."""

from __future__ import annotations

import fcntl
import os
import secrets
import shutil
import socket
import sys
import threading
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from cpuaccel.connectors import choose, controlpath, openssh
from cpuaccel.connectors.base import Connector
from cpuaccel.connectors.choose import connector_for
from cpuaccel.connectors.connect_options import ConnectOptions
from cpuaccel.executor import ConnectionPool, HostResult, Status
from cpuaccel.facts.problems import ERROR, Problem
from cpuaccel.inventory.host import Host
from cpuaccel.jobs import launcher_reach
from cpuaccel.jobs.launcher_reach import check_launcher_reach
from cpuaccel.jobs.plan import RunPlan
from cpuaccel.jobs.rundir import render_job_files
from cpuaccel.node import jobctl as jobs
from cpuaccel.node import mux
from tests.unit.jobs.plans import RUN_ID, plan_of

# ---------------------------------------------------------------- the head's reach check


REACH_SSH = """#!/bin/sh
[ "$1" = -N ] && shift
case "$1" in
    good) exit 0 ;;
    denied) echo "alice@10.0.0.2: Permission denied (publickey)." >&2; exit 255 ;;
    changed) echo "Host key verification failed." >&2; exit 255 ;;
    slow) sleep 30 ;;
esac
exit 3
"""


def test_reach_tries_every_node_at_once_and_leaves_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "work" / "runs" / RUN_ID
    files = {"ssh.sh": (0o700, REACH_SSH)}
    found = jobs.reach(str(folder), 1.0, ["good", "denied", "slow"], files)["reach"]
    assert found == {
        "good": [0, ""],
        "denied": [255, "alice@10.0.0.2: Permission denied (publickey)."],
        "slow": [None, ""],
    }
    assert list(tmp_path.iterdir()) == []  # the folders it made are gone again


def test_reach_problems_name_the_pair_and_the_fix(tmp_path: Path) -> None:
    workdir = str(tmp_path / "work")
    chosen = [
        Host(
            name,
            {"cpuaccel_python": sys.executable, "cpuaccel_workdir": workdir, "ansible_port": 22},
        )
        for name in ("head", "good", "denied", "changed")
    ]
    plan = plan_of(chosen)
    head = connector_for(Host("head", {"ansible_connection": "local", **chosen[0].vars}))
    problems = check_launcher_reach(head, plan, {"ssh.sh": (0o700, REACH_SSH)}, chosen[1:])
    by_pair: Mapping[str | None, Any] = {p.host: p for p in problems}
    assert set(by_pair) == {"head -> denied", "head -> changed"}
    denied = by_pair["head -> denied"]
    assert "the MPI launcher on head cannot ssh to denied" in denied.message
    assert "Permission denied" in denied.message and "AllowUsers" in str(denied.hint)
    assert "another host key" in str(by_pair["head -> changed"].hint)
    assert not Path(workdir).exists()


class _Connected:
    opens_lazily = False  # a paramiko connection: its key known once connected

    def __init__(self, host: Host, key: str) -> None:
        self.host = host
        self.key = key

    def host_key(self) -> str:
        return self.key


@pytest.mark.parametrize("keep_masters", [True, False])
def test_the_head_check_starts_once_every_node_is_connected_or_failed(
    monkeypatch: pytest.MonkeyPatch, keep_masters: bool
) -> None:
    calls: list[tuple[str, list[str], str]] = []

    def record(
        conn: Any, plan: RunPlan, files: Any, targets: list[Host], folder: str | None = None
    ) -> list[Any]:
        calls.append((plan.run_dir, [t.name for t in targets], files["known_hosts"][1]))
        # A run keeps the connections as masters for its launch (its sweep ends them);
        # `check` starts no job: its masters go to the folder kept across checks.
        config = files["ssh_config"][1]
        if keep_masters:
            assert folder == f"--mux=/tmp/cpuaccel-mux-{RUN_ID}"
            # auto: a master an earlier pass of the run left is found, never connected past
            assert config.endswith("Host *\n    ControlMaster auto\n")
        else:
            assert folder is not None and folder.startswith("--keep=/tmp/cpuaccel-mux-c")
            kept = folder.split("=", 1)[1]
            # First: ssh takes a keyword's first value, over the run's own ControlPath.
            assert config.startswith(f"Host *\n    ControlMaster auto\n    ControlPath {kept}/%C")
            assert config.count("ControlMaster") == 1
        return []

    monkeypatch.setattr(launcher_reach, "check_launcher_reach", record)
    chosen = [
        Host(f"n{i}", {"ansible_host": f"10.0.0.{i}", "ansible_port": 22, "cpuaccel_workdir": "/w"})
        for i in (1, 2, 3)
    ]
    plan = plan_of(chosen)
    reach = launcher_reach.LauncherReach(
        plan,
        ConnectOptions(),
        cast(ConnectionPool, SimpleNamespace(get=lambda h: None, options=ConnectOptions())),
        keep_masters=keep_masters,
    )
    reach.connected(cast(Connector, _Connected(chosen[0], "ssh-ed25519 K1")))
    reach.connected(cast(Connector, _Connected(chosen[1], "ssh-ed25519 K2")))
    assert calls == [] and reach.problems() == []  # n3 is still connecting
    reach.finished(HostResult(chosen[2], Status.UNREACHABLE, error="refused"))
    for host in chosen[:2]:
        reach.finished(HostResult(host, Status.OK))  # ended after connecting: no news
    assert reach.problems() == []
    known = "n1,10.0.0.1 ssh-ed25519 K1\nn2,10.0.0.2 ssh-ed25519 K2\n"
    # Once, in a folder of its own on the head, to the node the controller reached.
    assert calls == [(f"/tmp/cpuaccel-reach-{RUN_ID}", ["n2"], known)]


class _Lazy(_Connected):
    opens_lazily = True  # an OpenSSH master: its key read from known_hosts before it opens


def test_with_every_key_known_before_connecting_the_check_starts_at_the_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """OpenSSH masters verify against known_hosts only: the keys are known before the
    probes end, so the head's check runs beside them. A node (or head) the controller's
    probe finds failed after the start is left out of its problems, as before."""
    calls: list[tuple[list[str], str]] = []

    def every_pair_fails(
        conn: Any, plan: RunPlan, files: Any, targets: list[Host], folder: str | None = None
    ) -> list[Problem]:
        calls.append(([t.name for t in targets], files["known_hosts"][1]))
        return [Problem(ERROR, f"n1 -> {t.name}", "cannot ssh") for t in targets]

    monkeypatch.setattr(launcher_reach, "check_launcher_reach", every_pair_fails)
    keys = {f"n{i}": f"ssh-ed25519 K{i}" for i in (1, 2, 3, 4)}
    monkeypatch.setattr(choose, "connector_for", lambda host, _: _Lazy(host, keys[host.name]))
    chosen = [
        Host(f"n{i}", {"ansible_host": f"10.0.0.{i}", "ansible_port": 22, "cpuaccel_workdir": "/w"})
        for i in (1, 2, 3, 4)
    ]
    pool = cast(ConnectionPool, SimpleNamespace(get=lambda h: None, options=ConnectOptions()))

    def started(*events: Any) -> launcher_reach.LauncherReach:
        reach = launcher_reach.LauncherReach(plan_of(chosen), ConnectOptions(), pool)
        for event in events:
            if isinstance(event, HostResult):
                reach.finished(event)
            else:
                reach.connected(cast(Connector, _Lazy(event, keys[event.name])))
        return reach

    down = HostResult(chosen[3], Status.UNREACHABLE, error="refused")
    reach = started(chosen[1])  # n2's probe ended first; n1, n3 and n4 still at work
    assert reach._thread is not None
    reach._thread.join()
    known = "".join(f"n{i},10.0.0.{i} ssh-ed25519 K{i}\n" for i in (1, 2, 3, 4))
    assert calls == [(["n2", "n3", "n4"], known)]
    for host in (chosen[0], chosen[2]):
        reach.connected(cast(Connector, _Lazy(host, keys[host.name])))
    reach.finished(down)  # n4 found unreachable after the start
    assert [p.host for p in reach.problems()] == ["n1 -> n2", "n1 -> n3"]
    # n4 failed before: never tried. The head failed after the start: nothing to say.
    assert [p.host for p in started(down, chosen[2]).problems()] == ["n1 -> n2", "n1 -> n3"]
    assert calls[-1][0] == ["n2", "n3"]
    head_down = HostResult(chosen[0], Status.UNREACHABLE, error="refused")
    assert started(chosen[1], head_down).problems() == []


def test_reach_never_uses_a_folder_it_did_not_make(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep").write_text("x")
    planted = tmp_path / f"cpuaccel-reach-{RUN_ID}"
    planted.symlink_to(elsewhere)
    with pytest.raises(FileExistsError):
        jobs.reach(str(planted), 1.0, ["good"], {"ssh.sh": (0o700, REACH_SSH)})
    assert [p.name for p in elsewhere.iterdir()] == ["keep"] and planted.is_symlink()


FAKE_SSH = "#!/bin/sh\nexit 0\n"


@pytest.fixture
def run_id() -> Iterator[str]:
    """A run id of its own (the masters' folder is in the real /tmp), removed after."""
    value = f"20260101-000000-{secrets.token_hex(3)}"
    yield value
    shutil.rmtree(openssh.mux_dir(value), ignore_errors=True)


def test_the_run_ssh_config_reuses_masters_and_never_makes_one(run_id: str) -> None:
    chosen = [
        Host(n, {"ansible_host": f"10.0.0.{i}", "ansible_port": 22})
        for i, n in ((1, "a"), (2, "b"))
    ]
    plan = replace(plan_of(chosen), run_id=run_id)
    config = render_job_files(plan, ConnectOptions())["ssh_config"][1]
    assert f"ControlPath /tmp/cpuaccel-mux-{run_id}/%C" in config
    assert "ControlPersist 30" in config
    assert "ControlMaster" not in config  # only the preflight's copy opens masters
    # A socket path has 107 bytes; ssh binds at PATH + 17 bytes first.
    assert len(f"{openssh.mux_dir(run_id)}/{'0' * 40}") + 17 <= 107


def test_reach_makes_the_masters_folder_private(tmp_path: Path, run_id: str) -> None:
    mux = openssh.mux_dir(run_id)
    files = {"ssh.sh": (0o700, FAKE_SSH)}
    found = jobs.reach(str(tmp_path / "r"), 5.0, ["n2"], files, mux)["reach"]
    assert found == {"n2": [0, ""]}
    st = os.lstat(mux)
    assert st.st_uid == os.getuid() and st.st_mode & 0o777 == 0o700
    # Again for the same run (a second preflight pass): its own folder is taken as is.
    assert jobs.reach(str(tmp_path / "r"), 5.0, ["n2"], files, mux)["reach"] == found


def test_reach_refuses_a_masters_folder_others_can_enter(tmp_path: Path, run_id: str) -> None:
    mux = openssh.mux_dir(run_id)
    os.mkdir(mux, 0o755)
    os.chmod(mux, 0o777)  # as another user could have left it
    with pytest.raises(SystemExit, match="not a private folder"):
        jobs.reach(str(tmp_path / "r"), 5.0, ["n2"], {"ssh.sh": (0o700, FAKE_SSH)}, mux)
    with pytest.raises(SystemExit, match="not a folder of cpuaccel"):
        jobs.reach(str(tmp_path / "r"), 5.0, ["n2"], {}, "/etc/cpuaccel-mux-x")


def test_the_sweep_removes_the_masters_folder(run_id: str) -> None:
    mux = Path(openssh.mux_dir(run_id))
    mux.mkdir(mode=0o700)
    (mux / ("0" * 40)).write_text("")  # a stale socket's name: no master answers there
    jobs.end(run_id, 0.0)
    assert not mux.exists()
    jobs.end_masters("../etc")  # never a path outside its prefix
    assert Path("/etc").is_dir()


def test_a_failed_preflight_ends_the_masters(run_id: str) -> None:
    mux = Path(openssh.mux_dir(run_id))
    mux.mkdir(mode=0o700)
    python = {"cpuaccel_python": sys.executable}
    head = Host("head", {"ansible_connection": "local", **python})
    plan = replace(
        plan_of([head, Host("n2", {"ansible_host": "10.0.0.2", **python})]), run_id=run_id
    )
    with ConnectionPool(ConnectOptions()) as pool:
        reach = launcher_reach.LauncherReach(plan, ConnectOptions(), pool, keep_masters=True)
        reach.end_masters()  # the check never started: nothing to end
        assert mux.exists()
        reach._thread = threading.Thread(target=lambda: None)
        reach._thread.start()
        check = launcher_reach.LauncherReach(plan, ConnectOptions(), pool)  # `check`'s: no masters
        check._thread = reach._thread
        check.end_masters()
        assert mux.exists()
        reach.end_masters()
    assert not mux.exists()


def _dead_socket(path: Path) -> None:
    """A socket file no one listens on: what a master that exited may leave."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.close()


def test_a_later_preflight_removes_only_ended_masters_folders(run_id: str) -> None:
    old = 10 * mux.STALE_AFTER
    ended, fresh, live, shared = (Path(openssh.mux_dir(f"{run_id}{s}")) for s in "abcd")
    left = Path(f"/tmp/cpuaccel-mux-{run_id}-e.ending-123")  # killed within its sweep
    listener = socket.socket(socket.AF_UNIX)
    try:
        for folder in (ended, fresh, live, shared, left):
            folder.mkdir(mode=0o700)
        _dead_socket(ended / ("0" * 40))
        _dead_socket(fresh / ("1" * 40))
        listener.bind(str(live / ("2" * 40)))
        listener.listen()  # a master still running: its run may still launch through it
        shared.chmod(0o755)  # not a private folder: not provably cpuaccel's
        for folder in (ended, live, shared, left):
            os.utime(folder, (os.stat(folder).st_atime, os.stat(folder).st_mtime - old))
        removed = mux.sweep_stale()
        assert ended.name in removed and left.name in removed
        assert not ended.exists() and not left.exists()
        assert fresh.is_dir() and live.is_dir() and shared.is_dir()
        # The sweep runs where the check makes this run's own folder.
        mine = openssh.mux_dir(run_id)
        jobs.reach("/tmp/cpxl-r-" + run_id, 5.0, ["n2"], {"ssh.sh": (0o700, FAKE_SSH)}, mine)
        assert Path(mine).is_dir() and live.is_dir()
    finally:
        listener.close()
        for folder in (ended, fresh, live, shared, left):
            shutil.rmtree(folder, ignore_errors=True)


def test_the_check_leaves_out_sntrup_only_where_ssh_has_it(tmp_path: Path) -> None:
    ssh = tmp_path / "ssh"
    ssh.write_text("#!/bin/sh\necho curve25519-sha256\necho sntrup761x25519-sha512@openssh.com\n")
    ssh.chmod(0o755)
    assert "KexAlgorithms -sntrup761x25519-sha512*" in mux.fast_kex(str(ssh))
    ssh.write_text("#!/bin/sh\necho curve25519-sha256\n")  # OpenSSH before 8.5
    assert mux.fast_kex(str(ssh)) == ""
    assert mux.fast_kex(str(tmp_path / "none")) == ""  # no ssh: the check itself says so


def test_the_check_writes_its_ssh_config_with_the_kex_block(tmp_path: Path, run_id: str) -> None:
    seen = tmp_path / "seen"
    dump = f'#!/bin/sh\ncat "$(dirname "$0")/ssh_config" > {seen}\n'
    files = {"ssh.sh": (0o700, dump), "ssh_config": (0o600, "Host a\n    Port 22\n")}
    jobs.reach(str(tmp_path / "r"), 5.0, ["n2"], files, openssh.mux_dir(run_id))
    text = seen.read_text()
    assert text.startswith("Host a\n") and text.endswith(mux.fast_kex())


# ---------------------------------------------------------------- check's kept masters


def test_checks_head_masters_folder_is_named_by_what_they_were_opened_with(
    run_id: str,
) -> None:
    chosen = [
        Host(n, {"ansible_host": f"10.0.0.{i}", "ansible_port": 22})
        for i, n in ((1, "a"), (2, "b"))
    ]
    known = "a,10.0.0.1 ssh-ed25519 K1\nb,10.0.0.2 ssh-ed25519 K2\n"

    def folder(hosts: list[Host], rid: str, keys: str = known) -> str:
        plan = replace(plan_of(hosts), run_id=rid)
        config = render_job_files(plan, ConnectOptions())["ssh_config"][1]
        assert rid in config  # the run's known_hosts path and ControlPath: left out
        return controlpath.head_folder(config, keys, rid)

    first = folder(chosen, run_id)
    assert first.startswith("/tmp/cpuaccel-mux-c") and mux.MUX_PREFIX == openssh.MUX_PREFIX
    assert folder(chosen, "20260101-000001-abcdef") == first  # the next check: the same
    assert folder(chosen, run_id, known.replace("K2", "K3")) != first  # node b re-keyed
    moved = [chosen[0], Host("b", {"ansible_host": "10.0.0.2", "ansible_port": 2222})]
    assert folder(moved, run_id) != first  # another port (or user, key, policy...)
    assert len(f"{first}/{'0' * 40}") + 17 <= 107  # ssh binds at PATH + 17 bytes first
    assert controlpath.head_config(first).startswith(
        f"Host *\n    ControlMaster auto\n    ControlPath {first}/%C\n"
    )


@pytest.fixture
def kept() -> Iterator[str]:
    value = f"{openssh.MUX_PREFIX}c{secrets.token_hex(12)}"
    yield value
    shutil.rmtree(value, ignore_errors=True)


def test_check_keeps_its_masters_folder_private_and_reuses_it(tmp_path: Path, kept: str) -> None:
    seen = tmp_path / "seen"
    dump = f'#!/bin/sh\ncat "$(dirname "$0")/ssh_config" > {seen}\n'
    files = {"ssh.sh": (0o700, dump), "ssh_config": (0o600, "Host a\n    Port 22\n")}
    for _ in range(2):  # made, then taken as it is (the next check's)
        found = jobs.reach(str(tmp_path / "r"), 5.0, ["n2"], files, kept, kept=True)
        assert found["reach"] == {"n2": [0, ""]}
        st = os.lstat(kept)
        assert st.st_uid == os.getuid() and st.st_mode & 0o777 == 0o700
        assert seen.read_text().startswith("Host a\n")  # masters used as the config says
    assert not (tmp_path / "r").exists()  # the run folder of the check: removed
    with pytest.raises(SystemExit, match="not a folder of cpuaccel"):
        jobs.reach(str(tmp_path / "r"), 5.0, ["n2"], files, "/etc/cpuaccel-mux-x", kept=True)


def test_two_checks_at_once_reach_one_after_the_other(tmp_path: Path, kept: str) -> None:
    """Both would try to become each node's master, and the loser's ssh -N would never
    return: the second check's reach waits for the first's (a lock on the folder)."""
    os.mkdir(kept, 0o700)
    first = os.open(kept, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(first, fcntl.LOCK_EX)  # the first check's reach, still at work
    files = {"ssh.sh": (0o700, FAKE_SSH)}
    found: list[Any] = []

    def second() -> None:
        found.append(jobs.reach(str(tmp_path / "r"), 5.0, ["n2"], files, kept, kept=True))

    thread = threading.Thread(target=second)
    thread.start()
    thread.join(0.5)
    assert found == []
    os.close(first)  # the first one ended
    thread.join(5)
    assert found == [{"reach": {"n2": [0, ""]}}]


def test_check_uses_no_master_in_a_folder_others_can_enter(tmp_path: Path, kept: str) -> None:
    """A socket there could be another user's in place of a master: the check's masters
    go to a private folder of its own, removed after (its answer still counts), and the
    folder is left as it was found."""
    seen = tmp_path / "seen"
    dump = f'#!/bin/sh\ncat "$(dirname "$0")/ssh_config" > {seen}\n'
    files = {"ssh.sh": (0o700, dump), "ssh_config": (0o600, "Host a\n    Port 22\n")}
    os.mkdir(kept, 0o700)
    os.chmod(kept, 0o777)
    found = jobs.reach(str(tmp_path / "r"), 5.0, ["n2"], files, kept, kept=True)
    assert found["reach"] == {"n2": [0, ""]}
    text = seen.read_text()
    own = text.split("ControlPath ", 1)[1].split("/%C\n", 1)[0]
    assert text.startswith(mux.own_masters(own) + "Host a\n")
    assert own.startswith("/tmp/cpuaccel-r-") and not os.path.exists(own)
    assert os.lstat(kept).st_mode & 0o777 == 0o777
