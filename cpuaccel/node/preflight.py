"""The node program ``preflight`` (see ``cpuaccel.node``): ``cpuaccel run``'s fact probe
and its look at the node's copy of the project in ONE interpreter, rather than the
``facts`` and ``tree`` programs one after the other. On the 2-core test bed at 16 nodes
each call is an sshd session and an interpreter start on every node, all on the same
cores as the launcher check's handshakes.

Run as ``python -c BOOT LENGTH WORKDIR SETVARS PORT [NAME...] --look DEST [OPTION...]``:
the words before ``--look`` are the fact probe's (``facts.request_of``; no name to
resolve starts with ``-``), those after it the ``tree`` program's look (``tree.answer``).
The answer is ``{"facts": ..., "look": ...}``.
"""

from __future__ import annotations

import sys

from cpuaccel.node.facts import collect, request_of, to_json
from cpuaccel.node.tree import answer

LOOK = "--look"


def main() -> None:
    words = sys.argv[2:]  # after BOOT's LENGTH (cpuaccel.connectors.programs)
    cut = words.index(LOOK)
    facts = to_json(collect(request_of(words[:cut])))
    import json  # the look's answer: the tree program's JSON, as it would give it

    look = json.dumps(answer("look", words[cut + 1], words[cut + 2 :], sys.stdin.buffer))
    sys.stdout.write('{"facts":' + facts + ',"look":' + look + "}\n")
