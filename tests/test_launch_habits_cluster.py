"""Issue 13, items 1 and 4 on the namespace cluster: a job launched with accelerate
launch's spellings runs where they say, and `--env NAME` brings this shell's value to
every rank (a credential's only through secret.env)."""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from pathlib import Path

import pytest

from cpuaccel.testing.cluster import Cluster
from cpuaccel.testing.command import clean_env, cpuaccel
from cpuaccel.testing.runs import Run, make_project

pytestmark = pytest.mark.cluster


def test_accelerate_spellings_and_env_names_reach_every_rank(
    cluster: Cluster, inventory: str, tmp_path: Path
) -> None:
    token = f"hf_{uuid.uuid4().hex}"
    script = (
        "import hashlib, json, os, socket\n"
        "keys = ('RANK', 'WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT', 'PLAIN_SETTING')\n"
        "seen = {k: os.environ[k] for k in keys}\n"
        "seen['token'] = hashlib.sha256(os.environ['HF_TOKEN'].encode()).hexdigest()\n"
        "print(json.dumps({**seen, 'host': socket.gethostname()}))\n"
    )
    proj = make_project(tmp_path, {"train.py": script})
    env = clean_env(HF_TOKEN=token, PLAIN_SETTING="plain value", HF_HOME=str(tmp_path / "hf"))
    started = time.monotonic()
    proc = cpuaccel(
        "run", "-i", inventory, "--num_processes", "4", "--num_machines", "2",
        "--main_process_ip", "node3", "--main_process_port", "29631",
        "--env", "HF_TOKEN", "--env", "PLAIN_SETTING", "train.py",
        cwd=proj, env=env, timeout=240,
    )  # fmt: skip
    run = Run(proc, time.monotonic() - started)
    assert run.code == 0, run
    ranks = {r: (host, json.loads(text)) for r, (host, text) in run.ranks().items()}
    assert sorted(ranks) == [0, 1, 2, 3], run
    digest = hashlib.sha256(token.encode()).hexdigest()
    for rank, (host, seen) in ranks.items():
        # --main_process_ip node3 is the head: ranks 0 and 1 there, 2 and 3 on node1.
        assert host == seen["host"] == ("node3" if rank < 2 else "node1"), ranks
        assert seen["WORLD_SIZE"] == "4" and seen["MASTER_ADDR"] == "node3"
        assert seen["MASTER_PORT"] == "29631"
        assert seen["PLAIN_SETTING"] == "plain value" and seen["token"] == digest
    assert token not in run.stdout + run.stderr
    record = run.record()
    assert record["secret_names"] == ["HF_TOKEN"] and "HF_TOKEN" not in record["env_names"]
    assert "PLAIN_SETTING" in record["env_names"]
    for path in run.run_dir.rglob("*"):
        if path.is_file():
            assert token.encode() not in path.read_bytes(), path
