"""The rendezvous bound's supervisor side without nodes: the markers and their parsing,
torch's own network error lines, the tracker fed lines and times (when a job is
overdue, which failure is the rendezvous's), its report, and the detached supervisor
ending a job whose ranks never all join (a stand-in launch.sh). The rank side:
tests/unit/test_rendezvous.py; on real nodes: tests/cluster/test_rendezvous.py."""

from __future__ import annotations

import uuid
from pathlib import Path

from cpuaccel.node import detached
from cpuaccel.node.rendezvous import (
    RendezvousTracker,
    marker,
    network_error,
    one_line,
    parse,
    slack,
)
from tests.unit.node.detached_runs import detached_run
from tests.unit.node.test_supervisor import final_status

RUN_ID = "20260101-000000-abcdef"
C10D_LINE = (
    "[E1207 13:49:53.534596492 socket.cpp:1028] [c10d] The client socket has timed out "
    "after 5000ms while trying to connect to (node1, 29501)."
)


def test_a_marker_is_read_back_only_in_its_exact_form_for_this_run() -> None:
    assert marker(RUN_ID, "joined") == f"[cpuaccel] rendezvous {RUN_ID} joined"
    assert parse(marker(RUN_ID, "waiting"), RUN_ID) == ("waiting", None)
    assert parse(marker(RUN_ID, "ready"), RUN_ID) == ("ready", None)
    error = marker(RUN_ID, "error", "DistStoreError: Timed out\n  more\x1b[0m")
    assert error == f"[cpuaccel] rendezvous {RUN_ID} error DistStoreError: Timed out"
    assert parse(error, RUN_ID) == ("error", "DistStoreError: Timed out")
    for text in (
        "[cpuaccel] rendezvous 20250505-000000-ffffff joined",  # another run's
        f"[cpuaccel] rendezvous {RUN_ID}",
        f"[cpuaccel] rendezvous {RUN_ID} arrived",
        f"[cpuaccel] rendezvous {RUN_ID} joined now",
        f"[cpuaccel] rendezvous {RUN_ID} error",  # an error says what
        f" [cpuaccel] rendezvous {RUN_ID} joined",
    ):
        assert parse(text, RUN_ID) is None, text


def test_an_error_is_kept_to_one_printable_bounded_line() -> None:
    assert one_line("\n\n  first\tline \nsecond") == "first?line"
    assert len(one_line("x" * 5000)) == 300
    assert marker(RUN_ID, "error", "") == f"[cpuaccel] rendezvous {RUN_ID} error (no message)"


def test_torchs_own_socket_lines_are_network_errors_and_nothing_else_is() -> None:
    assert network_error(C10D_LINE) == (
        "The client socket has timed out after 5000ms while trying to connect to (node1, 29501)."
    )
    warned = (
        "[W1207 13:52:25.663621274 TCPStore.cpp:340] [c10d] TCP client failed to "
        "connect/validate to host node1:29501 - retrying (try=0)"
    )
    assert network_error(warned) is not None and network_error(warned).startswith("TCP client")
    for text in (
        "[W1207 13:52:25.663621274 ProcessGroup.cpp:9] [c10d] using a default device",
        "epoch 1: the socket timed out",  # the user's words
        "[c10d] The client socket has timed out",  # not torch's log form
    ):
        assert network_error(text) is None, text


def test_the_slack_is_a_tenth_of_the_bound_within_3_to_10_s() -> None:
    assert (slack(5), slack(60), slack(120), slack(3600)) == (3.0, 6.0, 10.0, 10.0)


def tracker(bound: float = 20, world: int = 3) -> RendezvousTracker:
    return RendezvousTracker(RUN_ID, bound, world, {0: "n1", 1: "n1", 2: "n2"})


def test_the_bound_runs_from_the_first_rank_entering_until_all_are_ready() -> None:
    t = tracker()
    t.line(0, "n1", "loading data for an hour", 100.0)
    assert not t.overdue(5000.0)  # no rank began the rendezvous: nothing is bound
    assert t.line(0, "n1", marker(RUN_ID, "waiting"), 4000.0) is True
    t.line(1, "n1", marker(RUN_ID, "waiting"), 4001.0)
    t.line(0, "n1", marker(RUN_ID, "joined"), 4002.0)
    t.line(0, "n1", marker(RUN_ID, "ready"), 4002.0)
    assert not t.overdue(4000.0 + 20 + slack(20) - 0.01)
    assert t.overdue(4000.0 + 20 + slack(20))
    assert [p.rank for p in t.missing()] == [1, 2]
    for rank in (1, 2):
        t.line(rank, "n", marker(RUN_ID, "joined"), 4010.0)
        t.line(rank, "n", marker(RUN_ID, "ready"), 4010.0)
    assert t.complete() and not t.overdue(9999.0)
    t.line(2, "n2", C10D_LINE, 4020.0)  # later network trouble: --hang-timeout's
    assert t.ranks[2].error is None


def test_a_ranks_failure_inside_the_rendezvous_waits_a_slack_for_the_others() -> None:
    t = tracker()
    assert not t.fails([1], 10.0)  # nothing began: a failure is the rank's own
    t.line(0, "n1", marker(RUN_ID, "waiting"), 10.0)
    assert not t.fails([2], 11.0)  # rank 2 never entered: its own failure
    t.line(1, "n1", marker(RUN_ID, "waiting"), 11.0)
    # rank 1's exit code came before its error marker: its failure is the rendezvous's
    assert t.fails([1], 12.0) and not t.overdue(12.0 + slack(20) - 0.01)
    t.line(1, "n1", marker(RUN_ID, "error", "DistNetworkError: timed out"), 12.5)
    t.line(0, "n1", C10D_LINE, 13.0)
    assert t.overdue(12.0 + slack(20))
    assert t.report() == [
        f"rank 0 on n1: waiting to join; last network error: {network_error(C10D_LINE)}",
        "rank 1 on n1: waiting to join; last network error: DistNetworkError: timed out",
        "rank 2 on n2: never began the rendezvous; no network error seen",
    ]


def test_the_report_names_the_joined_and_the_first_collective_unfinished() -> None:
    t = tracker(world=2)
    for rank in (0, 1):
        t.line(rank, "n1", marker(RUN_ID, "waiting"), 1.0)
        t.line(rank, "n1", marker(RUN_ID, "joined"), 2.0)
    t.line(0, "n1", marker(RUN_ID, "ready"), 2.0)
    t.line(1, "n1", marker(RUN_ID, "error", "RuntimeError: barrier failed"), 3.0)
    assert t.report() == [
        "joined: rank 0 (n1), rank 1 (n1)",
        "rank 1 on n1: joined, its first collective unfinished; last network error: "
        "RuntimeError: barrier failed",
    ]
    doc = t.to_json(5.0)
    assert (doc["timeout"], doc["seconds"], doc["joined"], doc["missing"]) == (20, 4.0, [0, 1], [])
    assert doc["ranks"][1] == {
        "rank": 1, "host": "n1", "joined": True, "state": "joined",
        "error": "RuntimeError: barrier failed",
    }  # fmt: skip
    assert list(doc["ranks"][1]) == ["rank", "host", "joined", "state", "error"]


def test_the_detached_supervisor_ends_a_job_whose_ranks_never_all_join(tmp_path: Path) -> None:
    bound = 2.0
    run_id = f"20260101-000000-{uuid.uuid4().hex[:6]}"  # its own: sweeps go by run id
    run_dir = detached_run(
        tmp_path,
        run_id,
        f"echo '[rank 0 h] {marker(run_id, 'waiting')}'\n"
        f"echo '[rank 0 h] {C10D_LINE}'\n"
        "exec sleep 60\n",
        rendezvous_timeout=bound,
    )
    detached.start(run_dir)
    status = final_status(run_dir)
    assert (status["state"], status["ended_by"], status["exit_code"]) == (
        "failed",
        "rendezvous",
        124,
    )
    found = status["rendezvous"]
    assert (found["joined"], found["missing"]) == ([], [0, 1])
    assert [(r["rank"], r["host"], r["state"]) for r in found["ranks"]] == [
        (0, "here", "waiting"),
        (1, "here", None),
    ]
    assert found["ranks"][0]["error"] == network_error(C10D_LINE)
    assert bound + slack(bound) <= found["seconds"] < bound + slack(bound) + 5
    assert status["ended"] - status["started"] < 20  # the sleep was ended, not waited for
    log = Path(run_dir, "supervisor.log").read_text()
    assert "rendezvous: rank(s) 0, 1 of 2 did not join the process group" in log
    assert "rank 1 on here: never began the rendezvous; no network error seen" in log
    assert "rendezvous" not in Path(run_dir, "rank-0.log").read_text()  # marker hidden
