"""The node side of ``cpuaccel provision``: a resident, stdlib-only module runner.

It is started once per host per playbook run as ``python -c BOOT LENGTH``
(cpuaccel.connectors.programs): the program comes first on stdin, then requests, one
JSON object a line::

    {"id": 3, "module": "copy", "args": {...}, "check": false, "diff": true}

Each gets one JSON line back, in order: ``{"id": 3, "changed": ..., "failed": ...,
...}``; the first line written is ``{"ready": true, ...}``. Arguments arrive validated
and rendered by the controller. The modules follow Ansible's of the same names (command
and shell, file, copy and template, pip, stat), plus ``setvars``. In check mode
nothing changes.

The parts are ordinary modules here (tested and type-checked one by one); ``program()``
bundles them into the one program a node receives, each part compiled under its own
file name (so a traceback names it) and run in one namespace, in dependency order.
"""

from __future__ import annotations

import functools
from pathlib import Path

PARTS = ("common", "files", "pep440", "pip", "setvars", "agent")  # agent last: it runs main()


@functools.cache
def program() -> bytes:
    here = Path(__file__).resolve().parent
    parts = [
        (f"cpuaccel/playbook/node/{name}.py", (here / f"{name}.py").read_text()) for name in PARTS
    ]
    lines = [
        "# cpuaccel's playbook agent, bundled by cpuaccel.playbook.node.program()",
        f"for _name, _source in {parts!r}:",
        "    exec(compile(_source, _name, 'exec'), globals())",
    ]
    return ("\n".join(lines) + "\n").encode()
