"""How a run ends: the one list of its endings, each with the word users see, its exit
code and whether a restart may follow.

Part of cpuaccel's node package (see ``cpuaccel.node``): stdlib only, Python 3.8+. The
supervisor (node/supervisor.py) maps an attempt's reason to status.json's state, the
exit code and the restart decision from here; ``run --json``'s and ``Run.report``'s
``ended_by`` is the word; the tables of docs/cli.md and docs/api.md are
:func:`markdown`'s, checked by tests/docs.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Ending:
    word: str  # ended_by in run --json and Run.report; Outcome.reason
    state: str  # status.json's state (ps, Run.status); "" where no job started
    exit_code: int | None  # None: the first failing rank's own code
    restart: bool  # --max-restarts may start another attempt after it
    meaning: str


COMPLETED = Ending("completed", "succeeded", 0, False, "every rank exited 0")
FAILED = Ending(
    "failed",
    "failed",
    None,
    True,
    "a rank failed: the first failing rank's own exit code (a rank a signal ended: "
    "128 + the signal, 137 for SIGKILL); cpuaccel ends the other ranks (143)",
)
HANG = Ending("hang", "failed", 124, True, "`--hang-timeout`: no rank made progress")
RENDEZVOUS = Ending(
    "rendezvous", "failed", 124, True, "`--rendezvous-timeout`: the ranks did not all join"
)
TIMEOUT = Ending("timeout", "timeout", 124, False, "`--timeout` passed")
INTERRUPTED = Ending(
    "interrupted",
    "interrupted",
    130,
    False,
    "Ctrl-C (SIGINT); from Python, `KeyboardInterrupt` is raised once the records are written",
)
TERMINATED = Ending(
    "terminated", "stopped", 143, False, "SIGTERM to cpuaccel, also by `cpuaccel stop`"
)
LOST = Ending("lost", "lost", 255, True, "a node's connection was lost (the node is named)")
PREFLIGHT = Ending(
    "preflight", "", 69, False, "a node failed its checks or its sync: no job was started"
)
ERROR = Ending(
    "error",
    "",
    64,
    False,
    "bad input (64), or a node that could not be reached to start the job (69)",
)

ENDINGS = (
    COMPLETED, FAILED, HANG, RENDEZVOUS, TIMEOUT, INTERRUPTED, TERMINATED, LOST, PREFLIGHT,
    ERROR,
)  # fmt: skip
BY_WORD = {e.word: e for e in ENDINGS}
# An attempt's reason as status.json's state.
STATES = {e.word: e.state for e in ENDINGS if e.state}
RETRIED = frozenset(e.word for e in ENDINGS if e.restart)  # the reasons a restart may follow
STOPPED = frozenset((INTERRUPTED.word, TERMINATED.word))  # a signal to cpuaccel ended it


def exit_code(word: str) -> int:
    """The fixed exit code of an ending (not FAILED's, which is the rank's own)."""
    code = BY_WORD[word].exit_code
    if code is None:
        raise ValueError(f"{word}: the exit code is the failing rank's own")
    return code


def markdown() -> str:
    """The endings as the docs' table (docs/cli.md, docs/api.md)."""
    rows = [
        "| `ended_by` | state | exit code | restart | meaning |",
        "|---|---|---|---|---|",
    ]
    for e in ENDINGS:
        code = "the rank's" if e.exit_code is None else str(e.exit_code)
        state = f"`{e.state}`" if e.state else "-"
        restart = "may follow" if e.restart else "no"
        rows.append(f"| `{e.word}` | {state} | {code} | {restart} | {e.meaning} |")
    return "\n".join(rows) + "\n"
