"""``cpuaccel submit``'s batch job: the script rendered, handed to ``sbatch``, recorded.

The script (``templates/sbatch.sh.j2``, or the user's copy in the ``slurm:`` block's
``templates`` folder) carries the job's ``#SBATCH`` options and runs ``cpuaccel run``
inside the allocation, with ``CPUACCEL_RUN_ID`` set to the id ``submit`` printed, from
the project folder. It is written to ``runs/<id>/sbatch.sh`` before sbatch reads it,
so the run folder holds exactly what Slurm ran; the batch output goes beside it.

What ``cpuaccel submit`` hands to ``sbatch``, checked before anything is written.

Each value ends up on a ``#SBATCH`` line of the batch script, which sbatch reads with
its own rules (not a shell's): a newline would start a line of its own, an unquoted
``#`` starts a comment, and a leading ``-`` makes a value an option. So a partition or
account is one printable word not beginning with ``-``, ``--time`` is one of Slurm's
own forms, and ``--sbatch-arg`` may not set what cpuaccel sets itself. Every check
raises ValueError with the reason; the flag's or the file's caller adds where.
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
from cpuaccel.templating import RenderLimit, file_environment

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
    ``\\`` and ``"`` backslash-escaped. A newline is refused: nothing can continue a
    line."""
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
        fix = "fix your sbatch.sh.j2 (or remove it from the templates folder)"
        raise UsageError(
            f"template {where}: {exc}",
            hint=exc.hint if isinstance(exc, RenderLimit) else fix,
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
        if not holds(request.sbatch_args):  # the user's own hold
            commands.run(["scontrol", "release", job])
        return job
    except BaseException:
        if job is not None:
            with contextlib.suppress(SlurmError):
                commands.run(["scancel", job])
        shutil.rmtree(run_dir, ignore_errors=True)
        raise


# ---------------------------------------------------------------- sbatch's options, checked
# Slurm's --time forms (sbatch(1)): MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS.
_TIME = re.compile(
    r"\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d{1,2}|\d+-\d{1,2}:\d{1,2}|\d+-\d{1,2}:\d{1,2}:\d{1,2}"
)
TIME_FORMS = "MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (e.g. 2:00:00)"
_UNLIMITED = ("UNLIMITED", "INFINITE")

# sbatch options that cpuaccel's own script sets (or that would break `submit`), long
# spelling -> what to do instead. Short spellings map to these below.
OWNED: dict[str, str] = {
    "--nodes": "use submit --nodes",
    "--ntasks": "use submit --nodes and --ppn",
    "--ntasks-per-node": "use submit --ppn",
    "--output": "the batch output goes to runs/<id>/slurm-<job>.out",
    "--error": "the batch output goes to runs/<id>/slurm-<job>.out",
    "--chdir": "the job runs from the project folder (where submit is run)",
    "--job-name": "the job is named cpuaccel-<run id>, so that squeue shows the run",
    "--partition": "use submit -p/--partition",
    "--time": "use submit --time",
    "--account": "use submit --account",
    "--parsable": "submit reads the job id itself",
    "--wrap": "the batch script is cpuaccel's (templates/sbatch.sh.j2)",
    "--array": "a submitted run is one job",
    "--wait": "submit returns once the job is queued; follow it with cpuaccel logs -f",
}
_SHORT = {
    "-N": "--nodes",
    "-n": "--ntasks",
    "-o": "--output",
    "-e": "--error",
    "-D": "--chdir",
    "-J": "--job-name",
    "-p": "--partition",
    "-t": "--time",
    "-A": "--account",
    "-a": "--array",
    "-W": "--wait",
}
# sbatch's short options that take a value (Slurm's src/common/slurm_opt.c: -k's is
# optional). getopt reads "-vHN9" as -v, -H, -N 9: letters without a value can be
# grouped in one word, and the first letter that takes one takes the rest of the word.
_TAKES_VALUE = frozenset("ABCDFGJLMNSabcdeikmnopqtwx")


def check_time(value: Any) -> str:
    """A Slurm time limit, as written (``2:00:00``, ``1-12``, ``30``, ``UNLIMITED``)."""
    text = value if isinstance(value, str) else str(value) if isinstance(value, int) else None
    if text is None or isinstance(value, bool):
        raise ValueError(f"must be a time limit, {TIME_FORMS}; got {value!r}")
    if text.upper() in _UNLIMITED:
        return text.upper()
    if not _TIME.fullmatch(text):
        raise ValueError(f"{text!r} is not a Slurm time limit: use {TIME_FORMS}")
    return text


def check_name(value: Any, what: str) -> str:
    """A partition or account name: one printable word, not beginning with ``-``."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a name, got {value!r}")
    if value.startswith("-"):
        raise ValueError(f"{what} {value!r} begins with '-', which sbatch takes as an option")
    bad = next((c for c in value if not c.isprintable() or c.isspace()), None)
    if bad is not None:
        raise ValueError(f"{what} {value!r} holds {bad!r}; a Slurm {what} is one word")
    return value


def short_options(word: str) -> list[str]:
    """The short options a word of one or more (``-vHN9``) spells, as sbatch's getopt
    reads it: ``["-v", "-H", "-N"]``, the value (``9``) left out. A letter sbatch does
    not know is read as one without a value, so that the letters after it are looked
    at too; an option spelling ``-`` or ``--`` spells none."""
    if not word.startswith("-") or word.startswith("--"):
        return []
    options: list[str] = []
    for letter in word[1:]:
        options.append(f"-{letter}")
        if letter in _TAKES_VALUE:
            break
    return options


def owned_option(word: str) -> tuple[str, str] | None:
    """The cpuaccel-owned sbatch option that ``word`` sets, if any: as spelled in it
    (``-N`` of ``-HN9``, ``--out``), and its long name."""
    if word.startswith("--"):
        name = word.split("=", 1)[0]
        matches = [o for o in OWNED if o.startswith(name) and len(name) > 3]
        # sbatch takes unambiguous prefixes (--out for --output): so does this check.
        long = name if name in OWNED else matches[0] if len(matches) == 1 else None
        return (name, long) if long is not None else None
    return next(((o, _SHORT[o]) for o in short_options(word) if o in _SHORT), None)


def check_sbatch_arg(value: Any) -> str:
    """One ``--sbatch-arg``: a single sbatch option word (``--mem=4G``,
    ``--exclusive``, ``--constraint=skylake``, ``-vc2``), setting nothing that
    cpuaccel sets, in a group of short options too."""
    if not isinstance(value, str) or not value.startswith("-"):
        raise ValueError(f"{value!r} is not an sbatch option: give it as --name=value")
    bad = next((c for c in value if not c.isprintable()), None)
    if bad is not None:
        raise ValueError(f"{value!r} holds {bad!r}: an sbatch option is one line")
    owned = owned_option(value)
    if owned is not None:
        spelled, long = owned
        named = "" if spelled == long else f" ({long})"
        raise ValueError(
            f"{value} sets {spelled}{named}, an option set by cpuaccel submit: {OWNED[long]}"
        )
    return value


def holds(args: tuple[str, ...]) -> bool:
    """Whether the user's own sbatch options ask for a held job (``--hold``, ``-H``,
    also in a group such as ``-vH``): submit then leaves it held."""
    return any(a == "--hold" or "-H" in short_options(a) for a in args)


class BlockError(ValueError):
    """A bad value in the ``slurm:`` block: ``key`` names its own line."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


BLOCK_KEYS = {
    "partition": "the partition (like submit -p)",
    "time": "the time limit (like submit --time), e.g. 2:00:00",
    "account": "the account to charge (like submit --account)",
    "sbatch_args": "more sbatch options, a list (like submit --sbatch-arg), e.g. [--mem=8G]",
    "templates": "a folder with your own copy of sbatch.sh.j2, relative to this file",
}


def check_block(value: Any) -> dict[str, Any]:
    """cpuaccel.yaml's ``slurm:`` mapping, each value checked as its flag is."""
    if not isinstance(value, dict):
        raise ValueError("must be a mapping, e.g. {partition: cpu, time: '2:00:00'}")
    checked: dict[str, Any] = {}
    for key, item in value.items():
        try:
            checked[str(key)] = _check_key(str(key), item)
        except ValueError as exc:
            raise BlockError(str(key), f"{key}: {exc}") from None
    return checked


def _check_key(key: str, item: Any) -> Any:
    if key == "partition" or key == "account":
        return check_name(item, key)
    if key == "time":
        if not isinstance(item, str):
            # YAML 1.1 reads 2:00:00 unquoted as the number 7200 (base 60), and 30 as
            # 30: neither says which of Slurm's forms was meant.
            raise ValueError(f"must be quoted, e.g. time: '2:00:00' (YAML read {item!r})")
        return check_time(item)
    if key == "sbatch_args":
        words = [item] if isinstance(item, str) else item
        if not isinstance(words, list):
            raise ValueError("must be a list of sbatch options, e.g. [--mem=8G, --exclusive]")
        return [check_sbatch_arg(w) for w in words]
    if key == "templates":
        if not isinstance(item, str) or not item.strip():
            raise ValueError(f"must be a folder, got {item!r}")
        return item
    raise ValueError(f"is not a key of slurm: (known: {', '.join(BLOCK_KEYS)})")
