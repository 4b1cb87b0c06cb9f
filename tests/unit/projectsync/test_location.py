"""Where a sync writes on a node (sync/location.py): --dest rendered with the host's
variables, and the destinations refused."""

from __future__ import annotations

from typing import Any

import pytest

from cpuaccel.errors import UsageError
from cpuaccel.inventory.host import Host
from cpuaccel.projectsync.location import render_dest

pytestmark = pytest.mark.usefixtures("private_hash_cache")


WORKDIR = "/srv/cpuaccel/work"


def host(**vars: Any) -> Host:
    return Host("node7", {"cpuaccel_workdir": WORKDIR, **vars})


@pytest.mark.parametrize(
    ("template", "vars", "expected"),
    [
        ("{{ cpuaccel_workdir }}/proj", {}, f"{WORKDIR}/proj"),
        ("{{cpuaccel_workdir}}/proj/", {}, f"{WORKDIR}/proj"),
        ("/scratch/{{ inventory_hostname }}/job", {}, "/scratch/node7/job"),
        ("{{ data_root }}/x/../code", {"data_root": "/data"}, "/data/code"),
        ("~/cpuaccel/proj", {}, "~/cpuaccel/proj"),
        ("/data/{{ 'a' ~ 'b' | upper }}", {}, "/data/aB"),
    ],
)
def test_render_dest(template: str, vars: dict[str, Any], expected: str) -> None:
    assert render_dest(host(**vars), template) == expected


@pytest.mark.parametrize(
    ("template", "vars", "words"),
    [
        ("{{ cpuaccel_workdir }}/x", {"cpuaccel_workdir": "work"}, ["'work/x'", "absolute"]),
        ("proj", {}, ["not an absolute path"]),
        ("", {}, ["not an absolute path"]),
        ("/", {}, ["'/'", "top-level"]),
        ("//", {}, ["top-level"]),
        ("//srv/cpuaccel", {}, ["workdir", "above it"]),
        ("///srv//cpuaccel/work/", {}, ["workdir"]),
        ("/srv/..", {}, ["top-level"]),
        ("{{ cpuaccel_workdir }}/..", {}, ["workdir"]),
        ("/srv", {}, ["workdir"]),
        # A parent of the workdir was accepted without --delete; a sync owns its destination
        # (a file where the node has a folder replaces it), so it is refused either way.
        ("/srv/cpuaccel", {}, ["workdir"]),
        ("{{ cpuaccel_workdir }}", {}, ["workdir"]),
        ("{{ cpuaccel_workdir }}/./", {}, ["workdir"]),
        ("/data/a\nb", {}, ["newline"]),
        ("{{ name }}", {"name": "/data/a\rb"}, ["newline"]),
        ("{{ nope }}/x", {}, ["'nope' is undefined", "--dest"]),
        ("{{ cpuaccel_workdir }/x", {}, ["--dest"]),
        # Sandboxed, as playbooks are: this ran a shell command through an unsandboxed Jinja.
        ("/x/{{ cycler.__init__.__globals__.os.system('touch /tmp/pwn') }}", {}, ["unsafe"]),
        ("/x/{{ ''.__class__.__mro__[1].__subclasses__() }}", {}, ["unsafe"]),
    ],
)
def test_render_dest_refuses_bad_destinations(
    template: str, vars: dict[str, Any], words: list[str]
) -> None:
    with pytest.raises(UsageError) as err:
        render_dest(host(**vars), template)
    assert "node7" in err.value.message
    for word in words:
        assert word in err.value.message
    assert err.value.hint
