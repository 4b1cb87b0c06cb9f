"""Where a sync writes on each node: ``--dest`` templated with the host's variables.

The text is checked before any connection, so that a plainly bad destination (relative,
a top-level folder, the workdir) stops the whole sync early. That check cannot know what
``~``, ``..`` or a link mean on the node: the node's own verdict on the resolved path
(cpuaccel.node.destination, asked of every node before any is changed) is what counts,
and its refusal is ``DestinationRefused``.
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence

from cpuaccel.errors import UsageError
from cpuaccel.inventory.host import Host

FIX = "sync into a folder of its own, e.g. --dest '{{ cpuaccel_workdir }}/project'"


class DestinationRefused(UsageError):
    """A node resolved ``--dest`` to a folder a sync must never own (exit 64)."""

    def __init__(self, host: str, dest: str, reason: str) -> None:
        super().__init__(
            f"{host}: --dest resolves to {dest} on the node: refusing to sync there ({reason})",
            hint=FIX,
        )
        self.host = host
        self.dest = dest


def raise_refusals(answers: Sequence[object]) -> None:
    """Raise the nodes' refusals of their destinations, if any, as one error."""
    refused = [a for a in answers if isinstance(a, DestinationRefused)]
    if refused:
        first = refused[0]
        if len(refused) > 1:
            others = ", ".join(exc.host for exc in refused[1:])
            first.message += f"; {others} refuse(s) theirs too"
        raise first


def _normpath(path: str) -> str:
    if path == "~" or path.startswith("~/"):
        # "~" is a name for the node to expand: "~/../../etc" must not become "../etc"
        # (which the node would read from its login folder)
        rest = posixpath.normpath(path[2:].lstrip("/") or ".")
        return "~" if rest == "." else "~/" + rest
    path = posixpath.normpath(path)
    # normpath keeps a leading "//" (POSIX leaves its meaning open); Linux reads it as "/"
    return "/" + path.lstrip("/") if path.startswith("//") else path


def _rendered(host: Host, template: str) -> str:
    """``template`` rendered with the host's variables (Jinja2 is imported only here: a
    plain path, with none of Jinja's delimiters, which all open with "{", is itself)."""
    from cpuaccel import templating

    context = {**host.vars, "cpuaccel_workdir": host.workdir, "inventory_hostname": host.name}
    try:  # sandboxed, as playbooks are: an expression must not reach Python's internals
        return templating.render_text(template, context)
    except templating.TemplateError as exc:
        usual = "use variables the inventory defines, e.g. {{ cpuaccel_workdir }}/project"
        raise UsageError(  # a size or time bound's own fix, else the usual mistake's
            f"--dest {template!r} on {host.name}: {exc.message}", hint=exc.hint or usual
        ) from None


def render_dest(host: Host, template: str) -> str:
    """The destination on one host, templated with its variables and checked."""
    dest = _rendered(host, template) if "{" in template else template
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
            hint=FIX,
        )
    if dest == workdir or workdir.startswith(dest + "/"):
        # A sync owns its destination: --delete would empty the workdir of runs and other
        # projects, and even without it a file where a folder was replaces the folder.
        raise UsageError(
            f"--dest {dest!r} on {host.name} is the workdir {workdir} or a folder above it: "
            "refusing to sync there (runs, other projects)",
            hint="sync into a folder below it, e.g. --dest '{{ cpuaccel_workdir }}/project'",
        )
    return dest
