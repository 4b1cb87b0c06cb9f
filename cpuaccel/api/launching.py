"""``cpuaccel.launch``: a training script started on the nodes, from Python.

The path is ``cpuaccel run``'s own: the keywords become the flags mapping the CLI's
options make (api/keywords.py), ``Target.settings`` settles them with the project file
and the inventory, and ``jobs.launch.launch`` runs the preflight, the sync, the launch
and the supervision. ``cli/run.py`` parses and prints around the same ``start``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from cpuaccel.api.heads import HeadOptions
from cpuaccel.api.keywords import FlagValues, flags_of_keywords
from cpuaccel.api.output import quiet_unless
from cpuaccel.api.run_handle import Run
from cpuaccel.api.script import check_script_kind, script_entry
from cpuaccel.api.target import HOST_OPTIONS, HostKeywords, Target
from cpuaccel.config.settings import RUN, LaunchSettings
from cpuaccel.errors import PreflightError, UsageError
from cpuaccel.jobs import launch as job
from cpuaccel.jobs.plan import Script
from cpuaccel.jobs.request import LaunchRequest
from cpuaccel.jobs.result import INTERRUPTED, PREFLIGHT, TERMINATED, JobReport


def launch(
    script: str | os.PathLike[str] | Sequence[str],
    *args: str,
    inventory: str | os.PathLike[str] | None = None,
    detach: bool = False,
    progress: bool = False,
    **settings: Any,
) -> Run:
    """Start ``script`` with ``args`` on the nodes, as ``cpuaccel run`` does, from the
    current folder (the project that is synced; ``runs/<id>/`` is written there).
    ``script`` may be a list of the script and its arguments, as subprocess takes it.

    ``settings`` are the run settings under their table names (docs/run.md): ``nodes``,
    ``ppn``, ``mixed_precision``, ``env`` (a mapping, or ``["HF_TOKEN"]`` to pass a
    variable by name, kept out of every record), ``max_restarts``, ``timeout``,
    ``hang_timeout``, ``module`` (``script`` is a module name), ``python``, ``workdir``
    ... and under the CLI's other spellings of them (``nproc_per_node``, ``nnodes``,
    ``master_port``...). The host keywords are the CLI's host options (``inventory``
    is ``-i``).

    With ``detach=True`` the head node supervises the job and this returns once it has
    started; otherwise this returns when the job has ended (``Run.wait()`` then gives
    its result at once). Prints nothing unless ``progress=True`` (then what
    ``cpuaccel run`` prints, the ranks' lines included).

    Returns the ``Run``. Raises ``cpuaccel.errors.UsageError`` (a bad keyword or value:
    the CLI's message and fix), ``InventoryError``/``ProjectFileError`` (a file, with
    its line), ``PreflightError`` (a node failed its checks: no job started) or
    ``HostError`` (a node could not be reached to start it). A job that starts and fails
    is no exception: its ``Run.wait()`` says how it ended.

    Ctrl-C (SIGINT) during a foreground run ends the job on every node, writes the run's
    records, then raises ``KeyboardInterrupt`` here, as ``subprocess.run`` does; SIGTERM
    does the same, then meets the caller's own SIGTERM handling (by default the process
    ends with 143). The caller's signal handlers are given back either way."""
    with quiet_unless(progress), caller_signals() as ended:
        hosts = HostKeywords.of(
            inventory, {k: settings.pop(k) for k in HOST_OPTIONS if k in settings}
        )
        target, settled, flags = settle(hosts, settings)
        project = Path.cwd().resolve()
        name, args = script_and_args(script, args)
        what = script_for(name, args, project, flags, api=True)
        report = start(request(target, settled, what, project, detach=detach))
        if report.ended_by == PREFLIGHT:
            raise PreflightError(report.error or "preflight failed", problems=report.problems)
        ended.append(report.ended_by)
        return Run.of_report(report, _head_options(hosts), project / "runs")


@contextlib.contextmanager
def caller_signals() -> Iterator[list[str]]:
    """A foreground call from Python: SIGINT raises ``KeyboardInterrupt`` for the whole
    call (the supervisor takes it over while a job runs: it ends the job, then says
    "interrupted" into the list yielded), whatever the caller had set; the caller's
    handlers are given back at the end. A job ended by SIGINT then raises
    ``KeyboardInterrupt``; one ended by SIGTERM raises SIGTERM again, under the caller's
    own handler. Outside the main thread, whose handlers they are, nothing changes."""
    ended: list[str] = []
    if threading.current_thread() is not threading.main_thread():
        yield ended
        return
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield ended
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
    if ended == [INTERRUPTED]:
        raise KeyboardInterrupt
    if ended == [TERMINATED]:
        signal.raise_signal(signal.SIGTERM)


def _head_options(hosts: HostKeywords) -> HeadOptions:
    """How the run's head is reached later (Run.status, logs, stop, fetch)."""
    inventory = os.fspath(hosts.inventory) if hosts.inventory is not None else None
    return HeadOptions(inventory, float(hosts.connect_timeout), not hosts.host_key_checking)


def settle(
    hosts: HostKeywords, settings: Mapping[str, Any]
) -> tuple[Target, LaunchSettings, FlagValues]:
    """The run settings of ``settings`` keywords on ``hosts``, settled as ``cpuaccel run``
    settles its flags (each with its source: the keyword counts as its flag), the
    Target, and the flags mapping they were settled from."""
    flags, variables = flags_of_keywords(RUN, settings)
    target = hosts.target(variables)
    return target, target.settings(flags), flags


def script_and_args(script: Any, args: Sequence[str]) -> tuple[str, tuple[str, ...]]:
    """``launch(script, *args)``'s script and arguments; ``script`` may be a list of
    both, as subprocess takes it (``["train.py", "--epochs", "3"]``)."""
    if isinstance(script, (list, tuple)):
        if args:
            raise UsageError(
                f"script={list(script)!r} and args {list(args)!r}: give the arguments once",
                hint="e.g. cpuaccel.launch(['train.py', '--epochs', '3'])",
            )
        if not script:
            raise UsageError("script=[]: no script", hint="e.g. cpuaccel.launch(['train.py'])")
        script, *rest = script
        args = tuple(rest)
    if not isinstance(script, (str, os.PathLike)):
        raise UsageError(
            f"script={script!r}: expected a path, or a list of the script and its arguments",
            hint="e.g. cpuaccel.launch('train.py', '--epochs', '3')",
        )
    return os.fspath(script), tuple(args)


def script_for(
    script: str, args: Sequence[str], project: Path, flags: Mapping[str, Any], api: bool = False
) -> Script:
    """SCRIPT as the ranks run it, checked here first (a Python file of the project,
    compiled; a module; a program with no_python). ``api``: a call from Python, whose
    fixes name its keywords."""
    if not all(isinstance(a, str) for a in args):
        raise UsageError(
            f"the script's arguments must be strings: {list(args)!r}",
            hint="e.g. cpuaccel.launch('train.py', '--epochs', '3')",
        )
    as_module, no_python = bool(flags.get("module")), bool(flags.get("no_python"))
    if not as_module:  # a module name is no file (-m config.yaml is module yaml)
        check_script_kind(script, no_python=no_python, api=api)
    return script_entry(script, tuple(args), project, as_module, no_python)


def request(
    target: Target, settings: LaunchSettings, what: Script, project: Path, **options: Any
) -> LaunchRequest:
    """The one request of a run of ``settings`` on ``target``: the nodes reached as the
    target says, the inventory kept for later verbs, the sync and the timeout the
    settings say. ``options``: the request's other fields (``detach``,
    ``ranks_to_stderr``, ``run_id``, ``extra_files``, ``show``, ``show_group``,
    ``collect``, ``require``: see ``jobs.request.LaunchRequest``). No ``run_id``: a new
    one; a call from Python never takes the id from its environment."""
    setting = target.inventory_setting
    fields = {
        "allow_sync": settings.sync.value,
        "timeout": settings.timeout.value,
        "inventory": job.inventory_path(setting.value if setting else None),
        **options,
    }
    return LaunchRequest(settings, what, project, target.connect, target.forks, **fields)


def start(request: LaunchRequest) -> JobReport:
    """The job of ``request`` started (and, unless ``request.detach``, supervised to its
    end): how it ended, or how it started."""
    return job.launch(request)
