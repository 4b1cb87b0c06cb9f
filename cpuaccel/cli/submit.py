"""``cpuaccel submit``: queue a training run as a Slurm batch job, print its ids, return.

The batch script (slurm/batch.py, templates/sbatch.sh.j2) runs ``cpuaccel run`` inside
the allocation under the run id printed here, so that ``ps``, ``logs``, ``stop`` and
``report`` know the run by that id from the moment it is queued.
"""

from __future__ import annotations

import os
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from cpuaccel import ui
from cpuaccel.api.keywords import FlagValues
from cpuaccel.api.script import check_script_kind
from cpuaccel.cli.options import bundled, setting_options
from cpuaccel.config.kinds import Switch
from cpuaccel.config.project import ProjectConfig
from cpuaccel.config.project_choice import discover_config
from cpuaccel.config.settings import SUBMIT, Entry, for_verb
from cpuaccel.errors import UsageError
from cpuaccel.history.records import runs_folder
from cpuaccel.jobs.plan import Script, compile_here, new_run_id
from cpuaccel.slurm import batch
from cpuaccel.ui import escape

EPILOG = """\b
Examples:
  cpuaccel submit --nodes 4 --ppn 2 train.py --epochs 3
  cpuaccel submit -p cpu --time 2:00:00 --account ml --nodes 2 train.py
  cpuaccel submit --nodes 2 --sbatch-arg=--mem=8G --sbatch-arg=--exclusive train.py
  cpuaccel submit --nodes 2 --dry-run train.py     # print the batch script only
  cpuaccel submit --nodes 2 --json train.py | jq -r .job_id
  cpuaccel submit --nodes 2 --max-restarts 3 --mixed-precision fp32 --env HF_TOKEN train.py

\b
{run_options}

\b
Then: cpuaccel ps (Slurm's state and the run's), cpuaccel logs -f RUN, cpuaccel stop RUN
(scancel, verified), cpuaccel report runs/RUN.
Defaults for -p, --time, --account and --sbatch-arg come from cpuaccel.yaml:
  slurm: {partition: cpu, time: "2:00:00", account: ml, sbatch_args: [--mem=8G]}
Run it from the project folder, on a machine with Slurm's client commands; the nodes
must see the project folder and this Python at the same paths (a shared filesystem).

\b
Exit codes: 0 queued (or the script printed); 64 bad input (nothing queued);
69 sbatch failed or did not answer.
"""


def _flag(check: Any, flag: str, value: Any) -> Any:
    """A flag's value through its check; a bad one is one line naming the flag."""
    try:
        return check(value)
    except ValueError as exc:
        raise UsageError(f"{flag} {value!r}: {exc}", hint="see 'cpuaccel submit --help'") from None


@dataclass(frozen=True)
class Allocation:
    """What the job asks Slurm for, as submit's flags give it: -N nodes, --ppn ranks a
    node, -p, --time, -A and each --sbatch-arg (unchecked yet: ``_settings``)."""

    nodes: int
    ppn: int
    partition: str | None
    time_limit: str | None
    account: str | None
    sbatch_args: tuple[str, ...]


def _settings(project: ProjectConfig | None, asked: Allocation) -> dict[str, Any]:
    """Each Slurm setting: the flag, else cpuaccel.yaml's slurm: block (checked with
    its file:line when it was read), else Slurm's own default (left out)."""
    block = dict((project.get("slurm") if project else None) or {})
    partition, time_limit, account = asked.partition, asked.time_limit, asked.account
    got: dict[str, Any] = {
        "partition": _flag(lambda v: batch.check_name(v, "partition"), "-p", partition)
        if partition is not None
        else block.get("partition"),
        "time": _flag(batch.check_time, "--time", time_limit)
        if time_limit is not None
        else block.get("time"),
        "account": _flag(lambda v: batch.check_name(v, "account"), "--account", account)
        if account is not None
        else block.get("account"),
    }
    # --sbatch-arg adds to the file's list: the file's are the project's standing ones.
    flags = [_flag(batch.check_sbatch_arg, "--sbatch-arg", a) for a in asked.sbatch_args]
    got["sbatch_args"] = tuple(block.get("sbatch_args") or ()) + tuple(flags)
    got["templates"] = block.get("templates")
    return got


def _request(
    settings: dict[str, Any],
    asked: Allocation,
    config: str | None,
    words: list[str],
    script: str,
    args: tuple[str, ...],
) -> batch.BatchRequest:
    run_id = new_run_id()
    nodes, ppn = asked.nodes, asked.ppn
    command = [sys.executable, "-m", "cpuaccel", "run", "--nodes", str(nodes), "--ppn", str(ppn)]
    if config:
        command += ["--config", os.path.abspath(config)]
    command += words  # run's own options, checked when queued (run_words)
    return batch.BatchRequest(
        run_id=run_id,
        nodes=nodes,
        ppn=ppn,
        command=[*command, script, *args],
        project_dir=str(Path.cwd().resolve()),
        partition=settings["partition"],
        time_limit=settings["time"],
        account=settings["account"],
        sbatch_args=settings["sbatch_args"],
        templates=settings["templates"],
        script=[script, *args],
    )


# ---------------------------------------------------------------- the run options submit hands on
# ``cpuaccel run``'s options that ``submit`` takes and hands to the run inside the job:
# the settings table's entries for submit (config/settings.py).
#
# Each is checked here, when the job is queued, with the same types ``run`` uses: a typo
# found only when Slurm starts the job (hours later, perhaps) would cost the user the wait.
# The values are written as single argv words into the batch script (every word quoted by
# the template), so nothing the user typed is read by a shell twice.
#
# A secret's value never enters the batch script (it is a run record, and sbatch's files
# are readable by Slurm's admins): ``--env NAME=VALUE`` with a credential's name is
# refused as run refuses it (cli/options.parse_env); ``--env NAME`` passes it by name,
# and the job reads it from the environment sbatch hands it (sbatch's default
# ``--export=ALL``).


def _handed_on() -> list[Entry]:
    """submit's entries of the table: single values in the table's order, then the
    repeatable ones (--env), as the inner run's words are written."""
    entries = for_verb(SUBMIT)
    return [e for e in entries if not _repeated(e)] + [e for e in entries if _repeated(e)]


def _repeated(entry: Entry) -> bool:
    return entry.flag is not None and entry.flag.multiple


def run_words(flags: FlagValues) -> list[str]:
    """The run options given to submit as the inner run's argv words (``--flag=value``,
    one word each), as typed: checked when they were read."""
    words: list[str] = []
    for entry in _handed_on():
        if entry.name not in flags.typed or entry.flag is None:
            continue
        typed, spelling = flags.typed[entry.name], entry.flag.spelling
        if _repeated(entry):
            words += [f"{spelling}={item}" for item in typed]
        elif isinstance(entry.kind, Switch):
            two_sided = "/" in entry.flag.decls[0]
            words += [spelling] if typed else [f"--no-{spelling[2:]}"] if two_sided else []
        else:
            words.append(f"{spelling}={typed}")
    return words


def _epilog() -> str:
    """EPILOG, with the run options submit hands on named from the table."""
    names = [e.flag.decls[0] for e in _handed_on() if e.flag is not None]
    said = (
        "run's options given here reach the run inside the job, checked now: "
        f"{', '.join(names)} (a secret only by NAME: sbatch hands the job this shell's "
        "environment, so its value never enters the batch script)."
    )
    return EPILOG.replace(
        "{run_options}", "\n".join(textwrap.wrap(said, 88, break_on_hyphens=False))
    )


@click.command(
    epilog=_epilog(),
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@click.option("-p", "--partition", metavar="NAME", help="Slurm partition.  [default: Slurm's]")
@click.option("--time", "time_limit", metavar="TIME", help="Time limit, e.g. 2:00:00 or 1-12.")
@click.option("--account", "-A", metavar="NAME", help="Account to charge.")
@click.option("--nodes", "-N", type=click.IntRange(1, 100000), required=True, help="Nodes.")
@click.option(
    "--ppn", type=click.IntRange(1, 4096), default=1, show_default=True, help="Ranks per node."
)
@click.option(
    "--sbatch-arg",
    "sbatch_args",
    multiple=True,
    metavar="--OPT=VALUE",
    help="One more sbatch option, as one word (repeatable), e.g. --sbatch-arg=--mem=8G.",
)
@click.option("--config", "config_path", metavar="FILE", help="The project file (./cpuaccel.yaml).")
@click.option("--dry-run", is_flag=True, help="Print the batch script; queue nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (ids, folder).")
@setting_options(SUBMIT)
@click.argument("script")
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@bundled("asked", Allocation, "nodes", "ppn", "partition", "time_limit", "account", "sbatch_args")
def submit_command(
    asked: Allocation,
    config_path: str | None,
    dry_run: bool,
    as_json: bool,
    script: str,
    script_args: tuple[str, ...],
    flags: FlagValues,
) -> None:
    """Queue SCRIPT as a Slurm batch job that runs `cpuaccel run` on its nodes; print the
    Slurm job id and the run id, and return."""
    if script.startswith("-"):
        raise UsageError(f"{script}: not an option of submit", hint="see 'cpuaccel submit --help'")
    handed_on = run_words(flags)
    # A module (-m) or a program (--no-python) is found by the run on the nodes.
    if not (flags.get("module") or flags.get("no_python")):
        check_script_kind(script)
        if not os.path.isfile(script):
            raise UsageError(f"{script}: no such script", hint="run submit from the project folder")
        compile_here(Script(script), Path.cwd(), script)  # before a job waits in the queue
    batch.check_project_dir(str(Path.cwd().resolve()))
    project = discover_config(config_path)
    settings = _settings(project, asked)
    request = _request(settings, asked, config_path, handed_on, script, script_args)
    run_dir = runs_folder() / request.run_id
    text = batch.render(request, run_dir)
    if dry_run:
        if as_json:
            ui.print_json({"run_id": request.run_id, "dry_run": True, "script": text})
        else:
            ui.stdout().print(escape(text.rstrip("\n")), highlight=False, soft_wrap=True)
        return
    job = batch.submit(batch.create_run_dir(runs_folder(), request.run_id), text, request)
    if as_json:
        found = {"run_id": request.run_id, "job_id": job, "run_dir": str(run_dir)}
        ui.print_json({**found, "partition": request.partition, "dry_run": False})
        return
    out = ui.stdout()
    out.print(f"Slurm job {escape(job)}, run {escape(request.run_id)}", highlight=False)
    ui.stderr().print(
        f"queued; cpuaccel logs -f {escape(request.run_id)} follows it, "
        f"cpuaccel stop {escape(request.run_id)} cancels it",
        highlight=False,
    )
