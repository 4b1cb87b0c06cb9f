"""`run --nodes MIN:MAX` without nodes (jobs/elastic.py): choosing
the hosts that remain, the plan on them, the preflight that leaves failing nodes out,
the settings, and the attempt loop's checkpoint lookup on the remaining nodes. The real
lost node is in tests/cluster/test_elastic.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from cpuaccel.config.effective import resolve
from cpuaccel.facts.problems import ERROR, Problem
from cpuaccel.inventory.host import Host
from cpuaccel.inventory.inventory import Inventory
from cpuaccel.jobs import elastic
from cpuaccel.jobs.elastic import PreflightFailed
from cpuaccel.jobs.plan import RunPlan, Script, build_plan
from cpuaccel.node import supervisor as attempts
from cpuaccel.node.supervisor import AttemptLog, Outcome

REPO = Path(__file__).resolve().parents[3]
INVENTORY = REPO / "inventory.example.yaml"  # node0..node3


def hosts(*names: str) -> list[Host]:
    return [Host(name=n) for n in names]


def problem(host: str | None, message: str = "unreachable") -> Problem:
    return Problem(ERROR, host, message)


# ---------------------------------------------------------------- remaining (pure)


def test_failing_nodes_are_left_out_in_order_while_min_remain() -> None:
    kept = elastic.remaining(hosts("a", "b", "c"), [problem("b", "no route")], 2)
    assert kept is not None
    assert [h.name for h in kept[0]] == ["a", "c"] and kept[1] == {"b": "no route"}


def test_a_node_the_heads_launcher_cannot_reach_is_the_one_left_out() -> None:
    kept = elastic.remaining(hosts("a", "b", "c"), [problem("a -> c", "no answer")], 2)
    assert kept is not None and [h.name for h in kept[0]] == ["a", "b"]


def test_a_lost_head_makes_the_next_host_the_head() -> None:
    kept = elastic.remaining(hosts("a", "b", "c"), [problem("a"), problem("a", "x")], 2)
    assert kept is not None
    assert [h.name for h in kept[0]] == ["b", "c"] and kept[1] == {"a": "unreachable"}


@pytest.mark.parametrize(
    ("problems", "min_nodes"),
    [
        ([problem("b")], None),  # no MIN: no node may be left out
        ([problem("b"), problem("c")], 2),  # fewer than MIN would remain
        ([problem(None, "the controller's ssh")], 1),  # not a node's problem
        ([problem("elsewhere")], 1),  # not one of the job's nodes
        ([], 1),  # nothing failed: nothing to leave out
    ],
)
def test_nothing_is_left_out_when_it_is_not_allowed(
    problems: list[Problem], min_nodes: int | None
) -> None:
    assert elastic.remaining(hosts("a", "b", "c"), problems, min_nodes) is None


# ---------------------------------------------------------------- plans and settings


def plan_of(**flags: object) -> RunPlan:
    inventory = Inventory.load(str(INVENTORY))
    settings = resolve(flags, None, inventory, inventory.select(None))
    return build_plan(settings, Script("t.py", (), "p"), None, "r1")


def test_the_plan_on_fewer_hosts_keeps_ppn_and_recomputes_the_world() -> None:
    plan = plan_of(nodes=3, min_nodes=2, ppn=2)
    assert plan.world == 6
    smaller = elastic.plan_on(plan, plan.hosts[1:])
    assert smaller.world == 4 and smaller.ppn == 2
    assert smaller.head.name == "node1" and smaller.env["MASTER_ADDR"] == "node1"
    assert smaller.run_dir == plan.run_dir  # the same run folder on the nodes
    assert plan.env["MASTER_ADDR"] == "node0"  # the first plan is left as it was


def test_min_max_settles_max_nodes_and_min() -> None:
    inventory = Inventory.load(str(INVENTORY))
    settings = resolve(
        {"nodes": 3, "min_nodes": 2, "flag_names": {"nodes": "--nnodes", "min_nodes": "--nnodes"}},
        None,
        inventory,
        inventory.select(None),
    )
    assert settings.hosts.value == ["node0", "node1", "node2"]
    assert settings.min_nodes.value == 2 and settings.min_nodes.where == "--nnodes"
    kept = elastic.settings_on(settings, [h for h in settings.chosen if h.name != "node1"])
    assert kept.hosts.value == ["node0", "node2"] and [h.name for h in kept.chosen] == [
        "node0",
        "node2",
    ]
    assert resolve({}, None, inventory, inventory.select(None)).min_nodes.value is None


# ---------------------------------------------------------------- the preflight


def test_the_preflight_leaves_out_failing_nodes_and_checks_the_rest_again() -> None:
    plan = plan_of(nodes=3, min_nodes=2, ppn=1)
    seen: list[list[str]] = []

    def check(p: RunPlan) -> str:
        seen.append([h.name for h in p.hosts])
        if "node0" in seen[-1]:
            raise PreflightFailed("1 problem(s)", [problem("node0", "connection timed out")])
        return "facts"

    console = Console(record=True, width=200)
    facts, kept = elastic.preflight_leaving_out(plan, 2, check, console)
    assert facts == "facts" and seen == [["node0", "node1", "node2"], ["node1", "node2"]]
    assert kept.world == 2 and kept.head.name == "node1"
    said = console.export_text()
    assert "leaving out node0: connection timed out (2 node(s) remain" in said


def test_the_preflight_fails_as_before_when_fewer_than_min_would_remain() -> None:
    plan = plan_of(nodes=3, min_nodes=3, ppn=1)

    def check(p: RunPlan) -> str:
        raise PreflightFailed("1 problem(s)", [problem("node2")])

    with pytest.raises(PreflightFailed):
        elastic.preflight_leaving_out(plan, 3, check, Console(record=True))


# ---------------------------------------------------------------- the attempt loop


class ShrinkingJob(attempts.Attempts):
    """Attempt 0 is lost on n3; the restart's preflight leaves n3 out."""

    def __init__(self) -> None:
        self.hosts = ["n1", "n2", "n3"]
        self.looked_up: list[list[str]] = []

    def run(self, k: int, resume: str | None) -> Outcome:
        if k == 0:
            return Outcome(255, "lost", 1.0, None, None, lost=["n3"])
        assert resume == "/w/runs/x/ckpt-10.pt"
        return Outcome(0, "completed", 1.0, 0, None)

    def preflight(self) -> bool:
        self.hosts = ["n1", "n2"]
        return True

    def newest_checkpoint(self) -> str | None:
        self.looked_up.append(list(self.hosts))
        # Before the preflight n3 is still in: nothing is complete on all three.
        return "/w/runs/x/ckpt-10.pt" if "n3" not in self.hosts else None


def test_the_checkpoint_is_looked_up_on_the_remaining_nodes(tmp_path: Path) -> None:
    job = ShrinkingJob()
    said: list[str] = []
    log = AttemptLog(str(tmp_path), world=3, restarts=True)
    settings = attempts.Settings(1, 0.0, lambda level, text: said.append(text))
    result = attempts.run_attempts(job, log, settings)
    assert result.exit_code == 0
    assert job.looked_up[-1] == ["n1", "n2"]
    lines = [json.loads(x) for x in (tmp_path / "attempts.jsonl").read_text().splitlines()]
    assert [line["hosts"] for line in lines] == [["n1", "n2", "n3"], ["n1", "n2"]]
    assert lines[1]["resume"] == "/w/runs/x/ckpt-10.pt"
    assert "attempt 1 on 2 node(s): n1, n2, from /w/runs/x/ckpt-10.pt" in said


def test_the_project_file_takes_min_max_too(tmp_path: Path) -> None:
    from cpuaccel.config.project import parse_project

    inventory = Inventory.load(str(INVENTORY))
    project = parse_project('nodes: "2:3"\n', "cpuaccel.yaml")
    settings = resolve({}, project, inventory, inventory.select(None))
    assert settings.hosts.value == ["node0", "node1", "node2"]
    assert settings.min_nodes.value == 2 and settings.min_nodes.where == "cpuaccel.yaml:1"
    flagged = resolve({"nodes": 4}, project, inventory, inventory.select(None))
    assert flagged.min_nodes.value is None and len(flagged.hosts.value) == 4


@pytest.mark.parametrize("value", ['"3:2"', '"0:2"', '"a:2"'])
def test_a_bad_range_in_the_project_file_names_its_line(value: str) -> None:
    from cpuaccel.config.project import parse_project
    from cpuaccel.errors import EXIT_USAGE, CpuaccelError

    with pytest.raises(CpuaccelError, match=r"cpuaccel\.yaml:1: nodes must be") as caught:
        parse_project(f"nodes: {value}\n", "cpuaccel.yaml")
    assert caught.value.exit_code == EXIT_USAGE
