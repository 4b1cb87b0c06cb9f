"""``cpuaccel config``: the questionnaire, ``config show`` and ``config import``."""

from __future__ import annotations

import os
import posixpath
import sys
from pathlib import Path
from typing import Any

import click

from cpuaccel import ui
from cpuaccel.api.keywords import FlagValues, click_type
from cpuaccel.api.target import Target, warn
from cpuaccel.cli.options import EPILOG as ALIASES_EPILOG
from cpuaccel.cli.options import (
    host_options,
    list_hosts_and_exit,
    setting_options,
)
from cpuaccel.config.project import ProjectConfig
from cpuaccel.config.project_choice import load_config
from cpuaccel.config.questionnaire import Answers, run_questionnaire
from cpuaccel.config.settings import BY_NAME, LAUNCHER_CHOICES, SHOW, TABLE
from cpuaccel.config.writer import default_paths, inventory_text, project_text, write_files
from cpuaccel.errors import InventoryError, UsageError
from cpuaccel.inventory.hostfile import looks_like_hostfile
from cpuaccel.sourcefile import read_source
from cpuaccel.ui import escape

EPILOG = """\b
Examples:
  cpuaccel config                                   # answer a few questions
  cpuaccel config --yes --hosts node0,node1 -u train --ppn 2
  cpuaccel config --yes --single --ppn 2            # this machine only
  cpuaccel config import default_config.yaml        # from `accelerate config`
  cpuaccel config show                              # each setting and where it came from

\b
Writes inventory.yaml (Ansible format: hosts, SSH user/port/key, Python on the nodes)
and cpuaccel.yaml (run defaults: nodes, ppn, launcher, port, precision, oneCCL workers)
in --dir (default: here). An existing file is never replaced without asking (--force).
"""


def _split_hosts(value: str | None) -> list[str]:
    if not value:
        return []
    from cpuaccel.config.questionnaire import check_host

    hosts: list[str] = []
    for item in value.replace(" ", ",").split(","):
        if not item:
            continue
        try:
            hosts.append(check_host(item))
        except ValueError as exc:
            raise UsageError(f"--hosts: {exc}", hint="e.g. --hosts node0,node1,10.0.0.3") from None
    if len(set(hosts)) != len(hosts):
        raise UsageError("--hosts lists a host twice", hint="name each machine once")
    return hosts


def _rel(path: str, folder: Path) -> str:
    try:
        return os.path.relpath(Path(path).resolve(), folder.resolve())
    except ValueError:
        return str(Path(path).resolve())


def _files_for(a: Answers, folder: Path) -> dict[Path, str]:
    inventory_path, project_path = default_paths(folder)
    multi = a.mode == "multi"
    project: dict[str, Any] = {}
    files: dict[Path, str] = {}
    if a.source_is_inventory and a.source:
        project["inventory"] = _rel(a.source, folder)
    else:
        hosts = list(a.hosts)
        if a.head and a.head in hosts:  # the main node first: rank 0 and mpirun run there
            hosts.remove(a.head)
            hosts.insert(0, a.head)
        group_vars: dict[str, Any] = {}
        host_vars: dict[str, dict[str, Any]] = {}
        if multi:
            if a.user:
                group_vars["ansible_user"] = a.user
            if a.ssh_port and a.ssh_port != 22:
                group_vars["ansible_port"] = a.ssh_port
            if a.key:
                group_vars["ansible_ssh_private_key_file"] = a.key
        else:
            host_vars["localhost"] = {"ansible_connection": "local"}
        if a.python:
            # An interpreter (…/bin/python3) is used as it is; a folder is the venv that
            # `cpuaccel provision` creates there, and check and run then use its python.
            is_interpreter = posixpath.basename(a.python.rstrip("/")).startswith("python")
            group_vars["cpuaccel_python" if is_interpreter else "cpuaccel_venv"] = a.python
        if a.workdir:
            group_vars["cpuaccel_workdir"] = a.workdir
        note = f"{len(hosts)} machine(s)" + (f", from {a.source}" if a.source else "")
        files[inventory_path] = inventory_text(hosts, host_vars, group_vars, note)
        project["inventory"] = inventory_path.name
    project.update(
        nodes=len(a.hosts) if multi else 1,
        ppn=a.ppn,
        launcher=a.launcher,
        master_port=a.master_port,
        mixed_precision="no" if a.mixed_precision == "fp32" else a.mixed_precision,
        ccl_workers=a.ccl_workers,
    )
    files[project_path] = project_text(project, "")
    return files


def _confirm(path: Path) -> bool:
    return click.confirm(f"{path} exists: overwrite it?", default=False)


@click.group(
    "config", invoke_without_command=True, epilog=EPILOG,
    context_settings={"help_option_names": ["-h", "--help"]},
)  # fmt: skip
@click.option("-y", "--yes", is_flag=True, help="Ask nothing: flags, else the defaults.")
@click.option("--force", is_flag=True, help="Overwrite existing files.")
@click.option(
    "--dir", "folder", default=".", type=click.Path(file_okay=False), help="Where to write."
)
@click.option("--single", "mode", flag_value="single", help="This machine only.")
@click.option("--multi", "mode", flag_value="multi", help="Several machines.")
@click.option("--from", "source", metavar="FILE", help="Start from an MPI hostfile or inventory.")
@click.option("--hosts", metavar="A,B,...", help="The machines' addresses, main node first.")
@click.option("-u", "--user", metavar="USER", help="SSH user.")
@click.option("--ssh-port", type=click.IntRange(1, 65535), help="SSH port.")
@click.option("--private-key", "--key-file", "key", metavar="FILE", help="SSH private key.")
@click.option("--key", "old_key", metavar="FILE", hidden=True)  # the earlier spelling
@click.option("--ppn", type=click.IntRange(1, 1024), help="Processes per machine.")
@click.option("--head", metavar="HOST", help="The main node (default: the first host).")
@click.option(
    "--master-port", type=click_type(BY_NAME["master_port"], SHOW), help="Port of the main process."
)
@click.option(
    "--launcher",
    type=click.Choice(LAUNCHER_CHOICES),
    help="MPI launcher (auto: the head node's, from its facts).",
)
@click.option(
    "--ccl-workers", type=click_type(BY_NAME["ccl_workers"], SHOW), help="oneCCL worker threads."
)
@click.option(
    "--mixed-precision",
    type=click_type(BY_NAME["mixed_precision"], SHOW),
    help="auto, bf16, or fp32 (= no).",
)
@click.option(
    "--python",
    metavar="PATH",
    help="Python on the nodes: an interpreter (.../bin/python3), or a venv folder that "
    "`cpuaccel provision` creates.",
)
@click.option("--workdir", metavar="DIR", help="Folder on the nodes for code and runs.")
@click.pass_context
def config_command(
    ctx: click.Context, /, yes: bool, force: bool, folder: str, **flags: Any
) -> None:
    """Set up a project: ask what `accelerate config` asks, write inventory.yaml and
    cpuaccel.yaml."""
    if ctx.invoked_subcommand is not None:
        return
    interactive = not yes
    if interactive and not sys.stdin.isatty():
        raise UsageError(
            "cpuaccel config asks its questions on a terminal, and stdin is not one",
            hint="run it in a terminal, or pass --yes with flags (see cpuaccel config --help)",
        )
    old_key = flags.pop("old_key")
    if old_key is not None:
        if flags["key"] is not None and flags["key"] != old_key:
            raise UsageError(
                f"--private-key {flags['key']} and --key {old_key} name two keys",
                hint="give one: --private-key FILE",
            )
        flags["key"] = old_key
    hosts = _split_hosts(flags.pop("hosts"))
    precision = flags.pop("mixed_precision")
    given = Answers(
        hosts=hosts, mixed_precision="fp32" if precision == "no" else precision, **flags
    )
    if given.head is not None and hosts and given.head not in hosts:
        raise UsageError(f"--head {given.head} is not in --hosts", hint="name one of --hosts")
    answers = run_questionnaire(given, interactive)
    path = Path(folder)
    written = write_files(
        _files_for(answers, path), force=force, confirm=_confirm if interactive else None
    )
    out = ui.stdout()
    for file in written:
        out.print(f"wrote {escape(str(file))}")
    out.print(
        "next: cpuaccel check (are the nodes ready?), then cpuaccel run train.py "
        "(cpuaccel config show: the settings it will use)"
    )
    if answers.python and not posixpath.basename(answers.python).startswith("python"):
        out.print("      first: cpuaccel provision (creates the venv on every node)")


@config_command.command("show", epilog=ALIASES_EPILOG)
@setting_options(SHOW)
@host_options(settles_hosts=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of a table.")
def show_command(target: Target, flags: FlagValues, as_json: bool) -> None:
    """Print the effective settings of `cpuaccel run` here, and where each came from
    (flag, project file, inventory, default). Contacts no host.

    Takes the same options as `cpuaccel run`, so `cpuaccel config show --ppn 8`
    shows what `cpuaccel run --ppn 8 ...` would use.
    """
    settings = target.settings(flags)
    list_hosts_and_exit(target, settings.hosts.value)  # --nodes and the head decide
    rows: dict[str, dict[str, Any]] = {}
    project = target.project
    if project is not None:
        kind = "Accelerate config" if project.kind == "accelerate" else "project file"
        rows["config"] = {"value": project.path, "source": kind, "where": None}
    else:
        rows["config"] = {"value": None, "source": "default", "where": "no ./cpuaccel.yaml"}
    # The table's shown rows: the hosts' options as the target settled them, then the
    # settings (LaunchSettings.shown()).
    targeted = {"inventory": target.inventory_setting, "limit": target.limit}
    for entry in TABLE:
        setting = targeted.get(entry.name) if entry.shown and not entry.field else None
        if setting is not None:
            rows[entry.name] = setting.to_json()
    rows.update({name: s.to_json() for name, s in settings.shown().items()})
    if as_json:
        ui.print_json(rows)
        return
    out = ui.stdout()
    width = max(len(name) for name in rows)
    for name, row in rows.items():
        value = row["value"]
        text = "-" if value is None or value == {} or value == [] else _show(value)
        where = f" ({row['where']})" if row["where"] else ""
        out.print(
            f"{name:<{width}}  {escape(text):<24} [dim]{escape(row['source'])}{escape(where)}[/]"
        )


def _show(value: Any) -> str:
    if isinstance(value, dict):
        return " ".join(f"{k}={v}" for k, v in value.items())
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


@config_command.command("import")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option(
    "--dir", "folder", default=".", type=click.Path(file_okay=False), help="Where to write."
)
@click.option("--force", is_flag=True, help="Overwrite existing files.")
@click.option("--dry-run", is_flag=True, help="Show the mapping; write nothing.")
@click.option("--json", "as_json", is_flag=True, help="The mapping as JSON.")
def import_command(file: str, folder: str, force: bool, dry_run: bool, as_json: bool) -> None:
    """Turn Accelerate's default_config.yaml (and the hostfile it names) into
    cpuaccel.yaml and inventory.yaml. Contacts no host.

    \b
    Examples:
      cpuaccel config import ~/.cache/huggingface/accelerate/default_config.yaml
      cpuaccel config import default_config.yaml --dry-run --json
    """
    config = load_config(file)
    if config.kind != "accelerate":
        raise UsageError(
            f"{file} is not an Accelerate config (no distributed_type or compute_environment)",
            hint="a cpuaccel.yaml needs no import: pass it to run with --config",
        )
    if config.inventory_error is not None:
        raise config.inventory_error
    warn(config.warnings)
    mapping = _mapping(config)
    path = Path(folder)
    files = _import_files(config, path)
    if as_json:
        ui.print_json(
            {"mapping": mapping, "warnings": config.warnings, "files": [str(p) for p in files]}
        )
    else:
        out = ui.stdout()
        out.print(f"# {escape(file)} (Accelerate) -> cpuaccel")
        for key, row in mapping.items():
            src = f"{row['field']} ({file}:{row['line']})" if row["field"] else ""
            out.print(f"{key:<16} {escape(_show(row['value'])):<24} [dim]{escape(src)}[/]")
    if dry_run:
        return
    written = write_files(files, force=force, confirm=None)
    if not as_json:
        out = ui.stdout()
        for p in written:
            out.print(f"wrote {escape(str(p))}")
        out.print("next: cpuaccel config show, then cpuaccel run train.py")


def _mapping(config: ProjectConfig) -> dict[str, dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    for key in ("nodes", "ppn", "head", "master_port", "mixed_precision", "ccl_workers", "env"):
        if config.get(key) is not None:
            rows[key] = {
                "value": config.get(key),
                "field": config.field_name(key),
                "line": config.lines.get(key),
            }
    if config.hosts:
        rows["hosts"] = {
            "value": config.hosts[: int(config.get("nodes") or 1)],
            "field": config.field_name("inventory"),
            "line": config.lines.get("inventory"),
        }
    elif config.local_only:
        rows["hosts"] = {"value": ["localhost"], "field": "distributed_type", "line": None}
    return rows


def _import_files(config: ProjectConfig, folder: Path) -> dict[Path, str]:
    inventory_path, project_path = default_paths(folder)
    values: dict[str, Any] = {}
    files: dict[Path, str] = {}
    note = f"from {config.path}"
    if config.hosts or config.local_only:
        hosts = list(config.hosts) or ["localhost"]
        head = config.get("head")
        if head in hosts:
            hosts.remove(head)
            hosts.insert(0, head)
        host_vars = {"localhost": {"ansible_connection": "local"}} if config.local_only else {}
        hostfile = config.get("inventory")
        if hostfile and looks_like_hostfile(
            read_source(hostfile, InventoryError, "hostfile", "check the path")
        ):
            note = f"the hosts of {hostfile}; add ansible_user / ansible_ssh_private_key_file"
        files[inventory_path] = inventory_text(hosts, host_vars, {}, note)
        values["inventory"] = inventory_path.name
    for key in ("nodes", "ppn", "master_port", "mixed_precision", "ccl_workers", "env"):
        if config.get(key) is not None:
            values[key] = config.get(key)
    files[project_path] = project_text(values, f"imported from {config.path}")
    return files
