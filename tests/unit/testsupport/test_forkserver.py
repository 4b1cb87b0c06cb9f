"""The tests' fork server (testsupport/forkserver.py): a forked command gives what a
fresh ``python -m`` gives (exit code, both streams, its folder, environment, argv,
sys.path, atexit, threads, an uncaught exception); a timeout kills it; and a folder
that would shadow a loaded module, or other start-up variables, are not forked."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testsupport import forkserver
from testsupport.command import inherited_env

# A module run as `python -m probe`: everything a fresh interpreter decides shows in
# its output, then it fails as an uncaught exception does.
PROBE = """\
import atexit, json, os, sys, threading, time

def late():
    time.sleep(0.2)
    print("the non-daemon thread ended", flush=True)

atexit.register(lambda: print("atexit ran"))
threading.Thread(target=late).start()
print(json.dumps({
    "argv": sys.argv, "cwd": os.getcwd(), "path0": sys.path[0], "name": __name__,
    "probe": os.environ.get("PROBE_VALUE"),
    "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd"))[:4],
}))
sys.stderr.write("to stderr\\r\\n")
if sys.argv[1] == "raise":
    raise ValueError("as a script raises it")
sys.exit(int(sys.argv[1]))
"""


def fresh(
    module: str, *args: str, cwd: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def forked(
    module: str, *args: str, cwd: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    done = forkserver.run(module, args, cwd=cwd, env=env, timeout=60)
    assert done is not None, "not forked"
    return done


@pytest.fixture
def probe_dir(tmp_path: Path) -> Path:
    (tmp_path / "probe.py").write_text(PROBE)
    return tmp_path


@pytest.mark.parametrize("how", ["0", "3", "raise"])
def test_a_forked_module_ends_as_a_fresh_interpreter_would(probe_dir: Path, how: str) -> None:
    env = inherited_env(PROBE_VALUE="from the caller")
    ours, theirs = (
        forked("probe", how, cwd=probe_dir, env=env),
        fresh("probe", how, cwd=probe_dir, env=env),
    )
    assert ours.args == theirs.args == [sys.executable, "-m", "probe", how]
    assert ours.returncode == theirs.returncode == {"0": 0, "3": 3, "raise": 1}[how]
    assert ours.stdout == theirs.stdout
    assert f'"cwd": "{probe_dir}"' in ours.stdout and '"probe": "from the caller"' in ours.stdout
    assert f'"path0": "{probe_dir}"' in ours.stdout and '"name": "__main__"' in ours.stdout
    assert '"fds": [0, 1, 2, 3]' in ours.stdout  # 3: the listing's own; nothing else open
    assert ours.stdout.endswith("the non-daemon thread ended\natexit ran\n")
    # Tracebacks name the frames that ran the module: runpy's, in either.
    assert ours.stderr.splitlines()[0] == theirs.stderr.splitlines()[0] == "to stderr"
    assert ours.stderr.splitlines()[-1] == theirs.stderr.splitlines()[-1]
    if how == "raise":
        assert ours.stderr.splitlines()[-1] == "ValueError: as a script raises it"


@pytest.mark.parametrize(
    "args", [["--version"], ["chek"], ["config", "show", "--frobnicate"], ["config", "show"]]
)
def test_the_cli_forked_says_what_it_says_fresh(tmp_path: Path, args: list[str]) -> None:
    (tmp_path / "nodes.yaml").write_text("all:\n  hosts:\n    node1:\n")
    env = inherited_env(CPUACCEL_INVENTORY=str(tmp_path / "nodes.yaml"))
    ours, theirs = (
        forked("cpuaccel", *args, cwd=tmp_path, env=env),
        fresh("cpuaccel", *args, cwd=tmp_path, env=env),
    )
    assert (ours.returncode, ours.stdout, ours.stderr) == (
        theirs.returncode,
        theirs.stdout,
        theirs.stderr,
    )
    if args == ["config", "show"]:
        assert "environment ($CPUACCEL_INVENTORY)" in ours.stdout  # the caller's


def test_a_command_past_its_timeout_is_killed_and_its_output_kept(probe_dir: Path) -> None:
    (probe_dir / "sleeper.py").write_text(
        "import os, time\nprint(os.getpid(), flush=True)\ntime.sleep(600)\n"
    )
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as raised:
        forkserver.run("sleeper", [], cwd=probe_dir, env=inherited_env(), timeout=1.0)
    assert time.monotonic() - started < 10
    output = raised.value.output
    assert isinstance(output, str)
    pid = int(output.split()[0])
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # reaped by its waiter


def test_a_folder_that_would_shadow_a_loaded_module_is_not_forked(tmp_path: Path) -> None:
    (tmp_path / "cpuaccel.yaml").write_text("{}\n")  # not a module: forked
    assert forkserver.run("cpuaccel", ["--version"], cwd=tmp_path, env=inherited_env(), timeout=60)
    (tmp_path / "yaml.py").write_text("raise SystemExit('the shadowing yaml')\n")
    assert (
        forkserver.run("cpuaccel", ["--version"], cwd=tmp_path, env=inherited_env(), timeout=60)
        is None
    )
    (tmp_path / "yaml.py").unlink()
    (tmp_path / "click").mkdir()
    assert (
        forkserver.run("cpuaccel", ["--version"], cwd=tmp_path, env=inherited_env(), timeout=60)
        is None
    )


def test_other_start_up_variables_get_a_server_of_their_own(probe_dir: Path) -> None:
    (probe_dir / "encoding.py").write_text("import sys\nprint(sys.stdout.encoding)\n")
    env = inherited_env(PYTHONIOENCODING="latin-1")
    assert forkserver.startup_vars(env) != forkserver.startup_vars(inherited_env())
    assert forkserver.startup_vars(inherited_env(CPUACCEL_PPN="3")) == forkserver.startup_vars(
        inherited_env()
    )
    ours, theirs = (
        forked("encoding", cwd=probe_dir, env=env),
        fresh("encoding", cwd=probe_dir, env=env),
    )
    assert ours.returncode == 0 and ours.stdout == theirs.stdout
    assert ours.stdout == "iso8859-1\n"
