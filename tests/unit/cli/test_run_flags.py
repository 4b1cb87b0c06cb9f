"""`accelerate launch` and torchrun users type what they know on `cpuaccel run` and get
what they meant, or one line with cpuaccel's spelling.

Every case runs `cpuaccel run --dry-run` (or `config show`) as a user does and reads the
rendered hostfile, env.sh and mpirun line; nothing here contacts a node.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from cpuaccel.api.keywords import parse_env
from cpuaccel.api.script import check_script_kind
from cpuaccel.cli.config import config_command, show_command
from cpuaccel.cli.run import run_command
from cpuaccel.config.effective import resolve
from cpuaccel.connectors.connect_options import ConnectOptions
from cpuaccel.errors import EXIT_USAGE, UsageError
from cpuaccel.executor import ConnectionPool
from cpuaccel.inventory.host import Host
from cpuaccel.inventory.inventory import Inventory
from cpuaccel.jobs import launch as job
from cpuaccel.jobs.connections import Nodes
from cpuaccel.jobs.plan import PLACEHOLDER, Script, build_plan
from cpuaccel.jobs.request import LaunchRequest
from testsupport.command import cpuaccel, inherited_env
from testsupport.command import output_section as section

REPO = Path(__file__).resolve().parents[3]
INVENTORY = str(REPO / "inventory.example.yaml")  # node0..node3, 192.0.2.10..13
NODES = ["node0", "node1", "node2", "node3"]


@pytest.fixture
def proj(tmp_path: Path) -> Path:
    folder = tmp_path / "proj"
    folder.mkdir()
    (folder / "train.py").write_text("print('hello')\n")
    return folder


def env_for(tmp_path: Path, **extra: str) -> dict[str, str]:
    """This session's environment, with an empty Hugging Face home: a developer's own
    Accelerate default config must not change what these tests see."""
    return inherited_env(**{"HF_HOME": str(tmp_path / "hf-empty"), **extra})


def dry_run(proj: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return cpuaccel(
        "run", "-i", INVENTORY, "--dry-run", *args, cwd=proj, env=env_for(proj.parent, **env)
    )


def mpirun(out: str) -> list[str]:
    return shlex.split(section(out, "command")[0])


def exported(out: str) -> dict[str, str]:
    pairs = (line.removeprefix("export ").split("=", 1) for line in section(out, "env.sh"))
    return {k: shlex.split(v)[0] if v else "" for k, v in (p for p in pairs if len(p) == 2)}


def ranks(argv: list[str]) -> tuple[str, str]:
    return argv[argv.index("-n") + 1], argv[argv.index("-ppn") + 1]


# ---------------------------------------------------------------- item 1: aliases


@pytest.mark.parametrize(
    ("args", "n", "ppn", "hostfile"),
    [
        # accelerate launch: --num_processes is the total over all machines.
        pytest.param(["--num_processes", "8"], "8", "2", NODES, id="num_processes-all-hosts"),
        pytest.param(
            ["--num_processes", "8", "--num_machines", "2"], "8", "4", NODES[:2],
            id="num_processes-num_machines",
        ),
        pytest.param(
            ["--num-processes=6", "--nodes", "3"], "6", "2", NODES[:3], id="num-processes-nodes"
        ),
        # torchrun: --nnodes and --nproc-per-node (either spelling).
        pytest.param(
            ["--nnodes", "2", "--nproc-per-node", "3"], "6", "3", NODES[:2], id="torchrun-dash"
        ),
        pytest.param(
            ["--nnodes=2:2", "--nproc_per_node=2"], "4", "2", NODES[:2], id="torchrun-fixed-range"
        ),
        pytest.param(
            ["--num_processes", "4", "--ppn", "1"], "4", "1", NODES, id="total-agrees-with-ppn"
        ),
        # MIN:MAX: MAX nodes are taken (MIN only matters when a preflight fails).
        pytest.param(["--nnodes", "1:3", "--ppn", "1"], "3", "1", NODES[:3], id="torchrun-range"),
        pytest.param(["--nodes", "2:4", "--ppn", "2"], "8", "2", NODES, id="nodes-range"),
    ],
)  # fmt: skip
def test_world_size_aliases(
    proj: Path, args: list[str], n: str, ppn: str, hostfile: list[str]
) -> None:
    proc = dry_run(proj, *args, "train.py", "--lr", "1")
    assert proc.returncode == 0, proc.stderr
    argv = mpirun(proc.stdout)
    assert ranks(argv) == (n, ppn)
    assert section(proc.stdout, "hostfile") == hostfile
    assert argv[-3:] == ["train.py", "--lr", "1"]


@pytest.mark.parametrize("word", ["auto", "cpu"])
def test_torchrun_nproc_auto_is_cpuaccels_default(proj: Path, word: str) -> None:
    proc = dry_run(proj, "--nproc-per-node", word, "train.py")
    assert proc.returncode == 0, proc.stderr
    assert ranks(mpirun(proc.stdout)) == ("<4 x ppn>", "<ppn: sockets per node>")


@pytest.mark.parametrize(
    ("flag", "head"),
    [
        ("--master_addr", "node2"),
        ("--master-addr", "192.0.2.12"),  # an address is the host it belongs to
        ("--main_process_ip", "node2"),
    ],
)
def test_head_aliases_put_that_host_first(proj: Path, flag: str, head: str) -> None:
    proc = dry_run(proj, flag, head, "--nnodes", "2", "train.py")
    assert proc.returncode == 0, proc.stderr
    assert section(proc.stdout, "hostfile") == ["node2", "node0"]
    assert exported(proc.stdout)["MASTER_ADDR"] == "node2"
    assert "(on node2, from launch.sh)" in proc.stdout


@pytest.mark.parametrize("flag", ["--master_port", "--main_process_port", "--master-port"])
def test_port_aliases(proj: Path, flag: str) -> None:
    proc = dry_run(proj, flag, "29611", "train.py")
    assert proc.returncode == 0, proc.stderr
    assert exported(proc.stdout)["MASTER_PORT"] == "29611"


@pytest.mark.parametrize(
    ("args", "value"),
    [
        (["--mixed_precision", "bf16"], "bf16"),
        (["--mixed-precision", "fp32"], "no"),  # fp32 is Accelerate's "no"
        (["--mixed_precision", "no"], "no"),
        # auto is settled from the nodes' CPUs, which a dry run does not ask
        (["--mixed-precision", "auto"], PLACEHOLDER),
        (["--mixed-precision", "BF16", "--mixed_precision", "bf16"], "bf16"),  # the same twice
    ],
)
def test_mixed_precision_spellings_and_choices(proj: Path, args: list[str], value: str) -> None:
    proc = dry_run(proj, *args, "train.py")
    assert proc.returncode == 0, proc.stderr
    assert exported(proc.stdout)["ACCELERATE_MIXED_PRECISION"] == value


def test_config_show_names_the_spelling_typed(proj: Path) -> None:
    proc = cpuaccel(
        "config", "show", "-i", INVENTORY, "--json", "--nproc_per_node", "3",
        "--main_process_ip", "node3", "--num_machines", "2", "--master_port", "29612",
        cwd=proj, env=env_for(proj.parent),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert rows["ppn"] == {"value": 3, "source": "flag", "where": "--nproc_per_node"}
    assert rows["head"] == {"value": "node3", "source": "flag", "where": "--main_process_ip"}
    assert rows["nodes"] == {"value": 2, "source": "flag", "where": "--num_machines"}
    assert rows["master_port"]["where"] == "--master_port"
    assert rows["hosts"]["value"] == ["node3", "node0"]
    total = cpuaccel(
        "config", "show", "-i", INVENTORY, "--json", "--num_processes", "8",
        cwd=proj, env=env_for(proj.parent),
    )  # fmt: skip
    assert json.loads(total.stdout)["ppn"] == {
        "value": 2,
        "source": "flag",
        "where": "--num_processes 8 / 4 node(s)",
    }


@pytest.mark.parametrize(
    ("args", "message", "fix"),
    [
        (["--num_processes", "6"], "--num_processes 6 cannot be split evenly over 4 node(s)",
         "multiple of 4"),
        (["--num_processes", "8", "--ppn", "3"],
         "--num_processes 8 is 2 per node on 4 node(s), but --ppn says 3", "either"),
        # MIN:MAX: a bad range names the flag.
        (["--nnodes", "4:1"], "--nnodes 4:1: MIN is above MAX", "--nnodes 1:4"),
        (["--nodes", "0:2"], "--nodes 0:2: expected MIN:MAX, whole numbers of 1", "--nodes 2:3"),
        (["--nodes", "2:5"], "--nodes 5, but 4 host(s) are selected", "lower --nodes"),
        (["--nodes", "2:3", "--nnodes", "2:4"],
         "--nodes 2:3 and --nnodes 2:4 set the same thing differently", "give --nodes once"),
        (["--nnodes", "two"], "--nnodes two: expected a whole number", "--nnodes 2"),
        (["--nproc_per_node", "gpu"], "cpuaccel runs its ranks on CPUs", "--nproc_per_node 2"),
        (["--nproc-per-node", "2", "--ppn", "3"],
         "--ppn 3 and --nproc-per-node 2 set the same thing differently", "give --ppn once"),
        (["--master_port", "1", "--main_process_port", "2"],
         "--master_port 1 and --main_process_port 2 set the same thing", "--master-port"),
        (["--mixed-precision", "bf16", "--mixed_precision", "fp32"],
         "--mixed-precision bf16 and --mixed_precision fp32", "--mixed-precision once"),
        (["--num_machines", "5"], "--num_machines 5, but 4 host(s) are selected", "lower"),
        (["--master_addr", "elsewhere"],
         "--master_addr elsewhere: not among the selected hosts", "widen --limit"),
        # Unknown options before SCRIPT: named, with cpuaccel's spelling where there is one.
        (["-n", "2"], "-n: no such option of cpuaccel run", "--num_processes N"),
        (["-np", "2"], "-np: no such option", "--num_processes N"),
        # torchrun's spelling of --max-restarts is taken; a bad value names the flag.
        (["--max-restarts", "-1"], "'--max-restarts': -1 is not in the range", "run --help"),
        (["--max_restarts=x"], "Invalid value for '--max_restarts'", "run --help"),
        (["--max-restarts", "2", "--max_restarts", "3"],
         "--max-restarts 2 and --max_restarts 3 set the same thing differently",
         "give --max-restarts once"),
        (["--restart-delay", "-2"], "'--restart-delay': -2.0 is not in the range", "run --help"),
        (["--config_file", "x.yaml"], "--config_file: no such option", "--config FILE"),
        (["--frobnicate"], "--frobnicate: no such option of cpuaccel run", "cpuaccel run --help"),
        (["--frobnicate=1", "--ppn", "2"], "--frobnicate: no such option", "go after SCRIPT"),
        # A typo gets the closest option; another tool's option what cpuaccel does instead.
        (["--nodse", "2"], "--nodse: no such option of cpuaccel run", "did you mean --nodes?"),
        (["--dryrun"], "--dryrun: no such option", "did you mean --dry-run?"),
        (["--mpirun_hostfile", "hosts"], "--mpirun_hostfile: no such option", "-i FILE"),
        (["--ipex"], "--ipex: no such option", "the runtime applies IPEX"),
        (["--enable_cpu_affinity"], "--enable_cpu_affinity: no such option",
         "pins each rank to its own cores"),
        (["-q"], "-q: no such option", "cpuaccel is quiet already"),
        (["--quiet"], "--quiet: no such option", "traceback is shown once"),
    ],
)  # fmt: skip
def test_bad_or_unknown_options_before_script(
    proj: Path, args: list[str], message: str, fix: str
) -> None:
    proc = cpuaccel("run", "-i", INVENTORY, *args, "train.py", cwd=proj, env=env_for(proj.parent))
    assert proc.returncode == EXIT_USAGE, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[0].startswith("error: ") and message in lines[0], proc.stderr
    assert len(lines) == 2 and lines[1].strip().startswith("fix:") and fix in lines[1], lines
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr


def test_an_unknown_option_names_a_script_only_when_that_file_exists(proj: Path) -> None:
    (proj / "--frobnicate").write_text("print('a script with an odd name')\n")
    proc = cpuaccel("run", "-i", INVENTORY, "--frobnicate", cwd=proj, env=env_for(proj.parent))
    assert proc.returncode == EXIT_USAGE
    assert "the script named --frobnicate is ./--frobnicate" in proc.stderr
    proc = cpuaccel("run", "-i", INVENTORY, "--nodse", "2", "train.py", cwd=proj)
    assert proc.returncode == EXIT_USAGE
    assert "script named" not in proc.stderr


@pytest.mark.parametrize(
    ("files", "args", "line"),
    [
        ({"train.py": "import sys\nprint((1\n"}, ["train.py"],
         "error: train.py:2: SyntaxError: '(' was never closed"),
        ({"pkg/__init__.py": "", "pkg/train.py": "def f(:\n    pass\n"},
         ["-m", "pkg.train"], "error: pkg/train.py:1: SyntaxError: invalid syntax"),
        ({"train.py": "x = 1\n  y = 2\n"}, ["train.py", "--epochs", "1"],
         "error: train.py:2: IndentationError: unexpected indent"),
    ],
)  # fmt: skip
def test_a_script_that_does_not_compile_is_refused_before_any_node(
    proj: Path, files: dict[str, str], args: list[str], line: str
) -> None:
    for name, text in files.items():
        (proj / name).parent.mkdir(parents=True, exist_ok=True)
        (proj / name).write_text(text)
    # Not a dry run: the example inventory's nodes do not exist, so any contact would fail.
    proc = cpuaccel("run", "-i", INVENTORY, *args, cwd=proj, env=env_for(proj.parent))
    assert proc.returncode == EXIT_USAGE, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[0] == line, proc.stderr
    assert len(lines) == 2 and "no node was contacted" in lines[1], lines
    assert not (proj / "runs").exists()


def test_a_module_not_in_the_project_is_left_to_the_nodes(proj: Path) -> None:
    proc = dry_run(proj, "--ppn", "1", "-m", "somewhere.installed")
    assert proc.returncode == 0, proc.stderr


def test_a_zip_application_is_not_compiled_as_text(proj: Path) -> None:
    import zipapp

    (proj / "app").mkdir()
    (proj / "app" / "__main__.py").write_text("print('hi')\n")
    zipapp.create_archive(proj / "app", proj / "train.pyz")
    zipapp.create_archive(proj / "app", proj / "tool.pyz", interpreter="/usr/bin/env python3")
    for name in ("train.pyz", "tool.pyz"):
        proc = dry_run(proj, "--ppn", "1", name)
        assert proc.returncode == 0, proc.stderr


def test_cpuaccels_options_after_script_go_to_it_with_one_note(proj: Path) -> None:
    proc = dry_run(proj, "--ppn", "1", "train.py", "--nodes", "5", "--epochs", "3")
    assert proc.returncode == 0, proc.stderr
    assert mpirun(proc.stdout)[-5:] == ["train.py", "--nodes", "5", "--epochs", "3"]
    note = "note: --nodes after train.py goes to the script; put it before train.py for cpuaccel"
    assert proc.stderr.splitlines().count(note) == 1, proc.stderr
    quiet = dry_run(proj, "--ppn", "1", "train.py", "--epochs", "3")
    assert "note:" not in quiet.stderr


def test_options_after_script_stay_the_scripts(proj: Path) -> None:
    args = ["--num_processes", "3", "-n", "2", "--frobnicate", "--max-restarts=1"]
    proc = dry_run(proj, "--ppn", "1", "train.py", *args)
    assert proc.returncode == 0, proc.stderr
    assert mpirun(proc.stdout)[-7:] == ["train.py", *args]


# ---------------------------------------------------------------- item 4: --env NAME


def test_env_name_passes_the_controllers_value_and_hides_credentials(proj: Path) -> None:
    proc = dry_run(
        proj, "--ppn", "1", "--env", "HF_TOKEN", "--env", "FI_PROVIDER", "--env",
        "wandb_api_key", "train.py",
        HF_TOKEN="hf_s3cr3t", FI_PROVIDER="tcp", wandb_api_key="w4ndb-s3cr3t",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert exported(proc.stdout)["FI_PROVIDER"] == "tcp"
    assert "## secret.env (mode 0600): HF_TOKEN, wandb_api_key (values hidden)" in proc.stdout
    for value in ("hf_s3cr3t", "w4ndb-s3cr3t"):
        assert value not in proc.stdout + proc.stderr
    assert not any("HF_TOKEN" in line for line in section(proc.stdout, "env.sh"))


def test_env_name_unset_here_is_an_error_naming_it(proj: Path) -> None:
    proc = dry_run(proj, "--env", "CPUACCEL_TEST_NOT_SET", "train.py")
    assert proc.returncode == EXIT_USAGE
    assert proc.stderr.startswith("error: --env CPUACCEL_TEST_NOT_SET: CPUACCEL_TEST_NOT_SET is")
    assert "write --env CPUACCEL_TEST_NOT_SET=VALUE" in proc.stderr


def test_env_secrets_reach_only_secret_env(tmp_path: Path) -> None:
    """In-process: the value goes to the plan's secret env (secret.env, 0600), never to
    the plain environment."""
    env = parse_env(
        ("HF_TOKEN", "MY_PASSWORD", "PLAIN", "GIVEN=g"),
        {"HF_TOKEN": "t0k", "MY_PASSWORD": "pw", "PLAIN": "p"},
    )
    assert dict(env) == {"PLAIN": "p", "GIVEN": "g"}
    assert env.secret == {"HF_TOKEN": "t0k", "MY_PASSWORD": "pw"}
    chosen = [Host("n1", {"cpuaccel_secret_env": {"OTHER_KEY": "o"}})]
    inventory = Inventory(None, {"n1": chosen[0]}, {})
    settings = resolve({"env": env, "secret_env": env.secret}, None, inventory, chosen)
    assert dict(settings.secret_env.value) == {
        "OTHER_KEY": "o",
        "HF_TOKEN": "t0k",
        "MY_PASSWORD": "pw",
    }
    assert settings.secret_env.where == "--env HF_TOKEN, --env MY_PASSWORD"
    assert "t0k" not in repr(settings.secret_env) + json.dumps(settings.secret_env.to_json())
    plan = build_plan(settings, Script("train.py", (), "proj"), None, "20260101-000000-abcdef")
    assert "HF_TOKEN" not in plan.env and plan.secret_env["HF_TOKEN"] == "t0k"


@pytest.mark.parametrize("item", ["API_KEY=hunter2", "db_secret=hunter2", "HF_TOKEN=hunter2"])
def test_a_secret_given_inline_is_refused_without_its_value(item: str) -> None:
    """The one rule of submit, run, tune and config show: a credential's name takes its
    value from the environment (--env NAME), never from the command line."""
    name = item.split("=")[0]
    with pytest.raises(UsageError) as caught:
        parse_env((item,), {name: "from-here"})
    said = str(caught.value)
    assert said.startswith(f"--env {name}=...: {name} looks like a credential"), said
    assert f"pass --env {name} (no '=')" in said and "cpuaccel_secret_env" in said
    assert "hunter2" not in said


@pytest.mark.parametrize(
    "verb",
    [
        ("config", "show"),
        ("run", "--dry-run", "--ppn", "1"),
        ("tune", "--list-hosts"),
        ("submit", "--dry-run", "--nodes", "1"),
    ],
)
def test_every_verb_refuses_a_secret_given_inline(proj: Path, verb: tuple[str, ...]) -> None:
    script = () if verb[0] == "config" else ("train.py",)
    proc = cpuaccel(*verb, "--env", "API_KEY=hunter2", *script, cwd=proj, env=env_for(proj.parent))
    assert proc.returncode == EXIT_USAGE, proc.stdout + proc.stderr
    assert proc.stderr.startswith("error: --env API_KEY=...: API_KEY looks like a credential")
    assert "hunter2" not in proc.stdout + proc.stderr
    assert not (proj / "runs").exists()


# ---------------------------------------------------------------- item 8: SCRIPT's kind


@pytest.mark.parametrize(
    ("name", "text", "message", "fix"),
    [
        ("inventory.yaml", "all:\n  hosts:\n    n1:\n", "SCRIPT is a YAML file",
         "cpuaccel run -i inventory.yaml train.py"),
        ("hosts.ini", "[all]\nn1\n", "SCRIPT is a INI file", "-i"),
        ("default_config.yml", "distributed_type: MULTI_CPU\n", "YAML file",
         "--config default_config.yml"),
        ("pyproject.toml", "[project]\n", "SCRIPT is a TOML file", "--config"),
        ("run.sh", "#!/bin/sh\necho hi\n", "SCRIPT is not a Python file",
         "cpuaccel run --no-python run.sh"),
        ("train", "import torch\n", "not a Python file", "--no-python"),
    ],
)  # fmt: skip
def test_script_that_is_no_python_script_is_refused(
    proj: Path, name: str, text: str, message: str, fix: str
) -> None:
    (proj / name).write_text(text)
    # `cpuaccel run inventory.yaml train.py`: as `provision inventory.yaml` is typed.
    proc = cpuaccel("run", name, "train.py", cwd=proj, env=env_for(proj.parent))
    assert proc.returncode == EXIT_USAGE, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[0] == f"error: {name}: {message}" or message in lines[0], lines
    assert fix in lines[1], lines


def test_python_scripts_without_py_suffix_still_run(proj: Path) -> None:
    (proj / "train").write_text("#!/usr/bin/env python3\nprint('hi')\n")
    proc = dry_run(proj, "--ppn", "1", "train")
    assert proc.returncode == 0, proc.stderr
    assert mpirun(proc.stdout)[-1] == "train"


def test_no_python_lets_any_executable_through(tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text("a: 1\n")
    (tmp_path / "run.sh").write_text("#!/bin/sh\n")
    for name in ("job.yaml", "run.sh"):
        check_script_kind(str(tmp_path / name), no_python=True)
        with pytest.raises(UsageError):
            check_script_kind(str(tmp_path / name))
    check_script_kind(str(tmp_path / "missing"))  # "no such script" is the caller's


# ---------------------------------------------------------------- item 3: Accelerate's default


ACCELERATE = (
    "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_CPU\n"
    "mixed_precision: {precision}\nnum_machines: 2\nnum_processes: 4\n"
    "main_process_port: 29613\nuse_cpu: true\n"
)


def write_default(home: Path, precision: str = "bf16") -> Path:
    path = home / "accelerate" / "default_config.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(ACCELERATE.format(precision=precision))
    return path


@pytest.mark.parametrize("variable", ["HF_HOME", "XDG_CACHE_HOME"])
def test_accelerate_default_config_is_read_and_said(proj: Path, variable: str) -> None:
    home = proj.parent / "cache"
    path = write_default(home / "huggingface" if variable == "XDG_CACHE_HOME" else home)
    env = {**env_for(proj.parent), variable: str(home)}
    if variable == "XDG_CACHE_HOME":
        del env["HF_HOME"]
    proc = cpuaccel("run", "-i", INVENTORY, "--dry-run", "train.py", cwd=proj, env=env)
    assert proc.returncode == 0, proc.stderr
    assert ranks(mpirun(proc.stdout)) == ("4", "2")
    assert section(proc.stdout, "hostfile") == NODES[:2]
    assert exported(proc.stdout)["MASTER_PORT"] == "29613"
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0], proc.stderr
    # A flag still wins over it.
    flagged = cpuaccel(
        "run", "-i", INVENTORY, "--dry-run", "--ppn", "1", "train.py", cwd=proj, env=env
    )
    assert ranks(mpirun(flagged.stdout)) == ("2", "1")


def test_accelerate_default_config_gives_way_to_cpuaccel_yaml_and_config(proj: Path) -> None:
    home = proj.parent / "hf"
    write_default(home, precision="fp16")  # broken: would be an error if it were read
    env = env_for(proj.parent, HF_HOME=str(home))
    (proj / "cpuaccel.yaml").write_text("ppn: 3\n")
    proc = cpuaccel("run", "-i", INVENTORY, "--dry-run", "train.py", cwd=proj, env=env)
    assert proc.returncode == 0, proc.stderr
    assert ranks(mpirun(proc.stdout)) == ("12", "3") and proc.stderr == ""
    (proj / "cpuaccel.yaml").rename(proj / "other.yaml")
    proc = cpuaccel(
        "run", "-i", INVENTORY, "--config", "other.yaml", "--dry-run", "train.py",
        cwd=proj, env=env,
    )  # fmt: skip
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


def test_broken_accelerate_default_config_is_a_file_line_error(proj: Path) -> None:
    home = proj.parent / "hf"
    path = write_default(home, precision="fp16")
    proc = cpuaccel(
        "run", "-i", INVENTORY, "--dry-run", "train.py", cwd=proj,
        env=env_for(proj.parent, HF_HOME=str(home)),
    )  # fmt: skip
    assert proc.returncode == EXIT_USAGE
    lines = proc.stderr.strip().splitlines()
    assert lines[0] == f"error: {path}:3: mixed_precision: 'fp16' is not supported on CPUs"
    assert "no ./cpuaccel.yaml nor --config" in lines[1] and len(lines) == 2


def test_single_machine_default_config_does_not_override_an_inventory(proj: Path) -> None:
    home = proj.parent / "hf"
    path = home / "accelerate" / "default_config.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: 'NO'\nnum_processes: 1\n"
    )
    env = env_for(proj.parent, HF_HOME=str(home), CPUACCEL_INVENTORY=INVENTORY)
    proc = cpuaccel("run", "--dry-run", "--ppn", "1", "train.py", cwd=proj, env=env)
    assert proc.returncode == 0, proc.stderr
    assert section(proc.stdout, "hostfile") == NODES
    del env["CPUACCEL_INVENTORY"]
    proc = cpuaccel("run", "-i", INVENTORY, "--dry-run", "train.py", cwd=proj, env=env)
    assert ranks(mpirun(proc.stdout)) == ("<4 x ppn>", "<ppn: sockets per node>")
    assert proc.stderr == ""  # no inventory: the config is this machine's, as accelerate's
    proc = cpuaccel("run", "--dry-run", "train.py", cwd=proj, env=env)
    assert proc.returncode == 0, proc.stderr
    assert section(proc.stdout, "hostfile") == ["localhost"] and str(path) in proc.stderr


# ---------------------------------------------------------------- item 19


def test_config_yes_writes_what_run_defaults_to(tmp_path: Path) -> None:
    proc = cpuaccel(
        "config", "--yes", "--single", "--ppn", "2", cwd=tmp_path, env=env_for(tmp_path)
    )
    assert proc.returncode == 0, proc.stderr
    written = yaml.safe_load((tmp_path / "cpuaccel.yaml").read_text())
    assert written["launcher"] == "auto" and written["mixed_precision"] == "auto"
    for precision, value in (("fp32", "no"), ("no", "no"), ("bf16", "bf16"), ("auto", "auto")):
        folder = tmp_path / precision
        proc = cpuaccel(
            "config", "--yes", "--single", "--dir", str(folder), "--mixed-precision", precision,
            cwd=tmp_path, env=env_for(tmp_path),
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert yaml.safe_load((folder / "cpuaccel.yaml").read_text())["mixed_precision"] == value


def test_config_show_and_config_flags_have_help(tmp_path: Path) -> None:
    for command in (show_command, config_command, run_command):
        shown = [p for p in command.params if isinstance(p, click.Option) and not p.hidden]
        assert [p.opts[0] for p in shown if not p.help] == [], command.name
        hidden = {o for p in command.params if getattr(p, "hidden", False) for o in p.opts}
        if command is not config_command:  # the aliases: hidden, and listed in the epilog
            assert {"--num_processes", "--nproc_per_node", "--master_addr"} <= hidden
            assert "--num_processes N" in (command.epilog or "")
    show = cpuaccel("config", "show", "--help", cwd=tmp_path).stdout
    assert "MPI launcher, as run's." in show and "Sync: leave these paths out" in show
    assert "MPI launcher (auto" in cpuaccel("config", "--help", cwd=tmp_path).stdout


def test_preflight_progress_bar_counts_the_hosts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    chosen = [Host(f"n{i}", {"cpuaccel_python": "/usr/bin/python3"}) for i in range(3)]
    inventory = Inventory(None, {h.name: h for h in chosen}, {})
    settings = resolve({"ppn": 1}, None, inventory, chosen)
    draft = build_plan(settings, Script("train.py", (), "proj"), None, "20260101-000000-abcdef")
    bars: list[tuple[str, int, list[str]]] = []

    @contextlib.contextmanager
    def progress(description: str, total: int) -> Iterator[Any]:
        advanced: list[str] = []
        bars.append((description, total, advanced))
        yield type("T", (), {"advance": staticmethod(advanced.append)})()

    class Stop(Exception):
        pass

    def preflight(hosts: Any, *args: Any, on_host: Any = None, **kwargs: Any) -> Any:
        for host in hosts:
            on_host(host.name)
        raise Stop

    monkeypatch.setattr(job.ui, "progress", progress)
    monkeypatch.setattr(job, "run_preflight", preflight)
    monkeypatch.chdir(tmp_path)
    nodes = Nodes(ConnectOptions(), 4, ConnectionPool(ConnectOptions()))
    request = LaunchRequest(settings, draft.script, tmp_path, ConnectOptions(), 4)
    with pytest.raises(Stop):
        job._preflight_and_sync(settings, draft, request, nodes)
    assert bars == [("preflight", 3, ["n0", "n1", "n2"])]


@pytest.mark.parametrize(
    "flag",
    ["--hang-timeout", "--timeout", "--restart-delay", "--connect-timeout"],
)
@pytest.mark.parametrize("value", ["nan", "inf"])
def test_a_seconds_flag_refuses_nan_and_infinity(proj: Path, flag: str, value: str) -> None:
    # click's FloatRange let nan through (no comparison with NaN is true): a hang
    # timeout of nan would never, or always, fire.
    proc = dry_run(proj, flag, value, "train.py")
    assert proc.returncode == EXIT_USAGE, proc.stdout + proc.stderr
    # inf above a flag's maximum is refused by the range first, with its own words
    said = (f"{value!r} is not a number of seconds", "inf is not in the range")
    assert any(words in proc.stderr for words in said), proc.stderr
    assert flag in proc.stderr and "Traceback" not in proc.stderr


def test_an_error_prints_a_value_as_given_not_as_an_emoji(proj: Path) -> None:
    proc = dry_run(proj, "--nodes", "1:x", "train.py")
    assert proc.returncode == EXIT_USAGE, proc.stdout + proc.stderr
    assert "--nodes 1:x: expected MIN:MAX" in proc.stderr, proc.stderr
