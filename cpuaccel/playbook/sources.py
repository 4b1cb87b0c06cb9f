"""Where a task's ``src`` is looked for on the controller, in Ansible's order."""

from __future__ import annotations

from pathlib import Path

from cpuaccel.resources import data_dir


def search_path(name: str, playbook_dir: Path, kind: str) -> list[Path]:
    """Candidates for ``src: name``: ``kind`` is "templates" (template) or "files" (copy).

    Like Ansible: the playbook's own ``templates/`` or ``files/`` folder, then the
    playbook's folder; then the current directory; templates also fall back to
    cpuaccel's shipped ones, so the default playbook works from an installed wheel.
    """
    path = Path(name).expanduser()
    if path.is_absolute():
        return [path]
    candidates = [playbook_dir / kind / path, playbook_dir / path, Path.cwd() / path]
    if kind == "templates":
        candidates.append(data_dir("templates") / path)
    return candidates


def find_source(name: str, playbook_dir: Path, kind: str) -> Path | None:
    for candidate in search_path(name, playbook_dir, kind):
        if candidate.exists():
            return candidate
    return None
