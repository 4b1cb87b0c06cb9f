"""RunDir: the rendered files of one job, on the controller and on every node.

Everything a job runs is rendered from Jinja templates (templates/*.j2, or the user's
copies in ``cpuaccel_templates``) into ``runs/<id>/`` on the controller, with the exact
command, and copied to ``{{cpuaccel_workdir}}/runs/<id>/`` on every node; run folders
are 0700 and their files 0600 (0700 the scripts). Secrets go to the nodes only
(secret.env), never into the controller's records, and the sweep at the end of the job
removes them.
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import shlex
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from cpuaccel.connectors import openssh
from cpuaccel.connectors.connect_options import ConnectOptions
from cpuaccel.errors import UsageError
from cpuaccel.inventory.variables import host_name_problem
from cpuaccel.jobs.plan import RunPlan, allocator_candidates, iomp_candidates
from cpuaccel.jsonsource import Refused, read_file
from cpuaccel.templating import RenderLimit, file_environment

# Only the user who runs the job reads its files: env.sh and the logs may hold what a
# script prints or an inventory sets, and secret.env is the secrets.
EXECUTABLE = 0o700
PLAIN = 0o600
PRIVATE = 0o600
FOLDER = 0o700
SECRET_FILES = frozenset({"secret.env"})  # never on the controller's disk or records

HostKeys = Mapping[str, str]  # host name -> "TYPE BASE64", as the controller verified it


def _environment(plan: RunPlan) -> jinja2.Environment:
    env = file_environment(
        plan.templates,
        setting="cpuaccel_templates",
        hint="point it at a folder holding your copies of templates/*.j2",
    )
    return env


def _check_names(plan: RunPlan) -> None:
    """Each node's name and address as the inventory's check takes them: the hostfile
    holds names unquoted (MPI reads no quoting), env.sh the head's, and a user's copy of
    a template may write them anywhere. Checked again here, whichever source (an
    inventory, Slurm's node list) gave the hosts."""
    names = plan.hostfile_names()
    for host in plan.hosts:
        for value in (host.name, host.address, names.get(host.name, host.name)):
            problem = host_name_problem(value)
            if problem is not None:
                raise UsageError(
                    f"a host the run's files would name: {problem}",
                    hint="name the host (and its ansible_host) with letters, digits, '.', "
                    "'-' and '_', or an IP address",
                )


def _context(plan: RunPlan) -> dict[str, Any]:
    _check_names(plan)
    return {
        "run_id": plan.run_id,
        "run_dir": plan.run_dir,
        "head": plan.head.name,
        "nodes": plan.hosts,
        "hostfile_names": plan.hostfile_names(),
        "network": plan.network.to_json() if plan.network else None,
        "ppn": plan.ppn,
        "slots_syntax": plan.launcher.slots_syntax,
        "env": plan.env,
        "setvars": plan.setvars,
        "python": plan.python,
        "project_dir": plan.project_dir,
        "allocator": plan.allocator,
        "allocator_candidates": allocator_candidates(plan),
        "iomp_candidates": iomp_candidates(plan),
        "launcher_pins": plan.launcher.pins_ranks,
        # ssh.sh runs on the head node, with the run's own ssh_config: each node as the
        # inventory says (its address, port, user, key), whatever the head's own are.
        "ssh_argv": ["ssh", "-F", plan.path("ssh_config")],
        "launcher_env": plan.launcher.env(plan.spec()),
        "command": plan.command(),
        "mpirun_dir": posixpath.dirname(plan.mpirun),
    }


def _render(env: jinja2.Environment, name: str, context: dict[str, Any]) -> str:
    try:
        return env.get_template(f"{name}.j2").render(context)
    except jinja2.TemplateError as exc:
        where = f"{getattr(exc, 'filename', None) or name + '.j2'}"
        line = getattr(exc, "lineno", None)
        hint = "fix the template (or remove it from cpuaccel_templates to use cpuaccel's)"
        if isinstance(exc, RenderLimit):  # too large or too slow: the bound's own fix
            hint = exc.hint
        elif "shquote" in str(exc):  # a copy of an older template
            hint = "the shell-quoting filter is named quote now: write | quote"
        raise UsageError(
            f"template {where}{':' + str(line) if line else ''}: {exc}", hint=hint
        ) from None


def render_ssh_files(
    plan: RunPlan, connect: ConnectOptions, host_keys: HostKeys | None = None
) -> dict[str, tuple[int, str]]:
    """ssh.sh, its ssh_config (one Host block a node) and the run's known_hosts (the
    keys the controller verified, none in a dry run): how the launcher reaches nodes."""
    known_hosts = plan.path("known_hosts")
    names = plan.hostfile_names()  # MPI's launcher calls ssh.sh with the hostfile's names
    config = "".join(
        openssh.ssh_config_stanza(h, connect, known_hosts, also=names.get(h.name, h.name))
        for h in plan.hosts
    )
    config += openssh.ssh_config_default(known_hosts) + openssh.ssh_config_mux(plan.run_id)
    keys = host_keys or {}
    lines = [openssh.known_hosts_line(h, keys[h.name]) for h in plan.hosts if keys.get(h.name)]
    return {
        "ssh.sh": (EXECUTABLE, _render(_environment(plan), "ssh.sh", _context(plan))),
        "ssh_config": (PLAIN, config),
        "known_hosts": (PLAIN, "".join(lines)),
    }


def render_hostfile(plan: RunPlan) -> str:
    """The hostfile of ``plan`` alone (a detached run's head keeps each node's line)."""
    return _render(_environment(plan), "hostfile", _context(plan))


def render_launch(plan: RunPlan) -> str:
    """launch.sh of ``plan`` alone (a detached run's head keeps one a count of nodes)."""
    return _render(_environment(plan), "launch.sh", _context(plan))


def render_job_files(
    plan: RunPlan,
    connect: ConnectOptions,
    host_keys: HostKeys | None = None,
    *,
    ssh_files: bool = True,
) -> dict[str, tuple[int, str]]:
    """name -> (mode, text) of every file of the run, as the nodes get them.

    ``ssh_files=False`` (a dry run) leaves out ssh.sh and its ssh_config: a host without
    ansible_port or ansible_user is looked up in ~/.ssh/config through Fabric, whose
    import (with paramiko's) is slow, and a dry run shows neither."""
    env = _environment(plan)
    context = _context(plan)
    files: dict[str, tuple[int, str]] = {}
    for name, mode in (
        ("hostfile", PLAIN),
        ("env.sh", PLAIN),
        ("rank.sh", EXECUTABLE),
        ("launch.sh", EXECUTABLE),
    ):
        files[name] = (mode, _render(env, name, context))
    if ssh_files and plan.launcher.name != "slurm":  # srun reaches the nodes: no ssh
        files.update(render_ssh_files(plan, connect, host_keys))
    if plan.secret_env:
        lines = [f"export {k}={shlex.quote(v)}\n" for k, v in plan.secret_env.items()]
        files["secret.env"] = (PRIVATE, "".join(lines))
    return files


_NOT_OURS = "move that run folder away: cpuaccel did not write that run.json"


@dataclass
class RunDir:
    """The controller's copy: runs/<id>/ with the rendered files, logs and the record."""

    path: Path

    @classmethod
    def create(cls, base: Path, plan: RunPlan, files: dict[str, tuple[int, str]]) -> RunDir:
        path = base / plan.run_id
        # It exists only for an id given from outside (CPUACCEL_RUN_ID: `cpuaccel
        # submit` wrote its batch script there; jobs/given_id.py checked it): a
        # generated id is new.
        path.mkdir(parents=True, exist_ok=True, mode=FOLDER)
        path.chmod(FOLDER)  # whatever the umask
        run_dir = cls(path)
        for name, (mode, text) in files.items():
            if name not in SECRET_FILES:  # secrets stay off the controller's disk and records
                run_dir.write(name, text, mode)
        run_dir.write("command.txt", shlex.join(plan.command()) + "\n")
        return run_dir

    def write(self, name: str, text: str, mode: int = PLAIN) -> None:
        """A file of the run, created with ``mode`` (never readable by others)."""
        target = self.path / name
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        target.chmod(mode)

    def record(self, **fields: Any) -> None:
        """Merge fields into run.json (no secrets: callers pass names, never values)."""
        target = self.path / "run.json"
        try:
            data = read_file(target) or {}
            if not isinstance(data, dict):
                raise Refused("not a JSON object")
        except Refused as exc:
            raise UsageError(f"{target}: not read: {exc}", hint=_NOT_OURS) from None
        data.update(fields, updated=time.time())
        self.write("run.json.tmp", json.dumps(data, indent=2, default=str) + "\n")
        (self.path / "run.json.tmp").replace(target)

    def record_start(self, plan: RunPlan, *, detached: bool, inventory: str | None) -> None:
        """run.json as a job starts: what ran where, and how later verbs (stop, ps, logs,
        fetch) reach its head again without -i."""
        self.record(
            run_id=plan.run_id,
            hosts=[h.name for h in plan.hosts],
            ppn=plan.ppn,
            world=plan.world,
            launcher=plan.launcher.name,
            command=plan.command(),
            env_names=sorted(plan.env),
            secret_names=sorted(plan.secret_env),  # names only: the values stay on the nodes
            started=time.time(),
            detached=detached,
            head=plan.head.name,
            head_run_dir=plan.run_dir,
            inventory=inventory,
            hostnames=plan.hostnames,
            master_port=int(port) if (port := plan.env.get("MASTER_PORT", "")).isdigit() else None,
        )

    def log(self, name: str) -> Path:
        """The path of a log of the run, created private (0600) if it is new."""
        path = self.path / name
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, PLAIN))
        return path

    def forget_secrets(self) -> None:
        """Remove secret.env where the controller's run folder is the nodes' one too (a
        run on this machine): the job has ended, and secrets must not stay on disk."""
        for name in SECRET_FILES:
            with contextlib.suppress(FileNotFoundError):
                (self.path / name).unlink()
