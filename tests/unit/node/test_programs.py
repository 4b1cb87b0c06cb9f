"""The node programs as the controller ships them: each bundled with only the parts it
imports, runnable without cpuaccel installed and compiled whole; the one-shot tree
program only looks; and the controller's one translation of their answers
(connectors/programs.answer)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cpuaccel import node
from cpuaccel.connectors import programs
from cpuaccel.connectors.base import CommandResult
from cpuaccel.errors import HostError


def test_each_program_carries_only_the_parts_it_imports() -> None:
    # jobprocs: the jobs' processes on the node, which the probe reports
    assert node.parts("facts") == ["common", "jobprocs", "netif", "facts"]
    # boundedjson: the one JSON reader, in every program that reads a request or a file
    tree = ["boundedjson", "common", "destination", "entries", "nofollow", "unfinished", "tree"]
    assert node.parts("tree") == tree  # unfinished: a folder the sync made (rsync)
    # runfiles: ps, logs; progress: run --hang-timeout's stacks; mux: the head's masters
    jobctl = ["boundedjson", "common", "jobprocs", "nofollow", "mux", "progress", "runfiles"]
    jobctl += ["jobctl"]
    assert node.parts("jobctl") == jobctl
    agent = node.parts("agent")
    assert agent[-1] == "agent" and {"common", "facts", "pip", "pep440"} <= set(agent)
    assert agent.index("pep440") < agent.index("pip")  # what a part imports runs first
    with pytest.raises(ValueError, match="no node program"):
        node.parts("common")


def test_a_bundled_program_runs_without_cpuaccel_installed(tmp_path: Path) -> None:
    """-I: no PYTHONPATH, no site-packages; the program has everything it imports."""
    source = node.program("jobctl")
    argv = programs.argv(sys.executable, "jobctl", ["procs", "no-such-run"])
    isolated = [argv[0], "-I", *argv[1:]]
    done = subprocess.run(isolated, input=source, capture_output=True, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == b'{"pids": []}\n'


@pytest.mark.parametrize("mode", ["scan", "apply", "nonsense"])
def test_the_one_shot_tree_program_only_looks(tmp_path: Path, mode: str) -> None:
    """Run alone, ``tree`` answers ``look`` (srun's preflight) and refuses the modes that
    write (a sync sends those to ``treesession``): nothing created, exit 64."""
    source = node.program("tree")
    dest = tmp_path / "dest"

    def call(*words: str) -> subprocess.CompletedProcess[bytes]:
        argv = programs.argv(sys.executable, "tree", list(words))
        return subprocess.run(argv, input=source, capture_output=True, check=False)

    refused = call(mode, str(dest), f"--workdir={tmp_path / 'work'}")
    assert refused.returncode == 64 and b"look" in refused.stderr
    assert not dest.exists()
    looked = call("look", str(dest), f"--workdir={tmp_path / 'work'}")
    assert looked.returncode == 0, looked.stderr
    assert b'"dest"' in looked.stdout and not dest.exists()


@pytest.mark.parametrize(
    ("code", "stdout", "stderr", "message"),
    [
        (127, "", "sh: 1: /x/python: not found", "the interpreter '/x/python' cannot be run"),
        (1, "", "Traceback\nOSError: disk full", r"syncing failed on the node \(exit code 1\)"),
        (0, "Welcome!\n{}", "", "answer was not understood"),
        (0, "[1]", "", "answer was not understood"),
        (0, "[" * 3000, "", "answer was refused: values nested more than 200 levels deep"),
        (0, '{"a": ' + "[" * 900 + "]" * 900 + "}", "", "answer was refused: values nested"),
    ],
)
def test_answer_turns_every_failure_into_a_host_error(
    code: int, stdout: str, stderr: str, message: str
) -> None:
    result = CommandResult("node1", "python", code, stdout, stderr, 0.1)
    with pytest.raises(HostError, match=message):
        programs.answer("node1", "/x/python", result, "syncing")


def test_answer_returns_the_json_object() -> None:
    result = CommandResult("node1", "python", 0, '{"a": 1}\n', "", 0.1)
    assert programs.answer("node1", "python3", result, "x") == {"a": 1}


def test_every_node_program_compiles(tmp_path: Path) -> None:
    for name in node.PROGRAMS:
        source = tmp_path / f"{name}.py"
        source.write_bytes(node.program(name))
        done = subprocess.run(
            [sys.executable, "-m", "py_compile", str(source)], capture_output=True, text=True
        )
        assert done.returncode == 0, (name, done.stderr)


def test_the_sync_receiver_starts_without_site_and_the_other_programs_with_it() -> None:
    """The receiver needs the standard library only; the fact probe reads site-packages."""
    assert programs.argv("py", "treesession", ["/d"])[:3] == ["py", "-S", "-c"]
    assert programs.argv("py", "facts")[:2] == ["py", "-c"]
