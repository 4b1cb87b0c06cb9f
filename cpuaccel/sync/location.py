"""Where a sync writes on each node: ``--dest`` templated with the host's variables.

Checked before any connection, so that a bad destination (relative, a top-level
folder, or one whose ``--delete`` would reach into the workdir) stops the whole sync.
"""

from __future__ import annotations

import posixpath

import jinja2

from cpuaccel.errors import UsageError
from cpuaccel.inventory.host import Host


def _normpath(path: str) -> str:
    path = posixpath.normpath(path)
    # normpath keeps a leading "//" (POSIX leaves its meaning open); Linux reads it as "/"
    return "/" + path.lstrip("/") if path.startswith("//") else path


def render_dest(host: Host, template: str, *, delete: bool) -> str:
    """The destination on one host, templated with its variables and checked."""
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False)
    context = {**host.vars, "cpuaccel_workdir": host.workdir, "inventory_hostname": host.name}
    try:
        dest = env.from_string(template).render(context)
    except jinja2.TemplateError as exc:
        raise UsageError(
            f"--dest {template!r} on {host.name}: {exc}",
            hint="use variables the inventory defines, e.g. {{ cpuaccel_workdir }}/project",
        ) from None
    if "\n" in dest or "\r" in dest or "\0" in dest:
        raise UsageError(f"--dest on {host.name} holds a newline: {dest!r}", hint="fix --dest")
    if not (dest.startswith("/") or dest.startswith("~/")):
        raise UsageError(
            f"--dest on {host.name} is {dest!r}, not an absolute path",
            hint="give an absolute path (or one below ~/), e.g. {{ cpuaccel_workdir }}/project",
        )
    dest = _normpath(dest)
    workdir = _normpath(host.workdir)
    if dest in ("/", "~") or dest.count("/") < 1 + dest.startswith("~"):
        raise UsageError(
            f"--dest on {host.name} is {dest!r}: refusing to sync into a top-level folder",
            hint="sync into a folder of its own, e.g. {{ cpuaccel_workdir }}/project",
        )
    if delete and (dest == workdir or workdir.startswith(dest + "/")):
        raise UsageError(
            f"--delete with --dest {dest!r} on {host.name} would delete inside the workdir "
            f"{workdir} (runs, other projects)",
            hint="sync into a folder below the workdir, or leave out --delete",
        )
    return dest
