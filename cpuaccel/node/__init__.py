"""What runs on the nodes: stdlib-only parts, bundled into the programs that ship.

A node needs nothing but a Python 3.8+: a program's source travels over the connection
each time (cpuaccel.connectors.programs runs it). The parts are ordinary modules here,
tested and type-checked one by one:

  common      which, safe new and atomic writes and their temporary-file marker, the
              dist-info scan
  boundedjson JSON read within bounds (depth, size): every part that reads JSON from a
              file or a message, and the controller's cpuaccel.jsonsource
  facts       the fact probe (``cpuaccel check``, run's preflight, the playbook's facts),
              with netif (the node's interfaces and routes, from netlink)
  tree        the sync receiver: scan a destination, apply a change (``cpuaccel sync``),
              with destination (the node's verdict on where a sync may write),
              nofollow (paths reached by descriptors, never through a link),
              entries (how an entry is described, a tree hashed: the controller's too)
              and unfinished (a destination the sync made, until it is verified)
  treesession the sync receiver kept open for a whole sync: ``tree``'s modes as
              requests on one channel
  jobctl      a run's files and processes on a node (``cpuaccel run``), with runfiles
              (reading a run's files: ``ps``, ``logs``, ``fetch``) and mux (the head's
              ssh masters of a run: made, ended, stale ones removed)
  supervisor  a run's one attempt loop and its restart rule (``--max-restarts``), the
              controller's for a foreground run, the head's for a detached one, with
              checkpoints (the newest checkpoint complete on every node), progress
              (``--hang-timeout``: each rank's progress, its stacks on a hang) and
              rendezvous (``--rendezvous-timeout``: which ranks joined)
  detached    a detached run on its head (``run --detach``, ``cpuaccel stop``)
  prelaunch   run's fact probe and look at the project's copy in one interpreter; with
              ``--keep``, then the run's ``jobctl`` requests on the same channel (with
              jobctl)
  relay       one node's part of a broadcast: keep a stream of files and pass it on to
              the next nodes (cpuaccel.connectors.broadcast)
  netprobe    the network doctor's part on a node: listen where the job's peers will
              connect, connect where the job will, and say what each connection met
              (cpuaccel.network.doctor)
  agent       the playbook agent's request loop, with its modules in moduleutil, files,
              pep440, pip and setvars (``cpuaccel provision``)

The programs are named after the part whose ``main()`` they run: ``facts``, ``tree``,
``jobctl``, ``detached``, ``prelaunch`` (one request each), ``treesession`` and
``agent``, ``relay`` and ``netprobe`` (resident).
``program(name)`` bundles that part with the parts it imports, and no other: the fact
probe, for one, carries ``common`` and nothing of the agent. On the node each part becomes
the module it is here, so the parts import each other as usual.

A new node-side operation is a function in the part of the program that needs it,
reached by a new operation word in that part's ``main()``, and called from the
controller as ``programs.call(conn, PROGRAM, [WORD, ARG...], payload, what=...)``; a
new part needs nothing more than its imports (stdlib, or ``from cpuaccel.node.x``).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

PROGRAMS = (
    "facts",
    "tree",
    "treesession",
    "jobctl",
    "agent",
    "detached",
    "prelaunch",
    "relay",
    "netprobe",
)
_HERE = Path(__file__).resolve().parent
# A part's imports of other parts, type-only ones included: keep those to parts that
# the importing part needs anyway.
_IMPORT = re.compile(r"^\s*from cpuaccel\.node\.(\w+) import", re.MULTILINE)


def _parts(name: str, order: list[str]) -> list[str]:
    """``name`` and what it imports, each after what it imports (depth first)."""
    if name not in order:
        for needed in _IMPORT.findall((_HERE / f"{name}.py").read_text()):
            _parts(needed, order)
        order.append(name)
    return order


def parts(name: str) -> list[str]:
    """The parts program ``name`` carries, in the order they run."""
    if name not in PROGRAMS:
        raise ValueError(f"no node program {name!r}; there are {', '.join(PROGRAMS)}")
    return _parts(name, [])


@functools.cache
def program(name: str) -> bytes:
    """The source of program ``name``: a short loader with its parts as text.

    Each part is compiled under its own file name (a traceback names it) and registered
    as its module, so that its ``from cpuaccel.node.x import`` finds the part carried;
    any other cpuaccel import fails, rather than load a node's own (other) cpuaccel.
    """
    sources = [(part, (_HERE / f"{part}.py").read_text()) for part in parts(name)]
    lines = [
        f"# cpuaccel's node program {name!r}, bundled by cpuaccel.node.program()",
        "import sys",
        "sys.modules['cpuaccel'] = None",
        f"for _part, _source in {sources!r}:",
        "    _module = sys.modules['cpuaccel.node.' + _part] = type(sys)('cpuaccel.node.' + _part)",
        "    exec(compile(_source, 'cpuaccel/node/' + _part + '.py', 'exec'), _module.__dict__)",
        f"sys.modules['cpuaccel.node.{name}'].main()",
    ]
    return ("\n".join(lines) + "\n").encode()
