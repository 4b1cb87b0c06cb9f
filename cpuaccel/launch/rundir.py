"""RunDir: the rendered files of one job, on the controller and on every node.

Everything a job runs is rendered from Jinja templates (templates/*.j2, or the user's
copies in ``cpuaccel_templates``) into ``runs/<id>/`` on the controller, with the exact
command, and copied to ``{{cpuaccel_workdir}}/runs/<id>/`` on every node. Secrets go to
the nodes only (secret.env, mode 0600), never into the controller's records.
"""

from __future__ import annotations

import json
import os
import posixpath
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from cpuaccel.connectors import openssh
from cpuaccel.connectors.base import ConnectOptions
from cpuaccel.connectors.commandline import quote
from cpuaccel.errors import UsageError
from cpuaccel.launch.plan import RunPlan, allocator_candidates, iomp_candidates
from cpuaccel.resources import data_dir

EXECUTABLE = 0o755
PRIVATE = 0o600
PUBLIC = 0o644


def _environment(plan: RunPlan) -> jinja2.Environment:
    folders = [str(data_dir("templates"))]
    if plan.templates:
        custom = os.path.expanduser(plan.templates)
        if not os.path.isdir(custom):
            raise UsageError(
                f"cpuaccel_templates is {custom}, which is not a folder",
                hint="point it at a folder holding your copies of templates/*.j2",
            )
        folders.insert(0, custom)
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(folders),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["quote"] = quote  # the playbooks' filter, under Ansible's name
    return env


def render_job_files(plan: RunPlan, connect: ConnectOptions) -> dict[str, tuple[int, str]]:
    """name -> (mode, text) of every file of the run, as the nodes get them."""
    env = _environment(plan)
    context: dict[str, Any] = {
        "run_id": plan.run_id,
        "run_dir": plan.run_dir,
        "head": plan.head.name,
        "nodes": plan.hosts,
        "ppn": plan.ppn,
        "slots_syntax": plan.launcher.slots_syntax,
        "env": plan.env,
        "setvars": plan.setvars,
        "python": plan.python,
        "project_dir": plan.project_dir,
        "allocator": plan.allocator,
        "allocator_candidates": allocator_candidates(plan),
        "iomp_candidates": iomp_candidates(plan),
        # ssh.sh runs on the head node: the connectors' OpenSSH argv says how to reach a
        # node (the function itself, not a connector: that would import paramiko, which
        # costs a third of a second in a dry run that connects nowhere).
        "ssh_argv": openssh.ssh_argv(plan.head, connect),
        "launcher_env": plan.launcher.env(plan.spec()),
        "command": plan.command(),
        "mpirun_dir": posixpath.dirname(plan.mpirun),
    }
    files: dict[str, tuple[int, str]] = {}
    for name, mode in (
        ("hostfile", PUBLIC),
        ("env.sh", PUBLIC),
        ("rank.sh", EXECUTABLE),
        ("ssh.sh", EXECUTABLE),
        ("launch.sh", EXECUTABLE),
    ):
        try:
            files[name] = (mode, env.get_template(f"{name}.j2").render(context))
        except jinja2.TemplateError as exc:
            where = f"{getattr(exc, 'filename', None) or name + '.j2'}"
            line = getattr(exc, "lineno", None)
            hint = "fix the template (or remove it from cpuaccel_templates to use cpuaccel's)"
            if "shquote" in str(exc):  # a copy of an older template
                hint = "the shell-quoting filter is named quote now: write | quote"
            raise UsageError(
                f"template {where}{':' + str(line) if line else ''}: {exc}", hint=hint
            ) from None
    if plan.secret_env:
        lines = [f"export {k}={shlex.quote(v)}\n" for k, v in plan.secret_env.items()]
        files["secret.env"] = (PRIVATE, "".join(lines))
    return files


@dataclass
class RunDir:
    """The controller's copy: runs/<id>/ with the rendered files, logs and the record."""

    path: Path

    @classmethod
    def create(cls, base: Path, plan: RunPlan, files: dict[str, tuple[int, str]]) -> RunDir:
        path = base / plan.run_id
        path.mkdir(parents=True, exist_ok=False)
        for name, (mode, text) in files.items():
            if mode == PRIVATE:
                continue  # secrets stay off the controller's disk and records
            (path / name).write_text(text)
            (path / name).chmod(mode)
        (path / "command.txt").write_text(shlex.join(plan.command()) + "\n")
        return cls(path)

    def record(self, **fields: Any) -> None:
        """Merge fields into run.json (no secrets: callers pass names, never values)."""
        target = self.path / "run.json"
        data: dict[str, Any] = json.loads(target.read_text()) if target.exists() else {}
        data.update(fields, updated=time.time())
        tmp = target.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
        tmp.replace(target)

    def log(self, name: str) -> Path:
        return self.path / name
