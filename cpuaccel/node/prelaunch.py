"""The node program ``prelaunch`` (see ``cpuaccel.node``): ``cpuaccel run``'s fact probe
and its look at the node's copy of the project in ONE interpreter, rather than the
``facts`` and ``tree`` programs one after the other: each call is an sshd session and
an interpreter start on every node, which at scale compete for the same cores as the
launcher check's handshakes.

Run as ``python -c BOOT LENGTH --keep=IDLE WORKDIR SETVARS PORT [NAME...] --look DEST
[OPTION...]``: the words before ``--look`` are the fact probe's (``facts.request_of``; no
name to resolve starts with ``-``), those after it the ``tree`` program's look
(``tree.answer``). The answer is ``{"facts": ..., "look": ...}``.

With ``--keep=IDLE`` above 0 the program stays after its answer (``serve``): the run's later
requests to this node (its files written, its sweep) come on the same channel as the
``jobctl`` program's requests, one JSON line each way, rather than as a new sshd session
and interpreter each. Nothing is written before such a request: a preflight that fails
on any node ends every kept program by EOF, having changed no node. IDLE bounds the wait
for each line, the controller's heartbeats included: a program that hears nothing for
that long, and no EOF, is the agent of a controller gone unseen, and ends its run's
processes on this node (``serve``).
"""

from __future__ import annotations

import os
import sys

from cpuaccel.node.boundedjson import loads
from cpuaccel.node.facts import collect, request_of, to_json
from cpuaccel.node.jobctl import end, request
from cpuaccel.node.tree import answer

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

LOOK = "--look"
KEEP = "--keep="


def main() -> None:
    words = sys.argv[2:]  # after BOOT's LENGTH (cpuaccel.connectors.programs)
    idle, words = int(words[0][len(KEEP) :]), words[1:]  # always given: never a workdir
    cut = words.index(LOOK)
    facts = to_json(collect(request_of(words[:cut])))
    import json  # the look's answer: the tree program's JSON, as it would give it

    look = json.dumps(answer("look", words[cut + 1], words[cut + 2 :], sys.stdin.buffer))
    sys.stdout.write('{"facts":' + facts + ',"look":' + look + "}\n")
    if idle > 0:
        sys.stdout.flush()
        serve(idle)


class Silent(Exception):
    """``idle`` seconds passed with no line from the controller: no request, no heartbeat."""


def _silent(signum: int, frame: Any) -> None:
    raise Silent


def serve(idle: int) -> None:
    """Answer ``{"words": [MODE, ARG...], "payload": TEXT}`` lines as the ``jobctl`` program
    would answer MODE ARG... (its payload on stdin), until EOF (the controller is done
    with this node, or no job starts) or ``idle`` seconds without a line: the controller
    sends an empty one, a heartbeat, every few seconds while it keeps this program
    (connectors/programs.Kept). Silence, without EOF, is a controller whose session is
    gone unseen (a link cut, a node that dropped off and came back): the program then
    ends the processes of the run whose files it wrote (its CPUACCEL_RUN_ID, on this
    node) and leaves; it never waits on a controller for good."""
    import io
    import json
    import signal

    run_dir = None
    signal.signal(signal.SIGALRM, _silent)
    while True:
        signal.alarm(max(1, idle))
        try:
            line = sys.stdin.buffer.readline()  # the buffer BOOT read the source from
        except Silent:
            if run_dir is not None:
                ended = end(os.path.basename(run_dir), 2.0, run_dir)
                gone = [pid for pid, _ in ended["terminated"] + ended["killed"]]
                print(f"no word from the controller in {idle} s: ended {gone}", file=sys.stderr)
            raise SystemExit(3) from None
        finally:
            signal.alarm(0)
        if not line:
            return
        if not line.strip():  # a heartbeat
            continue
        try:
            asked = loads(line)
            payload = io.BytesIO(str(asked.get("payload", "")).encode())
            words = [str(w) for w in asked["words"]]
            result = request(words[0], words[1:], payload)
            if words[0] == "write" and len(words) > 1:  # the run is this node's now
                run_dir = words[1]
        except SystemExit as exc:  # the jobctl program's one-line refusals
            result = {"error": str(exc.code)}
        except Exception as exc:  # said to the controller, which decides
            result = {"error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()
