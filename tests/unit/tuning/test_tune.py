"""cpuaccel tune: the grid (from recorded facts, --grid and its hostile values), the
measures and the best, and --write's edit of cpuaccel.yaml."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from cpuaccel.config.project_choice import load_config
from cpuaccel.errors import EXIT_USAGE, ProjectFileError, UsageError
from cpuaccel.inventory.host import Host
from cpuaccel.tuning import grid, measure, write
from cpuaccel.tuning import survey as nodes
from cpuaccel.tuning.grid import GridSpec, Trial
from cpuaccel.tuning.measure import OK, Rates, Row
from testsupport.command import cpuaccel

# What the facts probe reported (node/facts.cpu_topology), trimmed to what tune reads:
# a 2-core cloud VM (AMD EPYC, one socket) and a 2-socket Xeon of 56 cores a socket.
SMALL = {"cpu": {"model": "AMD EPYC 7B13", "sockets": 1, "physical_cores": 2}, "boot_id": "a"}
XEON = {
    "cpu": {"model": "Intel(R) Xeon(R) Platinum 8480+", "sockets": 2, "physical_cores": 112},
    "boot_id": "b",
}


def cores_of(facts: dict[str, Any]) -> tuple[int, int]:
    return int(facts["cpu"]["physical_cores"]), int(facts["cpu"]["sockets"])


def test_the_grid_of_a_two_core_node() -> None:
    trials = grid.build_grid(GridSpec(), *cores_of(SMALL), "auto")
    assert [(t.ppn, t.threads) for t in trials] == [(1, 2), (1, 1), (2, 1)]
    assert {t.allocator for t in trials} == {"auto"}


def test_the_grid_of_a_two_socket_xeon() -> None:
    assert grid.ppn_choices(*cores_of(XEON)) == [1, 2, 4, 8, 16, 112]
    trials = grid.build_grid(GridSpec(), *cores_of(XEON), "auto")
    pairs = [(t.ppn, t.threads) for t in trials]
    assert pairs[:2] == [(1, 112), (1, 56)]
    assert (2, 56) in pairs and (2, 28) in pairs and (16, 7) in pairs and (16, 3) in pairs
    assert pairs[-1] == (112, 1)  # one thread a rank: its half is the same
    assert all(t.ppn * t.threads <= 112 for t in trials)


def test_sockets_that_are_no_power_of_two_are_tried() -> None:
    assert 3 in grid.ppn_choices(96, 3)  # a rank a socket, run's default


class FakeConn:
    def __init__(self, host: Host, present: set[str]) -> None:
        self.host, self.present = host, present

    def run(self, argv: list[str], **_: Any) -> Any:
        found = [p for p in argv[4:] if p in self.present]
        return type("R", (), {"ok": True, "stdout": "\n".join(found) + "\n"})()


class FakePool:
    options = None

    def __init__(self, present: dict[str, set[str]]) -> None:
        self.present = present

    def get(self, host: Host) -> FakeConn:
        return FakeConn(host, self.present[host.name])

    def discard(self, host: Host) -> None:
        pass


def _settings(names: list[str]) -> Any:
    from cpuaccel.config.effective import resolve
    from cpuaccel.inventory.inventory import Inventory

    hosts = [Host(n, vars={"cpuaccel_python": "/opt/venv/bin/python"}) for n in names]
    return resolve({}, None, Inventory(None, {h.name: h for h in hosts}, {}), hosts)


def test_survey_shares_cores_of_one_machine_and_finds_allocators_every_node_has(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    facts = {"n1": dict(SMALL), "n2": dict(SMALL)}  # one boot id: one machine
    monkeypatch.setattr(nodes, "gather", lambda conn: facts[conn.host.name])
    tc = "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4"
    je = "/opt/venv/lib/libjemalloc.so"
    pool = FakePool({"n1": {tc, je}, "n2": {tc}})
    settings = _settings(["n1", "n2"])
    found = nodes.survey(settings, nodes_script(), pool, forks=2)  # type: ignore[arg-type]
    assert (found.cores, found.sockets, found.allocators) == (1, 1, ["tcmalloc"])


def nodes_script() -> Any:
    from cpuaccel.jobs.plan import Script

    return Script("train.py")


def test_a_trial_sets_ppn_threads_and_allocator_and_never_restarts() -> None:
    settings = nodes.trial_settings(_settings(["n1"]), Trial(2, 3, "none"), "cpuaccel tune")
    assert settings.ppn.value == 2 and settings.allocator.value == "none"
    assert settings.env.value["OMP_NUM_THREADS"] == "3"
    assert settings.max_restarts.value == 0 and settings.min_nodes.value is None


def test_a_trial_s_threads_win_over_a_host_s_own_env() -> None:
    from cpuaccel.config.effective import resolve
    from cpuaccel.inventory.inventory import Inventory

    python = {"cpuaccel_python": "/opt/venv/bin/python"}
    own = {"cpuaccel_env": {"OMP_NUM_THREADS": "1", "TAG": "two"}}
    hosts = [Host("n1", vars=dict(python)), Host("n2", vars={**python, **own})]
    base = resolve({}, None, Inventory(None, {h.name: h for h in hosts}, {}), hosts)
    assert base.host_env.value == {"n2": {"OMP_NUM_THREADS": "1", "TAG": "two"}}
    settings = nodes.trial_settings(base, Trial(2, 3, "none"), "cpuaccel tune")
    assert settings.env.value["OMP_NUM_THREADS"] == "3"
    assert settings.host_env.value == {"n2": {"TAG": "two"}}


def test_grid_overrides() -> None:
    spec = grid.parse_grid(("ppn=1,2 threads=1,2",))
    trials = grid.build_grid(spec, 112, 2, "auto")
    assert [(t.ppn, t.threads) for t in trials] == [(1, 1), (1, 2), (2, 1), (2, 2)]
    only_ppn = grid.build_grid(grid.parse_grid(("ppn=4",)), 112, 2, "auto")
    assert [(t.ppn, t.threads) for t in only_ppn] == [(4, 28), (4, 14)]
    spec = grid.parse_grid(("threads=8", "allocator=none,jemalloc"))
    best = Trial(2, 8, "auto")
    more = grid.allocator_trials(spec, best, ["tcmalloc"], [best])
    assert more == [Trial(2, 8, "none"), Trial(2, 8, "jemalloc")]


def test_allocators_are_tried_only_where_present_or_asked() -> None:
    best = Trial(1, 2, "auto")
    assert grid.allocator_trials(GridSpec(), best, [], [best]) == []
    assert grid.allocator_trials(GridSpec(), best, ["tcmalloc"], [best]) == [
        Trial(1, 2, "none"),
        Trial(1, 2, "tcmalloc"),
    ]


HOSTILE = [
    "", "   ", "ppn", "ppn=", "=1", "ppn=1,,2", "ppn=0", "ppn=-1", "ppn=1.5", "ppn=1e9",
    "ppn=99999999999999999999", "ppn=\u0661", "ppn=abc", "threads=0", "foo=1", "PPN=1",
    "ppn=1 ppn=2", "ppn=1,1", "allocator=tcmalloc;rm", "allocator=", "allocator=TCMALLOC",
    "ppn=1\x00", "ppn=１",
]  # fmt: skip


@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_grid_is_refused_naming_the_flag(text: str) -> None:
    with pytest.raises(UsageError) as caught:
        grid.parse_grid((text,))
    assert caught.value.message.startswith("--grid ")
    assert caught.value.exit_code == EXIT_USAGE


def test_an_axis_twice_across_flags_and_too_many_trials_are_refused() -> None:
    with pytest.raises(UsageError, match="given twice"):
        grid.parse_grid(("ppn=1", "ppn=2"))
    many = grid.build_grid(
        grid.parse_grid(("ppn=1,2,3,4,5,6,7,8 threads=1,2,3,4,5,6,7,8",)), 8, 1, "auto"
    )
    with pytest.raises(UsageError, match="more than 64"):
        grid.check_size(many, 3)


@pytest.mark.parametrize("words", [["ppn=0"], ["bogus=1"], ["ppn=1,,2"], ["ppn=1", "threads=2"]])
def test_the_command_refuses_a_hostile_grid_in_one_line(tmp_path: Path, words: list[str]) -> None:
    (tmp_path / "train.py").write_text("print('never run')\n")
    result = cpuaccel("tune", "--grid", *words, "train.py", cwd=tmp_path)
    assert result.returncode == EXIT_USAGE, result
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "--grid" in errors[0], result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("flags", "named"),
    [(["--ppn", "2"], "--ppn"), (["--nproc_per_node", "2"], "--nproc_per_node"),
     (["--env", "OMP_NUM_THREADS=2"], "OMP_NUM_THREADS"),
     (["--max-restarts", "1"], "--max-restarts"),
     (["--nodes", "1:2"], "--nodes")],
)  # fmt: skip
def test_run_flags_the_grid_sets_are_refused(tmp_path: Path, flags: list[str], named: str) -> None:
    (tmp_path / "train.py").write_text("print('never run')\n")
    result = cpuaccel("tune", *flags, "train.py", cwd=tmp_path)
    assert result.returncode == EXIT_USAGE, result
    assert named in result.stderr and "Traceback" not in result.stderr


# ---------------------------------------------------------------- measures


def metrics(folder: Path, lines: list[dict[str, Any] | str]) -> Path:
    text = "\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines)
    (folder / "metrics.jsonl").write_text(text + "\n")
    return folder


def test_samples_per_s_is_the_median_without_the_first_line(tmp_path: Path) -> None:
    lines: list[dict[str, Any] | str] = [
        {"step": 1, "samples_per_s": 1.0, "step_time": 9.0},
        {"step": 2, "samples_per_s": 10.0, "step_time": 0.5},
        "not json",
        {"step": 3, "samples_per_s": 30.0, "step_time": 0.25},
        {"step": 4, "samples_per_s": 20.0, "step_time": 0.2},
    ]
    rates = measure.read_rates(metrics(tmp_path, lines))
    assert rates == Rates(20.0, 4.0)


def test_steps_per_s_from_times_when_nothing_else(tmp_path: Path) -> None:
    lines: list[dict[str, Any] | str] = [{"step": s, "time": 100.0 + s / 2} for s in range(1, 6)]
    rates = measure.read_rates(metrics(tmp_path, lines))
    assert rates is not None and rates.samples_per_s is None
    assert rates.steps_per_s == pytest.approx(2.0)


def test_no_metrics_is_none(tmp_path: Path) -> None:
    assert measure.read_rates(tmp_path) is None
    assert measure.read_rates(metrics(tmp_path, [{"loss": 1.0}, "x"])) is None
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "metrics.jsonl").unlink()
    (tmp_path / "metrics.jsonl").symlink_to(tmp_path / "fifo")
    assert measure.read_rates(tmp_path) is None  # refused, not read (it would hang)


def row(ppn: int, status: str, samples: float | None, steps: float | None) -> Row:
    rates = Rates(samples, steps) if samples or steps else None
    return Row(Trial(ppn, 1, "auto"), status=status, rates=rates)


def test_the_best_and_ratios() -> None:
    rows = [row(1, OK, 50.0, 5.0), row(2, OK, 100.0, 4.0), row(4, "failed", None, None),
            row(8, OK, 100.0, 2.0)]  # fmt: skip
    ranking = measure.rank_rows(rows)
    assert ranking.unit == measure.SAMPLES
    assert ranking.best is rows[1]  # the first of the fastest: fewer ranks
    assert [r.ratio for r in rows] == [0.5, 1.0, None, 1.0]


def test_steps_per_s_when_one_trial_logged_no_samples() -> None:
    rows = [row(1, OK, 50.0, 5.0), row(2, OK, None, 8.0)]
    ranking = measure.rank_rows(rows)
    assert ranking.unit == measure.STEPS and ranking.best is rows[1]
    assert rows[0].ratio == pytest.approx(5 / 8)


def test_no_best_when_nothing_was_measured() -> None:
    ranking = measure.rank_rows([row(1, "timeout", None, None), row(2, "no metrics", None, None)])
    assert ranking.best is None and ranking.unit == measure.SAMPLES


# ---------------------------------------------------------------- --write

ORIGINAL = """\
# cpuaccel project file: the team's settings
inventory: inventory.yaml   # our nodes
nodes: 2
ppn: 4  # was a guess

# variables for every rank
env:
  HF_HOME: /scratch/hf   # shared cache
  OMP_NUM_THREADS: "16"
exclude: [data/, '*.bin']
"""


def test_write_changes_only_the_tuned_values(tmp_path: Path) -> None:
    path = tmp_path / "cpuaccel.yaml"
    path.write_text(ORIGINAL)
    path.chmod(0o640)
    write.write_best(path, Trial(2, 28, "tcmalloc"), with_allocator=True)
    text = path.read_text()
    expected = ORIGINAL.replace("ppn: 4  # was", "ppn: 2  # was").replace('"16"', '"28"')
    assert text == expected + "allocator: tcmalloc  # written by cpuaccel tune\n"
    config = load_config(path)
    assert config.get("ppn") == 2 and config.get("allocator") == "tcmalloc"
    assert config.get("env") == {"HF_HOME": "/scratch/hf", "OMP_NUM_THREADS": "28"}
    assert config.get("nodes") == 2 and config.get("exclude") == ["data/", "*.bin"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o640


NEW_PPN = "ppn: 1  # written by cpuaccel tune\n"
NEW_ENV = 'env: {"OMP_NUM_THREADS": "2"}  # written by cpuaccel tune\n'
ADDED = [
    ("nodes: 1\n", "nodes: 1\n" + NEW_PPN + NEW_ENV),
    ("env: {A: '1'}  # flow\nppn: 8\n", "env: {OMP_NUM_THREADS: \"2\", A: '1'}  # flow\nppn: 1\n"),
    ("env:\n    A: x\nppn: 3\n", 'env:\n    OMP_NUM_THREADS: "2"\n    A: x\nppn: 1\n'),
    ("# only a comment", "# only a comment\n" + NEW_PPN + NEW_ENV),
    ("", NEW_PPN + NEW_ENV),
]


@pytest.mark.parametrize(("before", "after"), ADDED)
def test_write_adds_what_is_missing(tmp_path: Path, before: str, after: str) -> None:
    path = tmp_path / "cpuaccel.yaml"
    path.write_text(before)
    write.write_best(path, Trial(1, 2, "auto"), with_allocator=False)
    assert path.read_text() == after
    assert load_config(path).get("ppn") == 1


def test_write_creates_a_missing_file_with_configs_writer(tmp_path: Path) -> None:
    path = tmp_path / "cpuaccel.yaml"
    write.write_best(path, Trial(2, 4, "jemalloc"), with_allocator=True)
    config = load_config(path)
    assert (config.get("ppn"), config.get("allocator")) == (2, "jemalloc")
    assert config.get("env") == {"OMP_NUM_THREADS": "4"}
    assert path.read_text().startswith("# cpuaccel project file")


def test_a_symlinked_file_is_refused_and_left_alone(tmp_path: Path) -> None:
    real = tmp_path / "real.yaml"
    real.write_text(ORIGINAL)
    link = tmp_path / "cpuaccel.yaml"
    link.symlink_to(real)
    with pytest.raises(UsageError, match="symbolic link"):
        write.write_best(link, Trial(1, 1, "auto"), with_allocator=False)
    assert link.is_symlink() and real.read_text() == ORIGINAL


def test_an_unwritable_file_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "cpuaccel.yaml"
    path.write_text(ORIGINAL)
    path.chmod(0o444)
    with pytest.raises(UsageError, match="not writable"):
        write.write_best(path, Trial(1, 1, "auto"), with_allocator=False)
    assert path.read_text() == ORIGINAL


def test_accelerates_config_given_is_not_edited() -> None:
    with pytest.raises(UsageError, match="Accelerate"):
        write.target_file("default_config.yaml", "accelerate")
    assert write.target_file("other.yaml", "cpuaccel") == Path("other.yaml")


def test_edited_text_is_read_with_the_bounded_reader() -> None:
    """PyYAML's composer recursed into a RecursionError on a file nested 5000 deep."""
    deep = "nodes: 1\nextra: " + "[" * 5000 + "\n"
    with pytest.raises(ProjectFileError, match=r"cpuaccel\.yaml:2: .*nested more than 100 levels"):
        write.edited_text(deep, {"ppn": 2}, "cpuaccel.yaml")
    with pytest.raises(ProjectFileError, match=r"cpuaccel\.yaml:2: YAML syntax error"):
        write.edited_text("ppn: [1\n", {"ppn": 2}, "cpuaccel.yaml")
