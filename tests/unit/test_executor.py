"""The parallel core on local hosts: bounded, isolated failures, inventory order."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from cpuaccel import executor
from cpuaccel.connectors.base import Connector
from cpuaccel.connectors.connect_options import ConnectOptions
from cpuaccel.connectors.local import LocalConnector
from cpuaccel.errors import HostError, Unreachable
from cpuaccel.executor import ConnectionPool, HostResult, Status, fan_out, run_on_hosts
from cpuaccel.inventory.host import Host

LOCAL = {"ansible_connection": "local"}


def hosts(n: int) -> list[Host]:
    return [Host(f"h{i}", LOCAL) for i in range(n)]


def test_results_keep_inventory_order_and_failures_stay_local() -> None:
    def action(conn: Connector) -> str:
        if conn.host.name == "h1":
            raise HostError("h1", "broken", hint="mend it")
        if conn.host.name == "h2":
            raise Unreachable("h2", "gone")
        if conn.host.name == "h3":
            raise RuntimeError("a bug")
        return conn.run(["echo", conn.host.name]).stdout.strip()

    seen: list[str] = []
    results = run_on_hosts(hosts(5), action, forks=2, on_result=lambda r: seen.append(r.host.name))
    assert [r.host.name for r in results] == ["h0", "h1", "h2", "h3", "h4"]
    assert sorted(seen) == ["h0", "h1", "h2", "h3", "h4"]
    by = {r.host.name: r for r in results}
    assert (by["h0"].status, by["h0"].value) == (Status.OK, "h0")
    assert (by["h1"].status, by["h1"].error, by["h1"].hint) == (Status.FAILED, "broken", "mend it")
    assert (by["h2"].status, by["h2"].error) == (Status.UNREACHABLE, "gone")
    assert by["h3"].status is Status.FAILED and "RuntimeError: a bug" in str(by["h3"].error)
    assert by["h4"].value == "h4"


@pytest.mark.parametrize("forks", [1, 3])
def test_forks_bounds_concurrency(forks: int) -> None:
    lock = threading.Lock()
    running = 0
    peak = 0

    def action(conn: Connector) -> None:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.05)
        with lock:
            running -= 1

    results: list[HostResult[None]] = run_on_hosts(hosts(8), action, forks=forks)
    assert all(r.ok for r in results)
    assert peak == forks


def test_no_hosts_and_bad_forks() -> None:
    assert run_on_hosts([], lambda c: None) == []
    with pytest.raises(ValueError):
        run_on_hosts(hosts(1), lambda c: None, forks=0)


def test_fan_out_keeps_order_bounds_workers_and_reports_each() -> None:
    # The playbook strategy's pool: no connection is opened for it.
    running, peak, lock = 0, 0, threading.Lock()

    def work(n: int) -> int:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.02 * (5 - n))  # later items end first
        with lock:
            running -= 1
        return n * n

    done: list[int] = []
    assert fan_out(range(5), work, forks=2, on_done=done.append) == [0, 1, 4, 9, 16]
    assert sorted(done) == [0, 1, 4, 9, 16] and peak == 2
    assert fan_out([], work, forks=1) == []
    with pytest.raises(ValueError):
        fan_out([1], work, forks=0)


def test_fan_out_raises_a_bug_once_every_item_has_run_without_concurrent_futures() -> None:
    ran: list[int] = []

    def work(n: int) -> int:
        if n == 0:
            raise RuntimeError("a bug")
        time.sleep(0.02)
        ran.append(n)
        return n

    with pytest.raises(RuntimeError, match="a bug"):
        fan_out(range(4), work, forks=2)
    assert sorted(ran) == [1, 2, 3]
    code = (
        "import sys; from cpuaccel.executor import fan_out; "
        "assert fan_out([1, -2], abs, forks=2) == [1, 2]; "
        "print('concurrent.futures' in sys.modules)"
    )
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert found.stdout.strip() == "False", found.stderr


def test_one_inline_runs_a_single_item_in_the_calling_thread() -> None:
    """No pool (a thread, concurrent.futures and logging) for check's one node: a
    one-node check's cost is its start-up. Without it, the pool as before."""
    here = threading.current_thread().name
    done: list[str] = []

    def name(item: str) -> str:
        return threading.current_thread().name

    assert fan_out(["x"], name, forks=4, on_done=done.append, one_inline=True) == [here]
    assert done == [here]
    assert fan_out(["x"], name, forks=4) != [here]
    assert fan_out(["x", "y"], name, forks=4, one_inline=True)[0] != here


def test_the_pool_names_the_hosts_whose_connection_died(monkeypatch: pytest.MonkeyPatch) -> None:
    dead = {"h1"}

    class Watched(LocalConnector):
        def lost(self) -> bool:
            return self.host.name in dead

    monkeypatch.setattr(executor, "connector_for", lambda host, options: Watched(host, options))
    group = hosts(4)
    with ConnectionPool(ConnectOptions()) as pool:
        assert pool.lost(group) == []  # nothing connected yet: nothing lost
        for host in group[:3]:
            pool.get(host)
        assert pool.lost(group) == ["h1"]
        dead.add("h2")
        dead.add("h3")  # never connected: not lost
        assert pool.lost(group) == ["h1", "h2"]


class Program:
    """A kept program as ``KeptPrograms`` holds it: alive until closed."""

    def __init__(self) -> None:
        self.alive = True

    def close(self) -> None:
        self.alive = False


def test_call_all_sends_jobctl_to_a_kept_program_and_the_rest_fresh(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from cpuaccel.connectors import programs

    asked: list[tuple[str, str, object, list[str], bytes]] = []

    def call(conn: Connector, program: str, words: list[str], payload: bytes, **_: object) -> dict:
        if conn.host.name == "h2":
            raise Unreachable("h2", "gone")
        asked.append((conn.host.name, program, None, list(words), payload))
        return {"from": conn.host.name}

    def call_kept(
        kept: object, conn: Connector, words: list[str], payload: bytes, **_: object
    ) -> dict:
        asked.append((conn.host.name, "jobctl", kept, list(words), payload))
        return {"from": conn.host.name}

    monkeypatch.setattr(programs, "call", call)
    monkeypatch.setattr(programs, "call_kept", call_kept)
    kept, h0_program, dead = executor.KeptPrograms(), Program(), Program()
    kept.add("h0", h0_program)
    kept.add("h1", dead)
    dead.close()  # gone: h1's request goes fresh (call_kept with no program)
    group = hosts(3)
    with ConnectionPool(ConnectOptions()) as pool:
        request = executor.Request("jobctl", ["end", "r"], "ending", 5.0, b"in")
        done = executor.call_all(group, request, forks=2, pool=pool, kept=kept)
        assert [(r.host.name, r.status, r.value) for r in done] == [
            ("h0", Status.OK, {"from": "h0"}), ("h1", Status.OK, {"from": "h1"}),
            ("h2", Status.OK, {"from": "h2"}),
        ]  # fmt: skip
        assert sorted(asked, key=lambda a: a[0]) == [
            ("h0", "jobctl", h0_program, ["end", "r"], b"in"),
            ("h1", "jobctl", None, ["end", "r"], b"in"),
            ("h2", "jobctl", None, ["end", "r"], b"in"),
        ]
        asked.clear()
        done = executor.call_all(
            group, executor.Request("facts", [], "probing", 5.0), forks=2, pool=pool, kept=kept
        )
        assert [a[:3] for a in asked] == [("h0", "facts", None), ("h1", "facts", None)]
    assert done[2].status is Status.UNREACHABLE and done[2].error == "gone"
    kept.close()
    assert not h0_program.alive and kept.get("h0") is None


def test_call_all_over_one_allocation_is_one_srun_step(monkeypatch: pytest.MonkeyPatch) -> None:
    from cpuaccel.connectors import srun

    steps: list[tuple[list[str], list[str], str]] = []

    def call_everywhere(group: list[Host], program: str, words_of: object, payload: bytes = b"",
                        **_: object) -> dict:  # fmt: skip
        steps.append(([h.name for h in group], words_of(group[0]), program))  # type: ignore[operator]
        return {"n0": {"ok": 1}, "n1": HostError("n1", "disk full", hint="free it"),
                "n2": Unreachable("n2", "no answer through srun")}  # fmt: skip

    monkeypatch.setattr(srun, "call_everywhere", call_everywhere)
    group = [Host(f"n{i}", {**LOCAL, "cpuaccel_slurm_job": "77"}) for i in range(3)]
    assert executor.in_one_step(group) and not executor.in_one_step([*group, Host("other")])
    with ConnectionPool(ConnectOptions()) as pool:
        request = executor.Request("jobctl", ["write", "/r"], "writing", 5.0)
        done = executor.call_all(group, request, forks=1, pool=pool)
        assert pool.open_hosts() == []  # no connection: srun reaches them all
    assert steps == [(["n0", "n1", "n2"], ["write", "/r"], "jobctl")]
    assert [(r.status, r.value, r.error, r.hint) for r in done] == [
        (Status.OK, {"ok": 1}, None, None), (Status.FAILED, None, "disk full", "free it"),
        (Status.UNREACHABLE, None, "no answer through srun", None),
    ]  # fmt: skip
