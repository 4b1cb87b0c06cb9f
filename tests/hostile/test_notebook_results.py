"""A notebook's result file changed on its node is refused, never unpickled: a pickle
that would create a marker file when loaded, put in place of a rank's value (by hand,
and in a real job on this machine by a process the rank left behind), raises
ResultRefused naming the rank and its node, and the marker never appears. The run's
key is in no file of the controller's run folder."""

from __future__ import annotations

import os
import pickle
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import cpuaccel
import cpuaccel.notebook as notebook
from cpuaccel.jobs.result import JobReport
from cpuaccel.notebook import payload
from cpuaccel.notebook.launching import Outcome, finish

TREE = str(Path(cpuaccel.__file__).resolve().parent.parent)
ENV = {"PYTHONPATH": TREE}
OTHER_KEY = "00" * payload.KEY_BYTES


def evil_pickle(marker: Path) -> bytes:
    """A pickle whose loading creates ``marker`` (protocol 0: builtins.open(marker, "w"))."""
    return b"cbuiltins\nopen\n(V" + str(marker).encode() + b"\nVw\ntR."


def report() -> JobReport:
    done = JobReport(0, "completed", 1.0, "r1", "/p/runs/r1", ["n1", "n2"], 1, 2)
    done.ranks = {0: 0, 1: 0}
    return done


def test_the_evil_pickle_does_create_its_marker_when_loaded(tmp_path: Path) -> None:
    marker = tmp_path / "loaded"
    pickle.loads(evil_pickle(marker)).close()
    assert marker.exists()  # the test's weapon works: its absence below means something


@pytest.mark.parametrize(
    "forge",
    [
        pytest.param(lambda key, data: data, id="bare-pickle"),
        pytest.param(lambda key, data: payload.seal(OTHER_KEY, 1, data), id="other-key"),
        pytest.param(lambda key, data: payload.seal(key, 0, data), id="rank-0s-seal"),
        pytest.param(lambda key, data: payload.seal(key, 1, b"x")[:32] + data, id="other-value"),
        pytest.param(lambda key, data: b"", id="empty"),
    ],
)
def test_a_forged_result_is_refused_and_never_unpickled(
    tmp_path: Path, forge: Callable[[str, bytes], bytes]
) -> None:
    key = payload.new_key()
    marker = tmp_path / "loaded"
    good = payload.seal(key, 0, payload.value_bytes("fine"))
    outcome = Outcome(
        key=key,
        values={0: good, 1: forge(key, evil_pickle(marker))},
        hosts={0: "n1", 1: "n2"},
    )
    with pytest.raises(notebook.ResultRefused) as raised:
        finish(report(), outcome, gather=True)
    assert not marker.exists()
    error = raised.value
    assert (error.rank, error.host, error.run_id) == (1, "n2", "r1")
    assert "\n" not in str(error)
    assert str(error).startswith("the value of rank 1 on n2 (run r1) was refused, not unpickled")
    assert isinstance(error, notebook.JobError)
    assert finish(report(), outcome, gather=False) == "fine"  # rank 0's own is good


# ---------------------------------------------------------------- a real job here


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project folder of this machine, with mpirun beside this Python on PATH."""
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)
    monkeypatch.delenv("CPUACCEL_INVENTORY", raising=False)
    bin_dir = os.path.dirname(sys.executable)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / ".cache"))
    return project


def swapped_on_rank_one(marker: str) -> int:
    """Rank 1 leaves a process behind that puts a pickle creating ``marker`` in place of
    its result file as soon as the rank has written it (as another user, or anything
    else on the node, could)."""
    import os
    import time

    rank = int(os.environ["RANK"])
    if rank == 1 and os.fork() == 0:
        target = os.path.join(os.environ["CPUACCEL_RUN_DIR"], "notebook-result-1.pkl")
        evil = b"cbuiltins\nopen\n(V" + marker.encode() + b"\nVw\ntR."
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not os.path.exists(target):
            time.sleep(0.001)
        with open(target + ".swap", "wb") as f:
            f.write(evil)
        os.replace(target + ".swap", target)
        os._exit(0)
    return rank


def test_a_result_swapped_on_the_node_is_refused_and_good_ones_still_come_back(
    here: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys: list[str] = []
    new_key = payload.new_key
    monkeypatch.setattr(payload, "new_key", lambda: keys.append(new_key()) or keys[-1])
    marker = tmp_path / "loaded"
    with pytest.raises(notebook.ResultRefused) as raised:
        notebook.launch(swapped_on_rank_one, str(marker), nodes=1, ppn=2, gather=True, env=ENV)
    assert not marker.exists()
    assert (raised.value.rank, raised.value.host) == (1, "localhost")
    assert "rank 1 on localhost" in str(raised.value)
    # Good values still come back, and rank 0's alone is wanted here.
    assert notebook.launch(swapped_on_rank_one, str(marker), nodes=1, ppn=2, env=ENV) == 0
    assert not marker.exists()
    # The keys were in no file of the controller's run folders (secret.env is gone too).
    assert len(keys) == 2
    for path in (here / "runs").rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert not any(k.encode() in data for k in keys), path
    assert not list((here / "runs").rglob("secret.env"))
