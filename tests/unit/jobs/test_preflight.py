"""The preflight over one Slurm allocation: the probe and the look, one srun step each,
give one typed result a node."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest

from cpuaccel.connectors import srun
from cpuaccel.errors import HostError, Unreachable
from cpuaccel.executor import Status
from cpuaccel.inventory.host import Host
from cpuaccel.jobs import preflight


def test_one_allocation_gets_one_step_each_and_every_node_a_result(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hosts = [Host(f"n{i}", {"cpuaccel_slurm_job": "9", "cpuaccel_workdir": "/w"}) for i in range(4)]
    steps: dict[str, dict[str, list[str]]] = {}

    def call_everywhere(group: Any, program: str, words_of: Any, payload: bytes = b"",
                        **_: Any) -> dict[str, Any]:  # fmt: skip
        steps[program] = {h.name: words_of(h) for h in group}
        if program == "facts":
            return {"n0": {"time": 0.0}, "n1": Unreachable("n1", "no answer through srun"),
                    "n2": {"time": 0.0}, "n3": {"time": 0.0}}  # fmt: skip
        if "slow" in steps:
            time.sleep(1.0)
        return {"n0": {"entries": {"a": [1, 2]}}, "n1": {}, "n3": {},
                "n2": HostError("n2", "no room", hint="free some")}  # fmt: skip

    monkeypatch.setattr(srun, "call_everywhere", call_everywhere)
    source = SimpleNamespace(hash="h1")
    done = preflight._in_one_step(hosts, "/p", source, 29500, True)  # type: ignore[arg-type]
    assert set(steps) == {"facts", "tree"}
    assert steps["facts"]["n0"][2] == "29500" and steps["facts"]["n1"][2] == ""  # the head's port
    assert steps["tree"]["n3"][:3] == ["look", "/p", "--expect=h1"]
    assert [r.host.name for r in done] == ["n0", "n1", "n2", "n3"]
    assert [(r.status, r.error, r.hint) for r in done[1:]] == [
        (Status.UNREACHABLE, "no answer through srun", None),  # the probe's error first
        (Status.FAILED, "no room", "free some"),
        (Status.OK, None, None),
    ]
    state = done[0].value
    assert state is not None and state.project == {"entries": {"a": (1, 2)}}
    assert "probe_seconds" in state.facts
    # A look that does not end within PROBE_TIMEOUT of the probe: no node waits for it.
    monkeypatch.setattr(preflight, "PROBE_TIMEOUT", 0.1)
    steps["slow"] = {}
    done = preflight._in_one_step(hosts, "/p", source, 29500, True)  # type: ignore[arg-type]
    assert [(r.status, r.error) for r in done] == [
        (Status.FAILED, "no answer in time"), (Status.UNREACHABLE, "no answer through srun"),
        (Status.FAILED, "no answer in time"), (Status.FAILED, "no answer in time"),
    ]  # fmt: skip
