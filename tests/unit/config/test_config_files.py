"""cpuaccel.yaml, Accelerate's default_config.yaml and MPI hostfiles, through the CLI as a
user meets them: `config import`, `config show`, `run --dry-run` (none contacts a host)."""

from __future__ import annotations

import json
import shlex
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from cpuaccel.cli.main import cli
from cpuaccel.errors import EXIT_USAGE
from testsupport.command import cpuaccel, output_section

DATA = Path(__file__).resolve().parent / "data"
SEED_SINGLE = DATA / "default_config.single-cpu.yaml"
SEED_MULTI = DATA / "default_config.multi-cpu.yaml"
# The seed's main_process_ip first, then documentation addresses: never contacted.
HOSTFILE = "36.112.23.24 # node0 ip\n192.0.2.11\n192.0.2.12:4\n192.0.2.13 slots=4\n"


def section(text: str, title: str) -> list[str]:
    """The non-blank lines of a `## title` section."""
    return [line for line in output_section(text, title) if line.strip()]


def command(out: str) -> list[str]:
    return shlex.split(section(out, "command")[0])


def env_of(out: str) -> dict[str, str]:
    pairs = (line.removeprefix("export ").split("=", 1) for line in section(out, "env.sh"))
    return {k: v for k, v in (p for p in pairs if len(p) == 2)}


@pytest.fixture
def proj(tmp_path: Path) -> Path:
    folder = tmp_path / "proj"
    folder.mkdir()
    (folder / "train.py").write_text("print('hello')\n")
    return folder


def seed_multi(proj: Path) -> Path:
    """The seed's multi-CPU config verbatim, with a real hostfile beside it (the seed's
    names /home/user/hostfile, which does not exist here)."""
    shutil.copy(SEED_MULTI, proj / "default_config.yaml")
    (proj / "hostfile").write_text(HOSTFILE)
    return proj / "default_config.yaml"


# ---------------------------------------------------------------- the seed's files


def test_seed_files_are_verbatim_copies() -> None:
    seed = Path("/work/shared/seed")
    if not seed.is_dir():
        pytest.skip("the seed folder is not on this machine")
    for name in ("default_config.single-cpu.yaml", "default_config.multi-cpu.yaml", "hostfile"):
        assert (DATA / name).read_bytes() == (seed / name).read_bytes()


def test_seed_single_cpu_config_imports_to_one_local_process(proj: Path) -> None:
    shown = cpuaccel("config", "import", str(SEED_SINGLE), "--dry-run", "--json", cwd=proj)
    assert shown.returncode == 0, shown.stderr
    mapping = json.loads(shown.stdout)["mapping"]
    assert mapping["nodes"]["value"] == 1 and mapping["nodes"]["field"] == "num_machines"
    assert mapping["ppn"]["value"] == 1
    assert mapping["mixed_precision"] == {"value": "bf16", "field": "mixed_precision", "line": 6}
    assert mapping["hosts"]["value"] == ["localhost"]
    assert json.loads(shown.stdout)["warnings"] == []  # every field is mapped or neutral
    assert not (proj / "cpuaccel.yaml").exists()  # --dry-run writes nothing

    run = cpuaccel("run", "--config", str(SEED_SINGLE), "--dry-run", "train.py", cwd=proj)
    assert run.returncode == 0, run.stderr
    assert section(run.stdout, "hostfile") == ["localhost"]
    argv = command(run.stdout)
    assert argv[argv.index("-n") + 1] == "1" and argv[argv.index("-ppn") + 1] == "1"
    assert env_of(run.stdout)["ACCELERATE_MIXED_PRECISION"] == "bf16"


def test_seed_multi_cpu_config_gives_the_seeds_16_process_job(
    proj: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = seed_multi(proj)
    shown = cpuaccel("config", "import", str(config), "--dry-run", "--json", cwd=proj)
    assert shown.returncode == 0, shown.stderr
    mapping = json.loads(shown.stdout)["mapping"]
    assert (mapping["nodes"]["value"], mapping["ppn"]["value"]) == (4, 4)
    assert mapping["head"] == {"value": "36.112.23.24", "field": "main_process_ip", "line": 5}
    assert mapping["master_port"]["value"] == 29500
    assert mapping["mixed_precision"]["value"] == "bf16"
    assert mapping["ccl_workers"] == {
        "value": 1, "field": "mpirun_config.mpirun_ccl", "line": 10,
    }  # fmt: skip
    assert mapping["hosts"]["value"] == ["36.112.23.24", "192.0.2.11", "192.0.2.12", "192.0.2.13"]
    # The missing /home/user/hostfile is named, and the one used instead.
    assert "/home/user/hostfile not found; using" in shown.stderr

    # In-process, with every way out of this process made to fail: no host is contacted.
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"contacted something: {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    monkeypatch.chdir(proj)
    monkeypatch.delenv("CPUACCEL_INVENTORY", raising=False)
    monkeypatch.setenv("NO_COLOR", "1")
    result = CliRunner().invoke(
        cli, ["run", "--config", "default_config.yaml", "--dry-run", "train.py"]
    )
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert section(out, "hostfile") == ["36.112.23.24", "192.0.2.11", "192.0.2.12", "192.0.2.13"]
    argv = command(out)
    # The seed's line: mpirun -f hostfile -n 16 -ppn 4
    assert argv[0].endswith("mpirun") and argv[argv.index("-n") + 1] == "16"
    assert argv[argv.index("-ppn") + 1] == "4"
    env = env_of(out)
    assert env["MASTER_ADDR"] == "36.112.23.24" and env["MASTER_PORT"] == "29500"
    assert env["ACCELERATE_MIXED_PRECISION"] == "bf16"
    assert "SSH user, key and address come from ~/.ssh/config" in result.stderr


def test_config_import_writes_files_that_run_uses_and_never_overwrites(proj: Path) -> None:
    config = seed_multi(proj)
    first = cpuaccel("config", "import", str(config), cwd=proj)
    assert first.returncode == 0, first.stderr
    assert "wrote" in first.stdout and (proj / "cpuaccel.yaml").is_file()
    project_before = (proj / "cpuaccel.yaml").read_text()
    again = cpuaccel("config", "import", str(config), cwd=proj)
    assert (
        again.returncode == EXIT_USAGE
        and "already exist" in again.stderr
        and "--force" in again.stderr
    )
    assert (proj / "cpuaccel.yaml").read_text() == project_before
    assert cpuaccel("config", "import", str(config), "--force", cwd=proj).returncode == 0
    # ./cpuaccel.yaml is read without --config.
    run = cpuaccel("run", "--dry-run", "train.py", cwd=proj)
    assert run.returncode == 0, run.stderr
    argv = command(run.stdout)
    assert argv[argv.index("-n") + 1] == "16"
    assert section(run.stdout, "hostfile")[0] == "36.112.23.24"
    shown = json.loads(cpuaccel("config", "show", "--json", cwd=proj).stdout)
    assert shown["ppn"] == {"value": 4, "source": "project file", "where": "cpuaccel.yaml:6"}


def test_seed_placeholder_hostfile_is_an_error_at_its_line(proj: Path) -> None:
    proc = cpuaccel("run", "--config", str(SEED_MULTI), "--dry-run", "train.py", cwd=proj)
    assert proc.returncode == EXIT_USAGE
    assert "Traceback" not in proc.stderr
    assert f"{DATA / 'hostfile'}:1: 'xxx.xxx.xxx.xxx' is a placeholder" in proc.stderr
    assert "fix:" in proc.stderr


def test_fields_cpuaccel_cannot_honour_are_named_in_warnings(proj: Path) -> None:
    text = SEED_SINGLE.read_text().replace("machine_rank: 0", "machine_rank: 1")
    text += "ipex: true\ngpu_ids: '0,1'\nmegatron_lm_config: {x: 1}\n"
    (proj / "acc.yaml").write_text(text)
    proc = cpuaccel("config", "import", "acc.yaml", "--dry-run", cwd=proj)
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning:")]
    for field in ("machine_rank", "gpu_ids", "megatron_lm_config"):
        assert any(f": {field}: " in line and "not honoured" in line for line in warnings), field
    # IPEX is what the runtime does anyway: said so, not "not honoured".
    assert any(": ipex: True needs no setting" in line for line in warnings), warnings
    assert len(warnings) == 4


@pytest.mark.parametrize(
    ("added", "line"),
    [
        ("ipex_config:\n  ipex: true\n",
         "ipex_config: {'ipex': True} needs no setting: the runtime applies IPEX on every rank "
         "where intel_extension_for_pytorch is installed and matches torch"),
        ("ipex: true\n", "ipex: True needs no setting: the runtime applies IPEX"),
        ("ipex_config:\n  ipex: false\n", None),
    ],
)  # fmt: skip
def test_ipex_asked_for_is_said_to_be_the_runtimes_own(
    proj: Path, added: str, line: str | None
) -> None:
    (proj / "acc.yaml").write_text(SEED_SINGLE.read_text() + added)
    proc = cpuaccel("config", "import", "acc.yaml", "--dry-run", cwd=proj)
    assert proc.returncode == 0, proc.stderr
    warnings = [w for w in proc.stderr.splitlines() if "ipex" in w]
    if line is None:
        assert warnings == [], warnings
    else:
        assert len(warnings) == 1 and line in warnings[0], warnings
        assert "not honoured" not in warnings[0] and "no such setting" not in warnings[0]


# ---------------------------------------------------------------- bad configs


ACC_MULTI = (
    "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_CPU\nmixed_precision: bf16\n"
    "mpirun_config:\n  mpirun_ccl: '1'\n  mpirun_hostfile: hostfile\nnum_machines: {m}\n"
    "num_processes: {p}\nuse_cpu: true\n"
)


@pytest.mark.parametrize(
    ("name", "text", "hostfile", "message"),
    [
        ("cpuaccel.yaml", "nodes: 2\nppm: 4\n", None,
         "cpuaccel.yaml:2: unknown key 'ppm' in the project file"),
        ("cpuaccel.yaml", "ppn: zero\n", None, "cpuaccel.yaml:1: ppn must be a whole number"),
        ("cpuaccel.yaml", "launcher: pbs\n", None, "cpuaccel.yaml:1: launcher is 'pbs'"),
        ("cpuaccel.yaml", "env: [A]\n", None, "cpuaccel.yaml:1: env must be a mapping"),
        ("cpuaccel.yaml", "nodes: 1\nenv:\n  A: 1\n  CPUACCEL_GRAD_SYNC: nccl\n", None,
         "cpuaccel.yaml:4: env CPUACCEL_GRAD_SYNC: 'nccl' is not a choice (how gradients"),
        ("cpuaccel.yaml", "ppn: 2\nppn: 3\n", None, "cpuaccel.yaml:2: duplicate key 'ppn'"),
        ("cpuaccel.yaml", "ppn: [2\n", None, "cpuaccel.yaml:2: YAML syntax error"),
        ("cpuaccel.yaml", "max_restarts: -1\n", None,
         "cpuaccel.yaml:1: max_restarts must be 0 to 1000, got -1"),
        ("cpuaccel.yaml", "max_restarts: many\n", None,
         "cpuaccel.yaml:1: max_restarts must be a whole number"),
        ("cpuaccel.yaml", "restart_delay: soon\n", None,
         "cpuaccel.yaml:1: restart_delay must be a number of seconds, got 'soon'"),
        ("cpuaccel.yaml", "restart_delay: .nan\n", None,
         "cpuaccel.yaml:1: restart_delay must be 0 to 3600 seconds"),
        ("cpuaccel.yaml", "nodes: 3\n", "a\nb\n", "cpuaccel.yaml:1: nodes: 3 nodes, but 2 host"),
        ("acc.yaml", ACC_MULTI.format(m=4, p=10), "a\nb\nc\nd\n",
         "acc.yaml:8: num_processes: 10 processes cannot be split evenly over num_machines 4"),
        ("acc.yaml", ACC_MULTI.format(m=4, p=16), "a\nb\n",
         "acc.yaml:7: num_machines is 4, but mpirun_config.mpirun_hostfile"),
        ("acc.yaml", ACC_MULTI.format(m=2, p=4), None,
         "acc.yaml:6: mpirun_config.mpirun_hostfile: hostfile hostfile not found"),
        ("acc.yaml", ACC_MULTI.format(m=2, p=4), "a\nb c\n", "hostfile:2: not a hostfile line"),
        ("acc.yaml", ACC_MULTI.format(m=2, p=4).replace("MULTI_CPU", "MULTI_GPU"), "a\nb\n",
         "acc.yaml:2: distributed_type: 'MULTI_GPU' is not CPU training"),
        ("acc.yaml", ACC_MULTI.format(m=2, p=4).replace("bf16", "fp16"), "a\nb\n",
         "acc.yaml:3: mixed_precision: 'fp16' is not supported on CPUs"),
        ("acc.yaml", SEED_SINGLE.read_text().replace("num_machines: 1", "num_machines: 2"), None,
         "acc.yaml:7: num_machines: 2 machines, but distributed_type 'NO' is one machine"),
        # master_port's range, the one of its kind, as each file names it
        ("cpuaccel.yaml", "master_port: 65536\n", None,
         "cpuaccel.yaml:1: master_port must be 1 to 65535, got 65536"),
        ("acc.yaml", ACC_MULTI.format(m=2, p=4) + "main_process_port: 65536\n", "a\nb\n",
         "acc.yaml:10: main_process_port: 65536 is not a port"),
    ],
)  # fmt: skip
def test_bad_configs_are_one_error_naming_file_line_and_field(
    proj: Path, name: str, text: str, hostfile: str | None, message: str
) -> None:
    (proj / name).write_text(text)
    if hostfile is not None:
        (proj / "hostfile").write_text(hostfile)
    if name == "cpuaccel.yaml" and hostfile is not None:
        (proj / "cpuaccel.yaml").write_text("inventory: hostfile\n" + text)
        message = message.replace("cpuaccel.yaml:1", "cpuaccel.yaml:2")
    proc = cpuaccel("run", "--config", name, "--dry-run", "train.py", cwd=proj)
    assert proc.returncode == EXIT_USAGE, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and message in errors[0], proc.stderr
    assert "fix:" in proc.stderr
    assert proc.stdout == ""


def test_unknown_key_suggests_the_close_one(proj: Path) -> None:
    (proj / "cpuaccel.yaml").write_text("ppm: 4\n")
    proc = cpuaccel("sync", "--check", cwd=proj)
    assert proc.returncode == EXIT_USAGE
    assert "did you mean 'ppn'?" in proc.stderr


# ---------------------------------------------------------------- hostfile as inventory


def test_mpi_hostfile_stands_in_for_an_inventory(proj: Path) -> None:
    (proj / "hosts.txt").write_text(
        "# the cluster\nnode0:2   # head\n\nnode1 slots=2 max_slots=4\nnode2\n"
    )
    proc = cpuaccel("run", "-i", "hosts.txt", "--dry-run", "train.py", cwd=proj)
    assert proc.returncode == 0, proc.stderr
    assert section(proc.stdout, "hostfile") == ["node0", "node1", "node2"]
    argv = command(proc.stdout)
    # ppn from the head's slots (an inventory-level value).
    assert argv[argv.index("-ppn") + 1] == "2" and argv[argv.index("-n") + 1] == "6"
    assert "hosts.txt is a plain MPI hostfile" in proc.stderr
    assert "~/.ssh/config" in proc.stderr
    shown = json.loads(cpuaccel("config", "show", "-i", "hosts.txt", "--json", cwd=proj).stdout)
    assert shown["ppn"] == {
        "value": 2, "source": "inventory", "where": "hosts.txt:2 (cpuaccel_slots)",
    }  # fmt: skip


# ---------------------------------------------------------------- precedence


def test_precedence_flag_over_project_over_inventory_over_default(proj: Path) -> None:
    (proj / "inventory.yaml").write_text(
        "all:\n  vars:\n    cpuaccel_ppn: 3\n    cpuaccel_launcher: mpich\n"
        "    cpuaccel_env: {A: inv, B: inv}\n  hosts:\n    n1: {ansible_host: 192.0.2.1}\n"
        "    n2: {ansible_host: 192.0.2.2}\n"
    )

    def show(*flags: str) -> dict[str, Any]:
        proc = cpuaccel("config", "show", "--json", *flags, cwd=proj)
        assert proc.returncode == 0, proc.stderr
        return dict(json.loads(proc.stdout))

    def run(*flags: str) -> list[str]:
        proc = cpuaccel("run", "--dry-run", *flags, "train.py", cwd=proj)
        assert proc.returncode == 0, proc.stderr
        return command(proc.stdout)

    # Inventory over default.
    s = show()
    assert s["ppn"] == {
        "value": 3,
        "source": "inventory",
        "where": "inventory.yaml:3 (cpuaccel_ppn)",
    }
    assert s["launcher"]["value"] == "mpich" and s["launcher"]["source"] == "inventory"
    assert s["master_port"] == {"value": 29500, "source": "default", "where": None}
    assert s["mixed_precision"]["source"] == "default"
    argv = run()
    assert argv[argv.index("-ppn") + 1] == "3" and "-launcher-exec" in argv  # MPICH's shape
    # Project file over inventory.
    (proj / "cpuaccel.yaml").write_text(
        "ppn: 2\nlauncher: openmpi\nmaster_port: 29600\nenv: {B: proj, C: proj}\nnodes: 1\n"
    )
    s = show()
    assert s["ppn"] == {"value": 2, "source": "project file", "where": "cpuaccel.yaml:1"}
    assert s["launcher"] == {
        "value": "openmpi",
        "source": "project file",
        "where": "cpuaccel.yaml:2",
    }
    assert s["master_port"]["value"] == 29600
    assert s["env"]["value"] == {"A": "inv", "B": "proj", "C": "proj"}
    assert s["hosts"]["value"] == ["n1"]
    argv = run()
    assert "--hostfile" in argv and "ppr:2:node:PE=<cores per rank>" in argv  # Open MPI
    # Flags over the project file.
    s = show("--ppn", "5", "--launcher", "impi", "--master-port", "29700", "--nodes", "2")
    assert s["ppn"] == {"value": 5, "source": "flag", "where": "--ppn"}
    assert s["launcher"]["source"] == "flag" and s["master_port"]["value"] == 29700
    assert s["hosts"]["value"] == ["n1", "n2"]
    argv = run("--ppn", "5", "--launcher", "impi", "--nodes", "2")
    assert argv[argv.index("-ppn") + 1] == "5" and argv[argv.index("-n") + 1] == "10"
    proc = cpuaccel(
        "run", "--dry-run", "--env", "C=flag", "--master-port", "29700", "train.py", cwd=proj
    )
    env = env_of(proc.stdout)
    assert (env["A"], env["B"], env["C"], env["MASTER_PORT"]) == ("inv", "proj", "flag", "29700")
    # -e is a flag too, over the project file.
    (proj / "cpuaccel.yaml").write_text("ccl_workers: 2\n")
    assert show()["ccl_workers"]["source"] == "project file"
    s = show("-e", "cpuaccel_ccl_workers=4")
    assert s["ccl_workers"] == {"value": 4, "source": "flag", "where": "-e cpuaccel_ccl_workers"}


def test_project_file_excludes_apply_to_sync(proj: Path) -> None:
    (proj / "cpuaccel.yaml").write_text("exclude: ['*.bin']\n")
    (proj / "big.bin").write_text("x")
    dest = proj.parent / "dest"
    (proj / "inv.yaml").write_text("all:\n  hosts:\n    localhost:\n")
    proc = cpuaccel("sync", "-i", "inv.yaml", "--dest", str(dest), "--json", cwd=proj)
    assert proc.returncode == 0, proc.stderr
    assert (dest / "train.py").is_file() and not (dest / "big.bin").exists()


def test_a_venv_folder_becomes_cpuaccel_venv_for_provision(tmp_path: Path) -> None:
    base = ["config", "--yes", "--hosts", "192.0.2.10,192.0.2.11", "--ppn", "2"]
    proc = cpuaccel(*base, "--python", "/opt/cpuaccel/venv", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    group = yaml.safe_load((tmp_path / "inventory.yaml").read_text())["all"]["vars"]
    assert group["cpuaccel_venv"] == "/opt/cpuaccel/venv" and "cpuaccel_python" not in group
    assert "first: cpuaccel provision" in proc.stdout
    proc = cpuaccel(*base, "--python", "/opt/py/bin/python3", "--force", cwd=tmp_path)
    group = yaml.safe_load((tmp_path / "inventory.yaml").read_text())["all"]["vars"]
    assert group["cpuaccel_python"] == "/opt/py/bin/python3" and "cpuaccel_venv" not in group


def test_a_value_written_is_read_back_with_the_bounded_yaml_reader() -> None:
    """A written value is checked by reading it back as YAML: 5000 '[' recursed."""
    from cpuaccel.config.writer import inventory_text

    deep = "[" * 5000
    text = inventory_text(["node1"], {}, {"ansible_user": deep}, "a note")
    assert f"ansible_user: {json.dumps(deep)}" in text
    assert yaml.safe_load(text)["all"]["vars"]["ansible_user"] == deep
