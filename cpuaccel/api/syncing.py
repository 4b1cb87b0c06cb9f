"""Syncing a project: every node's copy made identical to the controller's, verified.

``sync_target`` pushes sources to the hosts of a resolved ``Target``; ``sync`` is the
same from Python, with the host keywords of ``target_of``. Only what differs moves, each
file reaches its path by rename, and every node checks the result against the
controller's manifest (projectsync/engine.py). Neither prints the per-node lines: that
is ``cpuaccel sync``'s (cli/sync.py).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Unpack

from cpuaccel import ui
from cpuaccel.api.keywords import check_switches
from cpuaccel.api.output import quiet_unless
from cpuaccel.api.target import HostKeywords, HostOptions, Target
from cpuaccel.errors import EXIT_NODE_FAILED, EXIT_OK, EXIT_PROBLEMS, HostError, UsageError
from cpuaccel.executor import ConnectionPool, HostResult
from cpuaccel.projectsync import engine
from cpuaccel.projectsync.ignore import check_excludes
from cpuaccel.projectsync.manifest import build
from cpuaccel.projectsync.node_result import NodeReport

Paths = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]


@dataclass(frozen=True)
class SyncResult:
    """What a sync did (with ``check``, would do): the source's manifest hash and entry
    count, and each node's result (a ``NodeReport`` as ``value``, or why there is none)."""

    manifest: str
    files: int
    results: tuple[HostResult[NodeReport], ...]
    check: bool = False

    @property
    def hosts(self) -> dict[str, HostResult[NodeReport]]:
        """Each host's result by its inventory name."""
        return {r.host.name: r for r in self.results}

    @property
    def exit_code(self) -> int:
        """``cpuaccel sync``'s exit code: 0 every node matches the source; 1 (``check``)
        some node would change; 69 a node does not match afterwards or is unreachable."""
        if any(not r.ok for r in self.results):
            return EXIT_NODE_FAILED
        if all(r.value is not None and r.value.in_sync for r in self.results):
            return EXIT_OK
        return EXIT_PROBLEMS if self.check else EXIT_NODE_FAILED

    @property
    def ok(self) -> bool:
        """Every node reached and matching the source (with ``check``: nothing would
        change)."""
        return self.exit_code == EXIT_OK

    def to_json(self) -> dict[str, Any]:
        """What ``cpuaccel sync --json`` prints."""
        return {
            "manifest": self.manifest,
            "files": self.files,
            "hosts": {
                r.host.name: {
                    "status": r.status.value,
                    "error": r.error,
                    "seconds": round(r.seconds, 3),
                    **(r.value.to_json() if r.value else {}),
                }
                for r in self.results
            },
        }


def default_dest(sources: Sequence[str]) -> str:
    """``{{ cpuaccel_workdir }}/NAME``: NAME the one source folder's, else this folder's."""
    if len(sources) == 1 and os.path.isdir(sources[0]):
        name = os.path.basename(os.path.abspath(sources[0]))
    else:
        name = os.path.basename(os.getcwd())
    return "{{ cpuaccel_workdir }}/" + (name or "project")


def sync_target(
    target: Target,
    sources: Sequence[str] = (),
    *,
    dest: str | None = None,
    delete: bool = False,
    exclude: Sequence[str] = (),
    copy_links: bool = False,
    check: bool = False,
) -> SyncResult:
    """Sync ``sources`` (default: this folder) to the hosts of ``target``, with a progress
    bar on a terminal. A node that fails or is unreachable is a result, not an exception;
    a bad source, pattern or destination raises before any node is changed."""
    paths = list(sources) or ["."]
    check_excludes(exclude)
    # The project file's excludes, then the call's own: both apply.
    from_project = (target.project.get("exclude") if target.project else None) or []
    # Hashing is left to the engine, which starts the nodes' connections first.
    excludes = [*from_project, *exclude]
    source = build(paths, excludes=excludes, copy_links=copy_links, defer_hashing=True)
    options = engine.SyncOptions(dest or default_dest(paths), delete, check, copy_links)
    connect = replace(target.connect, keep=True)
    with ConnectionPool(connect) as pool:
        with ui.progress("syncing", len(target.hosts)) as tracker:
            results = engine.sync(
                target.hosts,
                source,
                options,
                forks=target.forks,
                connect=connect,
                pool=pool,
                listen=engine.SyncListeners(
                    note=lambda line: ui.stderr().print(f"broadcast: {ui.escape(line)}"),
                    progress=tracker.transfer("broadcast"),
                    on_result=lambda r: tracker.advance(r.host.name),
                ),
            )
        _end_leftovers(results, pool, check)
    return SyncResult(source.hash, len(source.entries), tuple(results), check)


def _end_leftovers(
    results: Sequence[HostResult[NodeReport]], pool: ConnectionPool, check: bool
) -> None:
    """The processes a node still holds of a run this project records as ended (a node
    lost mid-run keeps its ranks until it is reached again) are ended, and said; with
    ``check`` they are only said."""
    found = [r for r in results if r.ok and r.value is not None and r.value.runs]
    if not found:
        return
    from pathlib import Path

    from cpuaccel.history.records import RUNS
    from cpuaccel.jobs.teardown import end_leftovers, ended_runs

    runs = Path.cwd() / RUNS
    for r in found:
        assert r.value is not None
        if check:
            said = [
                f"run {run_id} has ended ({state}) but has processes left here"
                for run_id, state in ended_runs(r.value.runs, runs)
            ]
        else:
            try:
                said = end_leftovers(pool.get(r.host), r.value.runs, runs)
            except HostError as exc:
                said = [f"could not end an ended run's processes: {exc}"]
        r.value.swept = said
        for line in said:
            ui.stderr().print(f"[yellow]warning:[/] {ui.escape(r.host.name)}: {ui.escape(line)}")


# sync's own keywords, beside the host keywords (a misspelt one's closest match).
_OWN = ("sources", "dest", "delete", "exclude", "copy_links", "check", "progress")


def sync(
    inventory: str | os.PathLike[str] | None = None,
    *,
    sources: Paths = (),
    dest: str | os.PathLike[str] | None = None,
    delete: bool = False,
    exclude: str | Sequence[str] = (),
    copy_links: bool = False,
    check: bool = False,
    progress: bool = False,
    **hosts: Unpack[HostOptions],
) -> SyncResult:
    """Push the project to every node, verified, as ``cpuaccel sync`` does.

    ``sources``: a folder or files, or a list of them (default: this folder; one folder's
    contents land at ``dest``, several each under its own name); ``dest``: the folder on
    each node, Jinja2 over the host's variables (default ``{{ cpuaccel_workdir }}/NAME``);
    ``delete``: remove files the source does not have; ``exclude``: gitignore patterns
    left out (with .gitignore's, .cpuaccelignore's and the project file's);
    ``copy_links``: send what symlinks pointing outside the tree point to; ``check``:
    change nothing, report what would change. The host keywords are ``target_of``'s.
    Prints nothing unless ``progress``.

    Returns a ``SyncResult``; ``.ok`` is False when a node is unreachable or does not
    match (with ``check``: would change), which is never raised. Raises
    ``cpuaccel.errors.UsageError`` for a bad keyword, a missing source, a bad pattern or a
    destination a sync must never own (then nothing is written anywhere),
    ``SourceError`` for a bad ignore file, ``InventoryError`` or ``ProjectFileError`` for
    a wrong inventory or project file.
    """
    with quiet_unless(progress):
        paths = _paths(sources)
        if dest is not None and not isinstance(dest, (str, os.PathLike)):
            raise UsageError(f"dest={dest!r}: expected a path", hint="e.g. dest='/scratch/job'")
        patterns = _patterns(exclude)
        check_switches(delete=delete, copy_links=copy_links, check=check)
        target = HostKeywords.of(inventory, hosts, *_OWN).target()
        return sync_target(
            target,
            paths,
            dest=os.fspath(dest) if dest is not None else None,
            delete=delete,
            exclude=patterns,
            copy_links=copy_links,
            check=check,
        )


def _paths(sources: Paths) -> list[str]:
    """``sources`` as a list of paths: one path, or a list of them."""
    if isinstance(sources, (str, os.PathLike)):
        return [os.fspath(sources)]
    if isinstance(sources, Sequence) and all(isinstance(s, (str, os.PathLike)) for s in sources):
        return [os.fspath(s) for s in sources]
    raise UsageError(
        f"sources={sources!r}: expected a path or a list of paths",
        hint="e.g. sources='.', or sources=['src', 'configs']",
    )


def _patterns(exclude: str | Sequence[str]) -> list[str]:
    """``exclude`` as a list of gitignore patterns: one pattern, or a list of them."""
    if isinstance(exclude, str):
        return [exclude]
    if isinstance(exclude, Sequence) and all(isinstance(p, str) for p in exclude):
        return list(exclude)
    raise UsageError(
        f"exclude={exclude!r}: expected a gitignore pattern or a list of them",
        hint="e.g. exclude=['data/', '*.bin']",
    )
