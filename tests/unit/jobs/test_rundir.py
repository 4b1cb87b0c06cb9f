"""The run folder's rendered files, without nodes: MPI's ssh_config and known_hosts per
node, ssh.sh's argument handling, every script (hostfile, env.sh, rank.sh, ssh.sh,
launch.sh) under ``sh -n`` with hostile values, rank.sh's setvars check and the ranks'
CPU binding, and the folder's modes and secrets on the controller and the nodes."""

from __future__ import annotations

import getpass
import os
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from cpuaccel.config.effective import resolve
from cpuaccel.connectors.connect_options import ConnectOptions
from cpuaccel.errors import HostError, InventoryError, UsageError
from cpuaccel.inventory.host import Host
from cpuaccel.inventory.inventory import Inventory
from cpuaccel.jobs.plan import RunPlan, Script, build_plan
from cpuaccel.jobs.rundir import RunDir, render_job_files, render_ssh_files
from cpuaccel.node import jobctl as jobs
from tests.unit.jobs.plans import HOSTILE, RUN_ID, plan_of

SCRIPTS = ("hostfile", "env.sh", "rank.sh", "ssh.sh", "launch.sh")


def mixed(workdir: str = "/srv/work", **vars: Any) -> list[Host]:
    """A head reached as root on 22, a worker as another user on 2222 with its own key."""
    common = {"cpuaccel_python": "/opt/venv/bin/python", "cpuaccel_workdir": workdir, **vars}
    head = Host(
        "n1", {**common, "ansible_host": "10.0.0.1", "ansible_port": 22, "ansible_user": "root"}
    )
    worker = Host(
        "n2",
        {
            **common,
            "ansible_host": "10.0.0.2",
            "ansible_port": 2222,
            "ansible_user": "alice",
            "ansible_ssh_private_key_file": "~/keys/my key",
        },
    )
    return [head, worker]


def ssh_g(config: Path, name: str) -> dict[str, str]:
    """What ssh makes of ``config`` for ``name`` (``ssh -G``: parsed, not connected)."""
    out = subprocess.run(
        ["ssh", "-G", "-F", str(config), name], capture_output=True, text=True, check=True
    ).stdout
    return dict(line.split(" ", 1) for line in out.splitlines() if " " in line)


needs_ssh = pytest.mark.skipif(shutil.which("ssh") is None, reason="no OpenSSH client")


# ---------------------------------------------------------------- ssh_config, known_hosts


@needs_ssh
def test_ssh_config_reaches_each_node_as_the_inventory_says(tmp_path: Path) -> None:
    plan = plan_of(mixed())
    files = render_ssh_files(plan, ConnectOptions())
    config = tmp_path / "ssh_config"
    config.write_text(files["ssh_config"][1])
    head, worker = ssh_g(config, "n1"), ssh_g(config, "n2")
    assert (head["hostname"], head["port"], head["user"]) == ("10.0.0.1", "22", "root")
    assert (worker["hostname"], worker["port"], worker["user"]) == ("10.0.0.2", "2222", "alice")
    # The key path as the inventory wrote it, space kept, ~ left for the head's ssh.
    assert worker["identityfile"] == "~/keys/my key"
    for seen in (head, worker):
        assert seen["stricthostkeychecking"] == "true" and seen["batchmode"] == "yes"
        assert seen["serveraliveinterval"] == "5" and seen["serveralivecountmax"] == "3"
        assert seen["userknownhostsfile"] == f"{plan.run_dir}/known_hosts"
        assert seen["globalknownhostsfile"] == "/dev/null"
    # A name the inventory does not hold is checked against the same keys.
    other = ssh_g(config, "elsewhere")
    assert other["stricthostkeychecking"] == "true"
    assert other["userknownhostsfile"] == f"{plan.run_dir}/known_hosts"
    # ssh.sh uses that file and nothing of the head's own settings.
    assert f"ssh -F {plan.run_dir}/ssh_config" in files["ssh.sh"][1]


@needs_ssh
def test_ssh_config_keeps_a_host_whose_checking_is_off_off(tmp_path: Path) -> None:
    chosen = mixed()
    chosen[1] = Host("n2", {**chosen[1].vars, "ansible_host_key_checking": False})
    config = tmp_path / "ssh_config"
    config.write_text(render_ssh_files(plan_of(chosen), ConnectOptions())["ssh_config"][1])
    assert ssh_g(config, "n2")["stricthostkeychecking"] == "false"
    assert ssh_g(config, "n2")["userknownhostsfile"] == "/dev/null"
    assert ssh_g(config, "n1")["stricthostkeychecking"] == "true"


def test_percent_signs_are_doubled_for_ssh_tokens() -> None:
    chosen = mixed(ansible_ssh_private_key_file="/keys/100%key")
    text = render_ssh_files(plan_of(chosen), ConnectOptions())["ssh_config"][1]
    assert 'IdentityFile "/keys/100%%key"' in text


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("ansible_ssh_private_key_file", '/keys/a"b'),
        ("ansible_ssh_private_key_file", "/keys/a\nHost *\n ProxyCommand touch /tmp/p"),
        ("ansible_ssh_private_key_file", "/keys/${HOME}/k"),
        ("ansible_ssh_private_key_file", "/keys/a\\b"),
        ("ansible_user", 'ali"ce'),
    ],
)
def test_values_ssh_config_cannot_carry_are_refused_by_name(var: str, value: str) -> None:
    chosen = mixed()
    chosen[1] = Host("n2", {**chosen[1].vars, var: value})
    with pytest.raises(HostError) as caught:
        render_ssh_files(plan_of(chosen), ConnectOptions())
    assert caught.value.host == "n2" and var in str(caught.value)


def test_a_run_folder_ssh_config_cannot_carry_is_refused() -> None:
    with pytest.raises(HostError, match="cannot carry"):
        render_ssh_files(plan_of(mixed(workdir='/srv/"w"')), ConnectOptions())


@needs_ssh
def test_known_hosts_holds_the_verified_keys_under_name_and_address(tmp_path: Path) -> None:
    keys = {}
    for name in ("n1", "n2"):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / name)],
            check=True,
        )
        keys[name] = " ".join((tmp_path / f"{name}.pub").read_text().split()[:2])
    files = render_ssh_files(plan_of(mixed()), ConnectOptions(), keys)
    known = tmp_path / "known_hosts"
    known.write_text(files["known_hosts"][1])

    def found(lookup: str) -> bool:
        argv = ["ssh-keygen", "-F", lookup, "-f", str(known)]
        return subprocess.run(argv, capture_output=True).returncode == 0

    # Port 22: plain names; another port: ssh looks up [host]:port.
    assert found("n1") and found("10.0.0.1")
    assert found("[n2]:2222") and found("[10.0.0.2]:2222")
    assert not found("n2") and not found("10.0.0.2")
    assert keys["n2"] in files["known_hosts"][1]
    # A dry run has no keys: an empty file, never another source of trust.
    assert render_ssh_files(plan_of(mixed()), ConnectOptions())["known_hosts"][1] == ""


# ---------------------------------------------------------------- ssh.sh's arguments


def fake_ssh(tmp_path: Path) -> dict[str, str]:
    """An environment whose ``ssh`` prints its arguments, one a line."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    (bin_dir / "ssh").chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


@pytest.mark.parametrize(
    ("args", "host_and_command", "flags"),
    [
        pytest.param(
            ["-x", "n2", "proxy", "--a", "b c"], ["n2", "proxy", "--a", "b c"], ["-x"], id="hydra"
        ),
        pytest.param(["n2", "orted", "-mca", "x"], ["n2", "orted", "-mca", "x"], [], id="openmpi"),
        pytest.param(["-xT", "--", "n2", "true"], ["n2", "true"], ["-xT"], id="dashdash"),
    ],
)
def test_ssh_sh_passes_flags_then_the_host_after_dashdash(
    tmp_path: Path, args: list[str], host_and_command: list[str], flags: list[str]
) -> None:
    plan = plan_of(mixed())
    script = tmp_path / "ssh.sh"
    script.write_text(render_ssh_files(plan, ConnectOptions())["ssh.sh"][1])
    done = subprocess.run(
        ["/bin/sh", str(script), *args], capture_output=True, text=True, env=fake_ssh(tmp_path)
    )
    assert done.returncode == 0, done.stderr
    expected = ["-F", f"{plan.run_dir}/ssh_config", *flags, "--", *host_and_command]
    assert done.stdout.splitlines() == expected


@pytest.mark.parametrize(
    "args",
    [["-o", "ProxyCommand=touch M", "n2"], ["-x$(touch M)", "n2"], ["-p", "22", "n2"], []],
)
def test_ssh_sh_refuses_options_that_take_values(tmp_path: Path, args: list[str]) -> None:
    script = tmp_path / "ssh.sh"
    script.write_text(render_ssh_files(plan_of(mixed()), ConnectOptions())["ssh.sh"][1])
    done = subprocess.run(
        ["/bin/sh", str(script), *args],
        capture_output=True,
        text=True,
        env=fake_ssh(tmp_path),
        cwd=tmp_path,
    )
    assert done.returncode == 255 and done.stdout == ""
    assert "cpuaccel ssh.sh:" in done.stderr
    assert not (tmp_path / "M").exists()


# ---------------------------------------------------------------- every script, hostile


def hostile_plan(tmp_path: Path) -> RunPlan:
    workdir = str(tmp_path / "w $(touch M) 'q' `touch M`")
    chosen = [
        Host(
            name,
            {
                "cpuaccel_python": f"{tmp_path}/py $(touch M)/bin/python",
                "cpuaccel_workdir": workdir,
                "cpuaccel_setvars": f"{tmp_path}/no such $(touch M)/setvars.sh",
                "ansible_host": f"10.0.0.{i}",
                "ansible_port": 22,
                "ansible_user": "u-1",
                "ansible_ssh_private_key_file": f"~/{HOSTILE}",
            },
        )
        for i, name in enumerate(("n1", "node-2.example"), start=1)
    ]
    env = {"V1": HOSTILE, "V2": "line1\nline2 $(touch M)", "V3": "", "V4": "\"'\\"}
    return plan_of(chosen, env=env)


@pytest.mark.parametrize("shell", ["/bin/sh", "dash", "bash"])
def test_every_rendered_script_passes_sh_n_with_hostile_values(tmp_path: Path, shell: str) -> None:
    if shutil.which(shell) is None:
        pytest.skip(f"no {shell}")
    files = render_job_files(hostile_plan(tmp_path), ConnectOptions())
    for name in SCRIPTS:
        syntax = subprocess.run([shell, "-n", "-c", files[name][1]], capture_output=True, text=True)
        assert syntax.returncode == 0, (name, syntax.stderr)
    assert not (tmp_path / "M").exists()


@pytest.mark.parametrize(
    ("name", "address"),
    [("fe80::1%x\necho aWQK|base64 -d|sh #", None), ("n1", "fe80::1%eth0;id"), ("a b", None)],
)
def test_a_host_the_inventory_would_refuse_is_written_into_no_file(
    name: str, address: str | None
) -> None:
    """Hosts made without the inventory's check (as any other source could make them):
    the hostfile holds names unquoted, so rendering refuses them, in one line, also
    where no ssh file is rendered (a dry run, the Slurm launcher)."""
    head = Host(name, {"ansible_host": address} if address else {})
    plan = plan_of([head, Host("n2", {})])
    for ssh_files in (False, True):
        with pytest.raises(UsageError) as caught:
            render_job_files(plan, ConnectOptions(), ssh_files=ssh_files)
        assert repr(address or name) in caught.value.message
        assert "\n" not in caught.value.message and caught.value.hint


def test_launch_sh_names_no_host_outside_its_quoted_words() -> None:
    plan = plan_of(mixed())
    text = render_job_files(plan, ConnectOptions(), ssh_files=False)["launch.sh"][1]
    assert not [line for line in text.splitlines() if line.startswith("#") and "n1" in line]


@pytest.mark.parametrize("shell", ["/bin/sh", "dash"])
def test_rank_sh_says_when_setvars_is_missing(tmp_path: Path, shell: str) -> None:
    if shutil.which(shell) is None:
        pytest.skip(f"no {shell}")
    plan = hostile_plan(tmp_path)
    rank = tmp_path / "rank.sh"
    rank.write_text(render_job_files(plan, ConnectOptions())["rank.sh"][1])
    done = subprocess.run([shell, str(rank)], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 127
    assert f"cpuaccel: {plan.setvars} does not exist on " in done.stderr
    assert not (tmp_path / "M").exists()


# ---------------------------------------------------------------- the run folder, secrets


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_controllers_run_folder_is_private(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        plan = plan_of(mixed(), cpuaccel_secret_env={"TOKEN": "t0k"})
        files = render_job_files(plan, ConnectOptions())
        run_dir = RunDir.create(tmp_path / "runs", plan, files)
        run_dir.record(started=1)
        log = run_dir.log("rank-0.log")
    finally:
        os.umask(old)
    assert mode_of(run_dir.path) == 0o700
    assert mode_of(log) == 0o600 and mode_of(run_dir.path / "run.json") == 0o600
    assert mode_of(run_dir.path / "rank.sh") == 0o700
    assert mode_of(run_dir.path / "env.sh") == mode_of(run_dir.path / "ssh_config") == 0o600
    assert not (run_dir.path / "secret.env").exists()


def test_a_local_runs_secret_file_is_removed_at_the_end(tmp_path: Path) -> None:
    run_dir = RunDir(tmp_path)
    (tmp_path / "secret.env").write_text("export T=1\n")
    run_dir.forget_secrets()
    run_dir.forget_secrets()  # nothing left: no error
    assert not (tmp_path / "secret.env").exists()


def test_node_run_folder_is_private_and_the_sweep_removes_secrets(tmp_path: Path) -> None:
    folder = tmp_path / "runs" / RUN_ID
    old = os.umask(0o022)
    try:
        jobs.write(str(folder), {"secret.env": (0o600, "export T=1\n"), "env.sh": (0o600, "")})
    finally:
        os.umask(old)
    assert mode_of(folder) == 0o700 and mode_of(folder / "secret.env") == 0o600
    ended = jobs.end(RUN_ID, 0.1, str(folder))
    assert ended["forgot"] is True and not (folder / "secret.env").exists()
    assert (folder / "env.sh").exists()


def test_a_secret_set_twice_for_a_host_is_not_shown(tmp_path: Path) -> None:
    inventory = tmp_path / "inv.yaml"
    inventory.write_text(
        "all:\n  children:\n"
        "    a:\n      hosts:\n        n1: {cpuaccel_secret_env: {T: first-s3cret}}\n"
        "    b:\n      hosts:\n        n1: {cpuaccel_secret_env: {T: second-s3cret}}\n"
    )
    with pytest.raises(InventoryError) as caught:
        Inventory.load(str(inventory))
    message = str(caught.value)
    assert "cpuaccel_secret_env" in message and "inv.yaml" in message
    assert "s3cret" not in message + str(caught.value.hint)


@needs_ssh
def test_hostile_paths_reach_ssh_config_whole(tmp_path: Path) -> None:
    files = render_job_files(hostile_plan(tmp_path), ConnectOptions())
    config = tmp_path / "ssh_config"
    config.write_text(files["ssh_config"][1])
    seen = ssh_g(config, "node-2.example")
    # ssh -G shows the words as parsed, before ~ and %-token expansion (%% is one %).
    assert seen["identityfile"] == "~/" + HOSTILE.replace("%", "%%")
    assert seen["userknownhostsfile"].endswith(f"/runs/{RUN_ID}/known_hosts")
    assert "$(touch M)" in seen["userknownhostsfile"]


def test_a_node_without_a_user_is_reached_as_the_controller_reaches_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text("Host 10.0.0.3\n    User carol\n")
    chosen = mixed()
    chosen[1] = Host("n2", {k: v for k, v in chosen[1].vars.items() if k != "ansible_user"})
    chosen.append(Host("n3", {**chosen[1].vars, "ansible_host": "10.0.0.3"}))
    config = render_ssh_files(plan_of(chosen), ConnectOptions())["ssh_config"][1]
    blocks = {block.split("\n")[0]: block for block in config.split("Host ")[1:]}
    # Fabric's order: the inventory, the controller's ssh_config, the controller's user.
    assert f'User "{getpass.getuser()}"' in blocks["n2"]
    assert 'User "carol"' in blocks["n3"] and 'User "root"' in blocks["n1"]


def _rank_binding(tmp_path: Path, launcher: str, cpus: str) -> str:
    """OMP_PROC_BIND as rank.sh leaves it for a rank with one thread whose mask is ``cpus``."""
    tmp_path.mkdir()
    fake_python = tmp_path / "python"
    fake_python.write_text('#!/bin/sh\nprintf "%s" "${OMP_PROC_BIND-unset}"\n')
    fake_python.chmod(0o755)
    host = Host("n1", {"cpuaccel_python": str(fake_python), "cpuaccel_workdir": str(tmp_path)})
    inventory = Inventory(None, {"n1": host}, {})
    settings = resolve({"ppn": 2, "launcher": launcher}, None, inventory, [host])
    flavour = "slurm" if launcher == "slurm" else "impi"
    facts = {
        "n1": {
            "cpu": {"sockets": 1, "physical_cores": 2},
            "mpi": {"launchers": [{"flavour": flavour, "path": "/usr/bin/mpirun"}]},
            "packages": {},
            "setvars": {"path": None},
        }
    }
    plan = build_plan(settings, Script("train.py", ()), facts, RUN_ID)
    files = render_job_files(plan, ConnectOptions())
    Path(plan.run_dir).mkdir(parents=True, exist_ok=True)
    Path(plan.project_dir).mkdir(parents=True, exist_ok=True)
    for name in ("env.sh", "rank.sh"):
        (Path(plan.run_dir) / name).write_text(files[name][1])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "KMP_"))}
    done = subprocess.run(
        ["taskset", "-c", cpus, "sh", f"{plan.run_dir}/rank.sh"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return done.stdout


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two CPUs to tell masks apart")
def test_ranks_bind_threads_only_inside_a_mask_of_their_own(tmp_path: Path) -> None:
    # MPI's launchers pin each rank (I_MPI_PIN, --bind-to): "close" stays in its block.
    assert _rank_binding(tmp_path / "impi", "impi", "0,1") == "close"
    # srun under TaskPlugin=task/none hands every rank the whole node: "close" would put
    # them all on its first core, so rank.sh leaves binding off there...
    assert _rank_binding(tmp_path / "wide", "slurm", "0,1") == "unset"
    # ...and on where Slurm gave the task its own core (task/affinity, task/cgroup).
    assert _rank_binding(tmp_path / "own", "slurm", "1") == "close"
