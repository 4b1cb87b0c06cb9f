"""Start-up guard: the SSH stack loads only when an SSH connection is really opened.

paramiko, cryptography, Fabric and invoke cost 0.1-0.3 s of every command's start-up
(a sync must go at rsync's speed). Each check runs in a fresh interpreter, as a user's
command does, and lists what sys.modules holds at its end."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HEAVY = ("paramiko", "cryptography", "fabric", "invoke", "nacl", "torch")

# Runs the CLI as `python -m cpuaccel ...` does, then prints the heavy modules loaded.
PROBE = """
import json, sys
heavy = {heavy!r}
code = 0
try:
    from cpuaccel.cli.main import main
    sys.argv = ["cpuaccel", *{argv!r}]
    main()
except SystemExit as exc:
    code = exc.code
loaded = sorted(m for m in sys.modules if m.split(".")[0] in heavy)
sys.stderr.write("PROBE " + json.dumps({{"code": code, "loaded": loaded}}) + "\\n")
"""


def _probe(argv: list[str], cwd: Path) -> dict[str, object]:
    script = PROBE.format(heavy=HEAVY, argv=argv)
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=dict(os.environ),
    )
    lines = [line for line in proc.stderr.splitlines() if line.startswith("PROBE ")]
    assert lines, proc.stderr[-2000:]
    result: dict[str, object] = json.loads(lines[-1][len("PROBE ") :])
    return result


def test_importing_the_cli_loads_no_ssh_stack() -> None:
    script = (
        "import sys, cpuaccel.cli.main\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))"
    )
    argv = [sys.executable, "-c", script]
    proc = subprocess.run(argv, capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]"


def test_sync_help_loads_no_ssh_stack(tmp_path: Path) -> None:
    result = _probe(["sync", "--help"], tmp_path)
    assert result == {"code": 0, "loaded": []}


def test_a_local_sync_loads_no_ssh_stack(tmp_path: Path) -> None:
    """A whole sync to a local host: inventory, manifest, node program, verify; no SSH."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("print('hi')\n")
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        "all:\n  hosts:\n    here:\n      ansible_connection: local\n"
        f"      cpuaccel_python: {sys.executable}\n"
    )
    dest = tmp_path / "dest"
    argv = ["sync", "-i", str(inventory), str(project), "--dest", str(dest), "--json"]
    result = _probe(argv, project)
    assert result["code"] == 0, result
    assert (dest / "train.py").read_text() == "print('hi')\n"
    assert result["loaded"] == []


def test_the_openssh_path_loads_no_ssh_stack(tmp_path: Path) -> None:
    """check's and sync's connector to an SSH host (a kept OpenSSH master): choosing it,
    its argv (ssh_config read for Port/ProxyJump), its port and the key it trusts load
    no paramiko. A real command over it: tests/cluster/test_openssh_masters.py."""
    script = (
        "import sys\n"
        "from cpuaccel.connectors.choose import connector_for\n"
        "from cpuaccel.connectors.connect_options import ConnectOptions\n"
        "from cpuaccel.connectors.openssh import port_of\n"
        "from cpuaccel.inventory.host import Host\n"
        "host = Host('n1', {'ansible_host': '10.0.0.1'})\n"
        "conn = connector_for(host, ConnectOptions(keep=True))\n"
        "conn.connect(); conn.wrap('true'); conn.host_key(); port_of(host)\n"
        "print(type(conn).__name__, sorted(m for m in sys.modules"
        f" if m.split('.')[0] in {HEAVY!r}))"
    )
    assert _in_fresh_home(script) == "OpenSSHConnector []"


def test_checks_start_up_over_openssh_loads_no_openssl_nor_shutil(tmp_path: Path) -> None:
    """check at one node is its start-up: its modules, a run id, the kept
    OpenSSH connector and the key known_hosts trusts load neither hashlib (OpenSSL's
    libcrypto, through secrets or hmac) nor shutil (bz2, lzma); nor difflib (only a bad
    key's "did you mean") nor the Slurm partition reader (only for Slurm nodes)."""
    light = ("hashlib", "_hashlib", "hmac", "secrets", "shutil", "bz2", "lzma")
    light += ("difflib", "cpuaccel.slurm.partition", "cpuaccel.slurm.commands")
    known = tmp_path / "known_hosts"
    known.write_text(
        "10.0.0.1 ssh-ed25519 "
        "AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl\n"
    )
    script = (
        "import sys\n"
        "import cpuaccel.cli.check, cpuaccel.cli.main\n"
        "from cpuaccel.connectors.choose import connector_for\n"
        "from cpuaccel.connectors.connect_options import ConnectOptions\n"
        "from cpuaccel.inventory.host import Host\n"
        "from cpuaccel.jobs.plan import new_run_id\n"
        f"host = Host('n1', {{'ansible_host': '10.0.0.1', 'ansible_ssh_common_args':"
        f" '-o UserKnownHostsFile={known}'}})\n"
        "conn = connector_for(host, ConnectOptions(keep=True))\n"
        "conn.connect(); conn.wrap('true'); key = conn.host_key(); new_run_id()\n"
        "print(type(conn).__name__, key.split()[0], sorted(m for m in sys.modules"
        f" if m in {light!r}))"
    )
    assert _in_fresh_home(script) == "OpenSSHConnector ssh-ed25519 []"


def _local_check_json(before: str, after: str) -> str:
    """A script: BEFORE, then `cpuaccel check --json` on localhost in its own process
    (its exit status in ``code``), then AFTER."""
    return (
        before + "from cpuaccel.cli.main import main\n"
        f"sys.argv = ['cpuaccel', 'check', '-i', 'localhost,', '-e',"
        f" 'cpuaccel_python={sys.executable}', '--json']\n"
        "try:\n"
        "    main()\n"
        "except SystemExit as exc:\n"
        "    code = exc.code\n" + after
    )


def test_check_loads_rich_only_for_its_table(tmp_path: Path) -> None:
    """rich (~30 ms) is not on the way to the first probe: `check --json` never loads
    it, and the table's check loads it beside the gathering (cli/check.py)."""
    script = _local_check_json(
        "import sys\n",
        "sys.stderr.write(f'PROBE {code} ' + str(sorted(m for m in sys.modules"
        " if m.split('.')[0] == 'rich')) + '\\n')\n",
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path
    )
    assert "PROBE 0 []" in proc.stderr, proc.stderr[-2000:]
    assert '"problems": []' in proc.stdout


def test_checks_table_loads_no_emoji_table() -> None:
    """rich's emoji codes (a 140 kB module, ~2 ms between the probes' answers and the
    table) stay unloaded: ui's consoles print `:x:` as typed, and the table measures so."""
    script = (
        "import io, sys\n"
        "from cpuaccel import ui\n"
        "from cpuaccel.cli.check import print_report\n"
        "from cpuaccel.executor import HostResult, Status\n"
        "from cpuaccel.inventory.host import Host\n"
        "facts = {'hostname': 'n:smile:1', 'python': {'version': '3.11.2'}}\n"
        "out = ui._console(io.StringIO())\n"
        "print_report([HostResult(Host('n:smile:1'), Status.OK, facts)], [], out)\n"
        "print('n:smile:1' in out.file.getvalue(), 'rich._emoji_codes' in sys.modules)\n"
    )
    argv = [sys.executable, "-c", script]
    assert subprocess.run(argv, capture_output=True, text=True, check=True).stdout == (
        "True False\n"
    )


def test_a_commands_modules_load_without_collections_and_its_exit_walks_none(
    tmp_path: Path,
) -> None:
    """cli/main.py: click and the verb's modules load with the cyclic GC paused (a
    one-node check's start-up set off ~40 collections that found nothing to free) and
    the heap is frozen when the command ends, so the exit's collections skip it; the
    exit itself is untouched: an atexit hook still runs, after the command's output."""
    script = _local_check_json(
        "import atexit, gc, sys\n"
        "starts = []\n"
        "gc.callbacks.append(lambda phase, info: phase == 'start' and starts.append(1))\n"
        "atexit.register(lambda: print('ATEXIT', flush=True))\n",
        "print('PROBE', code, len(starts), gc.get_freeze_count() > 10000, gc.isenabled())\n",
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path
    )
    probe, atexit_line = proc.stdout.splitlines()[-2:]
    word, code, collections, frozen, enabled = probe.split()
    assert (word, code, frozen, enabled) == ("PROBE", "0", "True", "True"), proc.stdout
    assert int(collections) < 15, probe  # 39 before, 7 now (the run's own allocations)
    assert atexit_line == "ATEXIT"


def test_checks_start_up_compiles_no_error_paths_pattern_nor_loads_other_paths_modules(
    tmp_path: Path,
) -> None:
    """The patterns only a failure reads (ssh's refusal and connect words, a refused
    key, a Slurm node's refusal, srun's labels and task exits) are compiled by re on
    first use, not at import; outside a Slurm allocation (no $SLURM_JOB_ID) its reader
    and Slurm's hostlist syntax do not load, nor the project file's slurm: block's
    checks (slurm/batch.py) when it has none, nor the MPI hostfile reader for a .yaml
    inventory, nor at one node the thread pool's concurrent.futures and logging, nor
    run --hang-timeout's progress markers: check at one node is its start-up."""
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        "all:\n  hosts:\n    here:\n      ansible_connection: local\n"
        f"      cpuaccel_python: {sys.executable}\n"
    )
    script = (
        "import re, sys\n"
        "compiled = []\n"
        "real = re._compile\n"
        "re._compile = lambda p, f: compiled.append(getattr(p, 'pattern', p)) or real(p, f)\n"
        "from cpuaccel.api import checking\n"
        "from cpuaccel.connectors import openssh, openssh_session, srun\n"
        "from cpuaccel.cli.main import main\n"
        f"sys.argv = ['cpuaccel', 'check', '-i', {str(inventory)!r}, '--json']\n"
        "try:\n"
        "    main()\n"
        "except SystemExit as exc:\n"
        "    code = exc.code\n"
        "other = ('cpuaccel.inventory.hostfile', 'concurrent.futures', 'logging',\n"
        "         'cpuaccel.node.progress')\n"
        "slurm = sorted(m for m in sys.modules if m.startswith('cpuaccel.slurm.') or m in other)\n"
        "from cpuaccel.node import supervisor  # the run's supervisor: after the probe\n"
        "lazy = [checking._REFUSED, openssh._REFUSED, openssh_session._SSH_WORDS,\n"
        "        openssh_session._CONNECT, srun._LABELLED, supervisor._SRUN_TASK_EXIT]\n"
        "early = [p for p in lazy if getattr(p, 'pattern', p) in compiled]\n"
        "print('PROBE', code, len(compiled) > 20, early, slurm)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    # In a network namespace of its own: the node reports only the jobs of its namespace,
    # so another test's job running here meanwhile is not a leftover this check looks at.
    proc = subprocess.run(
        ["unshare", "--net", "--", sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert "PROBE 0 True [] []" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]


def test_the_allocations_variable_is_read_where_its_reader_is_not_loaded() -> None:
    from cpuaccel.config import inventory_choice
    from cpuaccel.slurm import allocation

    assert inventory_choice.SLURM_JOB_ID == allocation.JOB_ID


def test_a_test_driving_the_click_group_in_its_process_freezes_nothing(tmp_path: Path) -> None:
    """Only the command's own process (cli.main.main) freezes its heap: a test that runs
    the click group in its process keeps every object collectable, as a frozen leftover
    of one test would never be freed."""
    script = (
        "import gc\n"
        "from click.testing import CliRunner\n"
        "from cpuaccel.cli.main import cli\n"
        f"argv = ['check', '-i', 'localhost,', '-e', 'cpuaccel_python={sys.executable}',"
        " '--json']\n"
        "result = CliRunner().invoke(cli, argv)\n"
        "print(result.exit_code, gc.get_freeze_count(), gc.isenabled())\n"
    )
    argv = [sys.executable, "-c", script]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, check=True)
    assert proc.stdout.splitlines()[-1] == "0 0 True", proc.stdout[-2000:]


def _in_fresh_home(script: str) -> str:
    """SCRIPT's stdout, run by a fresh interpreter whose HOME is a new short folder (the
    kept connector's sockets live below HOME: a socket's path has a length limit)."""
    home = Path(tempfile.mkdtemp(prefix="cpxh-", dir="/tmp"))
    try:
        env = dict(os.environ, HOME=str(home))
        argv = [sys.executable, "-c", script]
        proc = subprocess.run(argv, capture_output=True, text=True, check=True, env=env)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    return proc.stdout.strip()
