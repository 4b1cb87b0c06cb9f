"""A node's sync report as sync --json shows it."""

from __future__ import annotations

from cpuaccel.projectsync.node_result import NodeReport

SHOWN = ["dest", "changed", "deleted", "added", "bytes", "method", "shared_with", "in_sync"]


def test_the_json_keeps_its_order_and_leaves_out_mismatches_and_runs() -> None:
    report = NodeReport("/w", ["a"], [], 5, "rsync", added=["a"], mismatches=["b"])
    report.runs = {"r1": [1]}
    shown = report.to_json()
    assert list(shown) == SHOWN
    assert (shown["dest"], shown["added"], shown["bytes"], shown["method"]) == (
        "/w",
        ["a"],
        5,
        "rsync",
    )


def test_swept_runs_come_last_and_only_when_any_were() -> None:
    report = NodeReport("/w", swept=["r1"])
    assert list(report.to_json()) == [*SHOWN, "swept"]
    assert report.to_json()["swept"] == ["r1"]
