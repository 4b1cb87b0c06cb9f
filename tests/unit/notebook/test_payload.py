"""The call's run file and the rank runner: a function defined in ``__main__`` travels
by value, and each rank leaves its value or its traceback in the run folder."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import cpuaccel
from cpuaccel.notebook import payload

TREE = str(Path(cpuaccel.__file__).resolve().parent.parent)


def python(code: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": TREE, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_main_function_travels_by_value_to_a_process_without_its_source(
    tmp_path: Path,
) -> None:
    # Written by a __main__ whose source the reading process never sees.
    writer = tmp_path / "writer"
    writer.mkdir()
    done = python(
        """
        from cpuaccel.notebook import payload
        SCALE = 3
        class Point:
            def __init__(self, x):
                self.x = x
        def helper(v):
            return v * SCALE
        def fn(a, b=0):
            return Point(helper(a) + b).x
        print(payload.dumps(payload.Call(fn, (5,), gather=True)), end="")
        """,
        writer,
    )
    assert done.returncode == 0, done.stderr
    reader = tmp_path / "reader"
    reader.mkdir()
    (reader / "call.b64").write_text(done.stdout)
    read = python(
        """
        from cpuaccel.notebook import payload
        call = payload.loads(open("call.b64").read())
        print(call.fn.__module__, call.gather, call.fn(*call.args), call.fn(1, b=1))
        """,
        reader,
    )
    assert read.returncode == 0, read.stderr
    assert read.stdout.split() == ["__main__", "True", "15", "4"]


def test_a_value_comes_back_as_it_was() -> None:
    value = {"loss": [2.5, 1.25], "ranks": 4, "nested": (None, b"x")}
    assert payload.value_of(payload.value_bytes(value)) == value


def test_a_file_that_is_no_call_is_refused() -> None:
    import base64

    text = base64.b64encode(pickle.dumps({"not": "a call"})).decode()
    try:
        payload.loads(text)
    except TypeError as exc:
        assert "not a notebook call" in str(exc)
    else:
        raise AssertionError("loaded")


def write_call(run_dir: Path, fn_source: str, gather: bool) -> None:
    """A call of ``fn`` (defined in a __main__ of its own) in ``run_dir``."""
    done = python(
        fn_source + f"\nfrom cpuaccel.notebook import payload\n"
        f"print(payload.dumps(payload.Call(fn, (7,), gather={gather})), end='')\n",
        run_dir,
    )
    assert done.returncode == 0, done.stderr
    (run_dir / payload.CALL).write_text(done.stdout)


KEY = "5a" * payload.KEY_BYTES


def read_value(run_dir: Path, rank: int) -> object:
    sealed = (run_dir / payload.result_name(rank)).read_bytes()
    return payload.value_of(payload.unseal(KEY, rank, sealed))


def run_rank(run_dir: Path, rank: int, key: str = KEY) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cpuaccel.notebook.rank"],
        cwd=run_dir,
        env={**os.environ, "PYTHONPATH": TREE, "CPUACCEL_RUN_DIR": str(run_dir),
             "RANK": str(rank), payload.KEY_ENV: key},
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip


RETURNS = """
import os
def fn(x):
    print("running", os.environ["RANK"])
    return {"rank": int(os.environ["RANK"]), "x": x}
"""

RAISES = """
import os
def inner(x):
    raise ValueError(f"no good on rank {os.environ['RANK']}: {x}")
def fn(x):
    return inner(x)
"""


def test_rank_zero_writes_its_value_and_the_others_nothing_unless_gathered(
    tmp_path: Path,
) -> None:
    write_call(tmp_path, RETURNS, gather=False)
    for rank in (0, 1):
        done = run_rank(tmp_path, rank)
        assert done.returncode == 0, done.stderr
        assert done.stdout == f"running {rank}\n"
    assert read_value(tmp_path, 0) == {"rank": 0, "x": 7}
    assert not (tmp_path / payload.result_name(1)).exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []

    write_call(tmp_path, RETURNS, gather=True)
    assert run_rank(tmp_path, 1).returncode == 0
    assert read_value(tmp_path, 1) == {"rank": 1, "x": 7}


def test_a_raising_rank_writes_and_prints_its_traceback_and_exits_1(tmp_path: Path) -> None:
    write_call(tmp_path, RAISES, gather=False)
    (tmp_path / payload.result_name(1)).write_bytes(b"an earlier attempt's")
    done = run_rank(tmp_path, 1)
    assert done.returncode == 1
    text = (tmp_path / payload.error_name(1)).read_text()
    assert text == done.stderr
    lines = text.splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert lines[-1] == "ValueError: no good on rank 1: 7"
    assert ", in fn" in text and ", in inner" in text
    assert "rank.py" not in text  # the runner's own frame is left out
    assert not (tmp_path / payload.result_name(1)).exists()  # the stale one went


def test_without_a_run_folder_the_runner_says_so(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "cpuaccel.notebook.rank"],
        env={k: v for k, v in os.environ.items() if k != "CPUACCEL_RUN_DIR"} | {"PYTHONPATH": TREE},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "CPUACCEL_RUN_DIR is not set" in done.stderr


def test_the_rank_side_imports_no_controller_module(tmp_path: Path) -> None:
    write_call(tmp_path, RETURNS, gather=False)
    done = python(
        """
        import os, runpy, sys
        sys.argv = ["rank"]
        try:
            runpy.run_module("cpuaccel.notebook.rank", run_name="__main__")
        except SystemExit:
            pass
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("rich", "click", "paramiko",
            "jinja2", "yaml") or m.startswith(("cpuaccel.jobs", "cpuaccel.api", "cpuaccel.config")))
        print(heavy)
        """,
        tmp_path,
        CPUACCEL_RUN_DIR=str(tmp_path),
        RANK="0",
        **{payload.KEY_ENV: KEY},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]"


SPIES = """
import os
def fn(x):
    return os.environ.get("CPUACCEL_NOTEBOOK_KEY", "not in my environment")
"""


def test_a_value_is_sealed_with_the_run_key_in_a_private_file(tmp_path: Path) -> None:
    tmp_path.chmod(0o700)
    write_call(tmp_path, SPIES, gather=False)
    old = os.umask(0o022)  # the usual umask: 0644 files unless made private
    try:
        done = run_rank(tmp_path, 0)
    finally:
        os.umask(old)
    assert done.returncode == 0, done.stderr
    result = tmp_path / payload.result_name(0)
    assert result.stat().st_mode & 0o777 == 0o600
    # The key left the environment before the function ran.
    assert read_value(tmp_path, 0) == "not in my environment"
    sealed = result.read_bytes()
    with pytest.raises(payload.Unsealed):  # another rank's name, another key
        payload.unseal(KEY, 1, sealed)
    with pytest.raises(payload.Unsealed):
        payload.unseal("00" * payload.KEY_BYTES, 0, sealed)
    with pytest.raises(payload.Unsealed):
        payload.unseal(KEY, 0, sealed[:-1] + bytes([sealed[-1] ^ 1]))
    with pytest.raises(payload.Unsealed):
        payload.unseal(KEY, 0, sealed[:5])


def test_a_rank_without_the_run_key_writes_nothing(tmp_path: Path) -> None:
    write_call(tmp_path, RETURNS, gather=False)
    done = run_rank(tmp_path, 0, key="")
    assert done.returncode == 2
    assert "CPUACCEL_NOTEBOOK_KEY is not set" in done.stderr
    assert not (tmp_path / payload.result_name(0)).exists()
