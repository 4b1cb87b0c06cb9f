"""`cpuaccel provision` on the real namespace cluster (3 nodes, private /srv dirs)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from cpuaccel.errors import EXIT_NODE_FAILED
from cpuaccel.testbed.cluster import Cluster
from tests.cluster.fixtures import REPO, lying_python
from testsupport.command import cpuaccel, inherited_env

pytestmark = pytest.mark.cluster

NODE_DIR = "/srv/cpuaccel-node"
# Filled by `make wheelhouse` (part of `make test`'s install step): the controller's
# wheels for offline nodes. The tests never reach an index.
WHEELHOUSE = Path(os.environ.get("CPUACCEL_TEST_WHEELHOUSE", REPO / ".wheelhouse" / "upstream"))

EVERY_MODULE = """\
- name: every module on every node
  hosts: all
  vars:
    root: "{{ base }}"
  tasks:
    - name: tree
      file: {path: "{{ root }}/etc", state: directory, mode: "0755"}
    - name: per-host template
      template: {src: node.conf.j2, dest: "{{ root }}/etc/node.conf", mode: "0644"}
    - name: content
      copy: {dest: "{{ root }}/etc/setvars.sh", content: "export CPXL_SETVARS_OK=1\\n"}
    - name: a folder pushed with rsync
      synchronize: {src: "{{ playbook_dir }}/tree/", dest: "{{ root }}/tree/", delete: true}
    - name: command once
      command: {argv: [cp, "{{ root }}/etc/node.conf", "{{ root }}/copy.conf"], creates: "{{ root }}/copy.conf"}
    - name: shell check
      shell: grep -c node "{{ root }}/etc/node.conf"
      register: grep
      changed_when: false
    - name: assert on a registered result
      assert: {that: ["grep.stdout | trim == '1'"]}
    - name: setvars
      setvars: {paths: ["{{ root }}/etc/setvars.sh"], search: false, required: true, record: "{{ root }}/setvars.path"}
      register: sv
    - name: setvars sets the variable
      assert: {that: ["'CPXL_SETVARS_OK' in sv.sets"]}
    - name: stat
      stat: {path: "{{ root }}/copy.conf"}
      register: st
    - name: a venv with a package from the pushed folder
      pip:
        name: [cpxltiny==1.0]
        virtualenv: "{{ root }}/venv"
        virtualenv_command: /usr/bin/python3 -m venv
        no_index: true
        find_links: ["{{ root }}/tree"]
    - name: a message
      debug: {msg: "{{ st.stat.size }}"}
"""


def provision(
    inventory: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    return cpuaccel(
        "provision", str(inventory), *args, env=inherited_env(**(env or {})), timeout=timeout
    )


def report(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert proc.stdout.startswith("{"), proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


def on_node(cluster: Cluster, name: str, *argv: str) -> str:
    proc = cluster.exec(name, list(argv))
    return str(proc.stdout) if proc.returncode == 0 else f"<exit {proc.returncode}>"


@pytest.fixture
def workspace(tmp_path: Path, cluster: Cluster) -> tuple[Path, str]:
    """A playbook folder on the controller and a fresh path on every node."""
    base = f"{NODE_DIR}/pb-{uuid.uuid4().hex[:8]}"
    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "node.conf.j2").write_text(
        "node={{ inventory_hostname }} address={{ ansible_host }}\n"
    )
    (tmp_path / "tree" / "sub").mkdir(parents=True)
    (tmp_path / "tree" / "sub" / "f.txt").write_text("pushed\n")
    tiny_wheel(tmp_path / "tree")
    return tmp_path, base


def playbook_on(
    cluster: Cluster, workspace: tuple[Path, str], playbook: str
) -> tuple[Path, Path, str]:
    """The playbook written into the workspace, an inventory of the cluster whose `base`
    var is the workspace's path on the nodes, and that path."""
    folder, base = workspace
    book = folder / "play.yaml"
    book.write_text(playbook)
    return book, cluster.write_inventory(folder / "inventory.yaml", base=base), base


def tiny_wheel(folder: Path) -> Path:
    """A minimal valid wheel (one module), for pip on nodes without an index."""
    import base64
    import hashlib
    import zipfile

    files = {
        "cpxltiny.py": b"VALUE = 1\n",
        "cpxltiny-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: cpxltiny\nVersion: 1.0\n",
        "cpxltiny-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\n"
        b"Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append("cpxltiny-1.0.dist-info/RECORD,,")
    files["cpxltiny-1.0.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    path = folder / "cpxltiny-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(zipfile.ZipInfo(name, (1980, 1, 1, 0, 0, 0)), data)
    return path


def test_every_module_runs_then_reruns_with_no_change(
    cluster: Cluster, workspace: tuple[Path, str]
) -> None:
    book, inventory, base = playbook_on(cluster, workspace, EVERY_MODULE)
    first = report(provision(inventory, "--playbook", str(book), "--json"))
    assert first["ok"], json.dumps(first["plays"], indent=1)[-3000:]
    for name in cluster.names:
        stats = first["stats"][name]
        assert stats["changed"] >= 5 and stats["failed"] == 0, stats
        address = cluster.node(name).address
        # Each node has its own rendering of the template, in its own private dir.
        assert on_node(cluster, name, "cat", f"{base}/etc/node.conf") == (
            f"node={name} address={address}\n"
        )
        assert on_node(cluster, name, "cat", f"{base}/tree/sub/f.txt") == "pushed\n"
        assert on_node(cluster, name, "cat", f"{base}/setvars.path").strip() == (
            f"{base}/etc/setvars.sh"
        )
        assert on_node(cluster, name, f"{base}/venv/bin/python", "-c", "import cpxltiny") == ""
    second = report(provision(inventory, "--playbook", str(book), "--json"))
    assert second["ok"]
    for name in cluster.names:
        assert second["stats"][name]["changed"] == 0, second["stats"][name]
    # A pushed file edited on one node (same size) is found and put back by rsync.
    edited = cluster.names[0]
    cluster.exec(edited, ["sh", "-c", f"echo PUSHED > {base}/tree/sub/f.txt"], check=True)
    third = report(provision(inventory, "--playbook", str(book), "--json"))
    push = next(t for t in third["plays"][0]["tasks"] if t["task"] == "a folder pushed with rsync")
    assert {n: r["status"] for n, r in push["hosts"].items()} == {
        n: "changed" if n == edited else "ok" for n in cluster.names
    }
    assert on_node(cluster, edited, "cat", f"{base}/tree/sub/f.txt") == "pushed\n"


LARGE_FOLDER = """\
- name: a large folder to every node
  hosts: all
  tasks:
    - name: push
      synchronize: {src: "{{ playbook_dir }}/big/", dest: "{{ base }}/big/", delete: true}
"""

MIB = 1 << 20
STAT = (  # a file's sha256, mtime in ns and mode, as read on the node itself
    "import hashlib,os,sys; p = sys.argv[1]; s = os.stat(p)\n"
    "print(hashlib.sha256(open(p, 'rb').read()).hexdigest(), s.st_mtime_ns, oct(s.st_mode & 0o777))"
)


def test_synchronize_sends_large_files_through_one_broadcast(
    cluster: Cluster, workspace: tuple[Path, str]
) -> None:
    folder, _ = workspace
    big = {"a.bin": 7 * MIB, "sub/b.bin": 6 * MIB, "c.bin": 4 * MIB}  # 17 MiB: a broadcast
    for rel, size in big.items():
        (folder / "big" / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / "big" / rel).write_bytes(os.urandom(size))
    (folder / "big" / "c.bin").chmod(0o600)
    (folder / "big" / "small.txt").write_text("small\n")
    book, inventory, base = playbook_on(cluster, workspace, LARGE_FOLDER)

    def push() -> dict[str, Any]:
        done = report(provision(inventory, "--playbook", str(book), "--json"))
        assert done["ok"], json.dumps(done["plays"], indent=1)[-3000:]
        return next(t for t in done["plays"][0]["tasks"] if t["task"] == "push")  # type: ignore[no-any-return]

    def held() -> dict[str, dict[str, str]]:
        return {
            name: {
                rel: on_node(cluster, name, sys.executable, "-c", STAT, f"{base}/big/{rel}")
                for rel in [*big, "small.txt"]
            }
            for name in cluster.names
        }

    def source() -> dict[str, str]:
        out = {}
        for rel in [*big, "small.txt"]:
            path = folder / "big" / rel
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            out[rel] = f"{digest} {path.stat().st_mtime_ns} {oct(path.stat().st_mode & 0o777)}\n"
        return out

    first = push()
    assert "notes" not in first, first["notes"]  # every hop came up: no node served directly
    for result in first["hosts"].values():
        assert result["status"] == "changed", result
        assert result["broadcast"] == sorted(big), result
        # rsync itself sent only the small file: the large ones were there, equal
        assert not any(rel in item for item in result["items"] for rel in big), result["items"]
        assert any("small.txt" in item for item in result["items"]), result["items"]
    # bytes, mode and mtime (to the nanosecond) as the controller's, on every node
    assert held() == dict.fromkeys(cluster.names, source())
    second = push()
    assert {n: (r["status"], "broadcast" in r) for n, r in second["hosts"].items()} == {
        n: ("ok", False) for n in cluster.names
    }
    # one large file changed: below the broadcast's total, rsync sends it to each node
    with (folder / "big" / "a.bin").open("ab") as f:
        f.write(b"more")
    third = push()
    for result in third["hosts"].values():
        assert "broadcast" not in result and any("a.bin" in i for i in result["items"]), result
    assert held() == dict.fromkeys(cluster.names, source())


def test_a_node_lying_about_a_broadcast_file_is_named_and_gets_it_by_rsync(
    cluster: Cluster, workspace: tuple[Path, str]
) -> None:
    folder, _ = workspace
    big = {"a.bin": 9 * MIB, "b.bin": 8 * MIB}
    for rel, size in big.items():
        (folder / "big").mkdir(exist_ok=True)
        (folder / "big" / rel).write_bytes(os.urandom(size))
    book, _, base = playbook_on(cluster, workspace, LARGE_FOLDER)
    # node3's agent and relay run under an interpreter that falsifies the kept sha256
    inventory = cluster.write_inventory(
        folder / "liar.yaml",
        {"node3": {"ansible_python_interpreter": str(lying_python(folder))}},
        base=base,
    )
    done = report(provision(inventory, "--playbook", str(book), "--json"))
    assert done["ok"], json.dumps(done["plays"], indent=1)[-3000:]
    push = next(t for t in done["plays"][0]["tasks"] if t["task"] == "push")
    assert any("node3" in note and "sha256" in note for note in push["notes"]), push
    assert push["hosts"]["node1"]["broadcast"] == sorted(big)
    liar = push["hosts"]["node3"]
    assert "broadcast" not in liar and liar["status"] == "changed", liar
    for name in cluster.names:
        for rel in big:
            there = on_node(cluster, name, "sha256sum", f"{base}/big/{rel}").split()[0]
            assert there == hashlib.sha256((folder / "big" / rel).read_bytes()).hexdigest()


LARGE_COPY = """\
- name: a large file to every node
  hosts: all
  tasks:
    - file: {path: "{{ base }}", state: directory}
    - name: small
      copy: {content: "small\\n", dest: "{{ base }}/small.txt"}
    - name: weights
      copy: {src: "{{ playbook_dir }}/model.bin", dest: "{{ base }}/", mode: "0640"}
    - name: plain
      copy: {src: "{{ playbook_dir }}/model.bin", dest: "{{ base }}/plain.bin"}
"""


def test_copy_sends_a_large_file_through_one_broadcast_and_nothing_when_it_is_there(
    cluster: Cluster, workspace: tuple[Path, str]
) -> None:
    folder, _ = workspace
    (folder / "model.bin").write_bytes(os.urandom(17 * MIB))
    digest = hashlib.sha256((folder / "model.bin").read_bytes()).hexdigest()
    book, inventory, base = playbook_on(cluster, workspace, LARGE_COPY)

    def play() -> dict[str, dict[str, Any]]:
        done = report(provision(inventory, "--playbook", str(book), "--json"))
        assert done["ok"], json.dumps(done["plays"], indent=1)[-3000:]
        return {t["task"]: t for t in done["plays"][0]["tasks"]}

    def held(name: str, rel: str) -> tuple[str, str]:
        digest, _, mode = on_node(
            cluster, name, sys.executable, "-c", STAT, f"{base}/{rel}"
        ).split()
        return digest, mode

    first = play()
    for task, kept in (("weights", "model.bin"), ("plain", "plain.bin")):
        assert "notes" not in first[task], first[task]["notes"]
        for name, result in first[task]["hosts"].items():
            assert (result["status"], result["broadcast"]) == ("changed", [kept]), (name, result)
    for name in cluster.names:
        assert held(name, "model.bin") == (digest, "0o640")
        # without a mode, the mode a new file gets there, as copy's own write gives it
        assert held(name, "plain.bin") == (digest, held(name, "small.txt")[1])
    second = play()
    for task in ("weights", "plain"):
        assert {n: (r["status"], "broadcast" in r) for n, r in second[task]["hosts"].items()} == {
            n: ("ok", False) for n in cluster.names
        }
    # one node's copy differs: one node alone is no broadcast; copy sends it there directly
    cluster.exec("node2", ["sh", "-c", f"echo more >> {base}/model.bin"])
    third = play()
    statuses = {n: (r["status"], "broadcast" in r) for n, r in third["weights"]["hosts"].items()}
    assert statuses == {n: ("changed" if n == "node2" else "ok", False) for n in cluster.names}
    assert held("node2", "model.bin") == (digest, "0o640")


def test_check_on_fresh_nodes_reports_changes_and_touches_nothing(
    cluster: Cluster, workspace: tuple[Path, str]
) -> None:
    book, inventory, base = playbook_on(cluster, workspace, EVERY_MODULE)
    result = report(provision(inventory, "--playbook", str(book), "--check", "--json"))
    assert result["check"] is True
    for name in cluster.names:
        assert result["stats"][name]["changed"] >= 4, result["stats"][name]
        assert on_node(cluster, name, "ls", base).startswith("<exit"), "check mode wrote"


def test_a_failing_node_drops_out_alone_and_the_recap_says_so(
    cluster: Cluster, workspace: tuple[Path, str]
) -> None:
    book, inventory, base = playbook_on(
        cluster,
        workspace,
        """\
- hosts: all
  tasks:
    - name: breaks on one node
      command: "false"
      when: inventory_hostname == groups['all'][1]
    - name: the others go on
      file: {path: "{{ base }}", state: directory}
""",
    )
    proc = provision(inventory, "--playbook", str(book))
    assert proc.returncode == EXIT_NODE_FAILED, proc.stdout + proc.stderr
    broken = cluster.names[1]
    others = [n for n in cluster.names if n != broken]
    assert f"failed: {broken}" in proc.stdout
    assert f"{broken} : ok=1 changed=0 unreachable=0 failed=1" in proc.stdout
    for name in others:
        assert f"{name} : ok=2 changed=1 unreachable=0 failed=0 skipped=1" in proc.stdout
        assert on_node(cluster, name, "ls", "-d", base).strip() == base
    assert on_node(cluster, broken, "ls", "-d", base).startswith("<exit")


def test_an_unreachable_node_is_counted_and_the_rest_run(
    cluster: Cluster, workspace: tuple[Path, str]
) -> None:
    book, inventory, _ = playbook_on(
        cluster,
        workspace,
        "- hosts: all\n  tasks:\n    - file: {path: '{{ base }}', state: directory}\n",
    )
    down = cluster.names[2]
    with cluster.sshd_stopped(down):
        result = report(provision(inventory, "--playbook", str(book), "--json", "-T", "3"))
    assert result["ok"] is False
    assert result["stats"][down]["unreachable"] == 1
    for name in cluster.names[:2]:
        assert result["stats"][name] == {**result["stats"][name], "changed": 1, "failed": 0}


@pytest.mark.skipif(
    not (WHEELHOUSE / ".cpuaccel-wheelhouse.json").is_file()
    and os.environ.get("CPUACCEL_REQUIRE_CLUSTER") != "1",
    reason=f"no wheelhouse at {WHEELHOUSE}: run `make wheelhouse`",
)
def test_default_playbook_takes_fresh_nodes_to_ready(cluster: Cluster, tmp_path: Path) -> None:
    """The upstream stack from the controller's wheelhouse; a re-run changes nothing;
    then `cpuaccel check` finds no problem with the provisioned venvs."""
    venv = f"{NODE_DIR}/venv-{uuid.uuid4().hex[:6]}"
    inventory = cluster.write_inventory(
        tmp_path / "inventory.yaml",
        cpuaccel_python=None,  # nodes use the venv provision makes
        cpuaccel_venv=venv,
        ansible_python_interpreter="/usr/bin/python3",  # the node's system Python
        cpuaccel_wheelhouse=str(WHEELHOUSE),
    )
    # Any pip download the controller does stays offline: the wheelhouse is its own index.
    offline = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(WHEELHOUSE)}
    first = report(provision(inventory, "--json", env=offline))
    assert first["ok"], json.dumps(first["plays"], indent=1)[-3000:]
    # the wheelhouse's large wheels reach the nodes through one broadcast, not rsync's
    # (a node that falls behind on this unshaped, busy bed may be served directly: a note)
    tasks = [t for play in first["plays"] for t in play["tasks"]]
    pushed = next(t for t in tasks if t["task"] == "Push the wheelhouse")
    for name in cluster.names:
        wheels = pushed["hosts"][name]["broadcast"]
        assert any(w.startswith("torch-") for w in wheels), wheels
    second = report(provision(inventory, "--json", env=offline))
    assert second["ok"], json.dumps(second["plays"], indent=1)[-3000:]
    for name in cluster.names:
        assert second["stats"][name]["changed"] == 0, second["stats"][name]
        assert on_node(
            cluster, name, f"{venv}/bin/python", "-c", "import torch; print(torch.__version__)"
        ).startswith("2.13.0")
    check = cpuaccel("check", "-i", str(inventory), "--json", timeout=120)
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr
    assert json.loads(check.stdout)["problems"] == []
