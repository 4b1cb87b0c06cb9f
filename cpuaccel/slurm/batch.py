"""``cpuaccel submit``'s batch job: the script rendered, handed to ``sbatch``, recorded.

The script (``templates/sbatch.sh.j2``, or the user's copy in the ``slurm:`` block's
``templates`` folder) carries the job's ``#SBATCH`` options and runs ``cpuaccel run``
inside the allocation, with ``CPUACCEL_RUN_ID`` set to the id ``submit`` printed, from
the project folder. It is written to ``runs/<id>/sbatch.sh`` before sbatch reads it,
so the run folder holds exactly what Slurm ran; the batch output goes beside it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2

from cpuaccel.errors import UsageError
from cpuaccel.slurm import commands
from cpuaccel.slurm.commands import SlurmError
from cpuaccel.templating import file_environment

TEMPLATE = "sbatch.sh.j2"
SCRIPT = "sbatch.sh"
FOLDER = 0o700  # as jobs/rundir.py makes run folders: only the user reads them
EXECUTABLE = 0o700
PLAIN = 0o600
# What sbatch --parsable prints: the job id, then ";cluster" on a federation.
_JOB_ID = re.compile(r"(\d+)(;[A-Za-z0-9_.-]+)?")
# Words that sbatch's #SBATCH reader takes as they are (no blank, quote, backslash, #).
_PLAIN = re.compile(r"[A-Za-z0-9_.,:/=@%+-]+")


def sbatch_quote(value: Any) -> str:
    """``value`` as one word of an ``#SBATCH`` line. sbatch's own reader (not a shell)
    ends a word at a blank unless inside quotes (a backslash does not keep a blank: it
    is tested first), ends the line at an unquoted ``#``, and inside quotes keeps the
    character after a backslash. So: a plain word as it is, else in double quotes with
    ``\\`` and ``"`` backslash-escaped. Newlines are refused earlier (slurm/options.py):
    nothing can continue a line."""
    text = str(value)
    if "\n" in text or "\r" in text:
        raise ValueError(f"{text!r}: a #SBATCH value cannot hold a newline")
    if _PLAIN.fullmatch(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass(frozen=True)
class BatchRequest:
    """Everything the batch script is rendered from; the values already checked."""

    run_id: str
    nodes: int
    ppn: int
    command: list[str]  # the `cpuaccel run ...` argv the job runs
    project_dir: str
    partition: str | None = None
    time_limit: str | None = None
    account: str | None = None
    sbatch_args: tuple[str, ...] = ()
    templates: str | None = None  # a folder with the user's own sbatch.sh.j2
    script: list[str] = field(default_factory=list)  # SCRIPT ARGS, for run.json and ps

    @property
    def job_name(self) -> str:
        return f"cpuaccel-{self.run_id}"


def _environment(templates: str | None) -> jinja2.Environment:
    env = file_environment(
        templates,
        setting="slurm: templates",
        hint="point it at a folder holding your copy of templates/sbatch.sh.j2",
    )
    env.filters["sbatch_quote"] = sbatch_quote  # #SBATCH lines: sbatch's own reader
    return env


def check_project_dir(path: str) -> None:
    """A folder the batch job can run from: slurmstepd reads a backslash in --output
    as "no %j here" and drops it (the output then goes to a folder that does not
    exist), and no #SBATCH line can hold a newline."""
    bad = next((c for c in path if c == "\\" or not c.isprintable()), None)
    if bad is not None:
        raise UsageError(
            f"the project folder {path!r} holds {bad!r}, which Slurm cannot take in a "
            "batch job's --chdir and --output",
            hint="submit from a folder whose path has no backslash nor control character",
        )


def output_path(run_dir: Path) -> str:
    """sbatch --output: runs/<id>/slurm-<job id>.out; a ``%`` of the path doubled, as
    sbatch expands ``%j`` and its kin in this one option."""
    return str(run_dir).replace("%", "%%") + "/slurm-%j.out"


def render(request: BatchRequest, run_dir: Path) -> str:
    """The batch script's text."""
    context = {
        "run_id": request.run_id,
        "job_name": request.job_name,
        "nodes": request.nodes,
        "ppn": request.ppn,
        "partition": request.partition,
        "time": request.time_limit,
        "account": request.account,
        "sbatch_args": list(request.sbatch_args),
        "project_dir": request.project_dir,
        "output": output_path(run_dir),
        "run_dir": str(run_dir),
        "command": request.command,
    }
    try:
        return _environment(request.templates).get_template(TEMPLATE).render(context)
    except jinja2.TemplateError as exc:
        line = getattr(exc, "lineno", None)
        where = f"{getattr(exc, 'filename', None) or TEMPLATE}{':' + str(line) if line else ''}"
        raise UsageError(
            f"template {where}: {exc}",
            hint="fix your sbatch.sh.j2 (or remove it from the templates folder)",
        ) from None


def parse_job_id(output: str) -> str:
    """The job id of ``sbatch --parsable``'s answer; SlurmError when it is none."""
    text = output.strip()
    found = _JOB_ID.fullmatch(text)
    if found is None:
        shown = text[:80].encode("unicode_escape").decode()
        raise SlurmError(
            f"sbatch answered {shown!r}, which is not a job id",
            hint="check with squeue whether a job was queued, and scancel it if so",
        )
    return found.group(1)


def create_run_dir(runs: Path, run_id: str) -> Path:
    """runs/<id>/, private, new (a clash of ids is an error, never a shared folder)."""
    runs.mkdir(parents=True, exist_ok=True)
    path = runs / run_id
    path.mkdir(mode=FOLDER)
    path.chmod(FOLDER)
    return path


def write_private(path: Path, text: str, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    path.chmod(mode)


def submitted_record(request: BatchRequest, job_id: str) -> dict[str, Any]:
    """run.json of a submitted run, until the batch job's `cpuaccel run` adds its own
    fields (hosts, command, started ...) to it."""
    return {
        "run_id": request.run_id,
        "hosts": [],
        "ppn": request.ppn,
        "world": request.nodes * request.ppn,
        "nodes": request.nodes,
        "script": request.script,
        "detached": True,  # it runs without the terminal that submitted it
        "head_run_dir": None,
        "slurm": {
            "job_id": job_id,
            "partition": request.partition,
            "time": request.time_limit,
            "account": request.account,
            "submitted": time.time(),
        },
    }


def submit(run_dir: Path, script_text: str, request: BatchRequest) -> str:
    """Write sbatch.sh into ``run_dir`` and queue it; the Slurm job id.

    The job is queued held (``sbatch --hold``), recorded in run.json with its id, and
    only then released: the batch job's `cpuaccel run` adds to a run.json that already
    names its job, never races the first write of it. On a failure before the job is
    recorded, it is cancelled and the run folder removed: nothing is left queued."""
    script = run_dir / SCRIPT
    job: str | None = None
    try:
        write_private(script, script_text, EXECUTABLE)
        job = parse_job_id(commands.run(["sbatch", "--parsable", "--hold", str(script)]))
        record = json.dumps(submitted_record(request, job), indent=2) + "\n"
        write_private(run_dir / "run.json", record, PLAIN)
        if not any(a in ("--hold", "-H") for a in request.sbatch_args):  # the user's own hold
            commands.run(["scontrol", "release", job])
        return job
    except BaseException:
        if job is not None:
            with contextlib.suppress(SlurmError):
                commands.run(["scancel", job])
        shutil.rmtree(run_dir, ignore_errors=True)
        raise
