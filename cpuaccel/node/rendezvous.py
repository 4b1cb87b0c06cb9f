"""The rendezvous bound (``run --rendezvous-timeout``): which ranks joined the process
group, which did not, and the last network error each saw.

Used by the supervisor (node/supervisor.py), on the controller for a foreground run and
on the head for a detached one; the rank side (cpuaccel/_rendezvous.py) writes the
markers parsed here. Stdlib only, Python 3.8+.

Every rank of a ``cpuaccel run`` gets CPUACCEL_RENDEZVOUS (the bound, in seconds). Its
worker then follows torch.distributed's ``init_process_group`` and says, through the
labeller's own pipe, ``[cpuaccel] rendezvous RUN_ID STATE [TEXT]``:

- ``waiting``: it entered init_process_group;
- ``joined``: init_process_group returned (the store met, gloo's mesh connected);
- ``ready``: its first collective, a barrier closing the rendezvous, completed;
- ``error TEXT``: init_process_group or that barrier raised; TEXT is the error's first
  line (a TCPStore timeout, gloo's connectFullMesh failure).

torch's own log lines of the store and the sockets (``[E... socket.cpp:...] [c10d] The
client socket has timed out ...``) count as a rank's network error too: a rank still
retrying has said nothing else yet.

The bound's clock starts when the first rank enters the rendezvous (a script may load
its data for an hour before it calls init_process_group). When it passes, plus a few
seconds (``slack``: the ranks' own timeouts, set to the bound, fire and say why), with
a rank not ready, or when a rank's rendezvous failed and the others have had those few
seconds to say theirs, the supervisor ends the job (reason "rendezvous", exit 124) and
prints ``report``. A script that never calls init_process_group is never bound.
"""

from __future__ import annotations

import re

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MARKER = "[cpuaccel] rendezvous"
ENV = "CPUACCEL_RENDEZVOUS"  # the bound (s) in every rank; unset: not followed
DEFAULT = 120.0
STATES = ("waiting", "joined", "ready", "error")
TEXT_LIMIT = 300  # characters of one error kept: its first line is what tells
# torch's own error or warning lines of the store and its sockets (c10d's logger):
# "[E1207 13:49:53.534596492 socket.cpp:1028] [c10d] The client socket has timed out ..."
_C10D_LINE = re.compile(r"^\[[EW]\d{4} [\d:.]+ [\w.]+:\d+\] \[c10d\] (.+)$")
_NETWORK_WORDS = ("connect", "timed out", "timeout", "refused", "unreachable", "reset", "socket")


def slack(bound: float) -> float:
    """Seconds past the bound for the ranks' own timeouts to fire and say why: a tenth
    of the bound, 3 to 10 s."""
    return min(10.0, max(3.0, bound / 10))


def one_line(text: str) -> str:
    """An error's first non-empty line, printable, at most TEXT_LIMIT characters."""
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    clean = "".join(c if c.isprintable() else "?" for c in first)
    return clean[:TEXT_LIMIT]


def marker(run_id: str, state: str, text: str | None = None) -> str:
    """A marker line: ``[cpuaccel] rendezvous RUN_ID joined``, ``... error TEXT``."""
    words = [MARKER, run_id, state]
    if text is not None:
        words.append(one_line(text) or "(no message)")
    return " ".join(words)


def parse(text: str, run_id: str) -> tuple[str, str | None] | None:
    """(state, error text) of cpuaccel's rendezvous marker for this run; None for any
    other line (one naming another run, or in another form, stays the user's)."""
    if not text.startswith(MARKER + " "):
        return None
    words = text[len(MARKER) + 1 :].split(" ", 2)
    if len(words) < 2 or words[0] != run_id or words[1] not in STATES:
        return None
    if words[1] == "error":
        return ("error", one_line(words[2])) if len(words) == 3 and words[2] else None
    return (words[1], None) if len(words) == 2 else None


def network_error(text: str) -> str | None:
    """The message of torch's own log line about the store or a socket failing; None
    for any other line."""
    found = _C10D_LINE.match(text)
    if found is None or not any(w in found[1].lower() for w in _NETWORK_WORDS):
        return None
    return one_line(found[1])


class RankRendezvous:
    """What a supervisor saw of one rank's rendezvous."""

    __slots__ = ("error", "host", "rank", "state")

    def __init__(self, rank: int, host: str) -> None:
        self.rank = rank
        self.host = host  # its node's inventory name (the plan's), as reports name it
        self.state: str | None = None  # the last of STATES it said (error: the error)
        self.error: str | None = None  # the last network error it saw

    @property
    def joined(self) -> bool:
        return self.state in ("joined", "ready")

    def words(self) -> str:
        """Where it got to, in words."""
        if self.state is None:
            return "never began the rendezvous"
        if self.state == "waiting" or (self.state == "error" and not self.joined):
            return "waiting to join"
        return {"joined": "joined, its first collective unfinished", "ready": "joined"}.get(
            self.state, self.state
        )

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in ("rank", "host", "joined", "state", "error")}


class RendezvousTracker:
    """Every rank's rendezvous in one job, fed its labelled lines."""

    def __init__(self, run_id: str, bound: float, world: int, hosts: dict[int, str]) -> None:
        self.run_id = run_id
        self.bound = bound
        self.slack = slack(bound)
        self.ranks = {r: RankRendezvous(r, hosts.get(r, "?")) for r in range(world)}
        self.started: float | None = None  # when the first rank entered it
        self.failed: float | None = None  # when a rank first said its rendezvous failed
        self._complete = False  # once every rank was ready, later lines change nothing

    def line(self, rank: int, host: str, text: str, now: float) -> bool:
        """Note one labelled line of ``rank`` (on ``host``). True when it is cpuaccel's
        marker, which the caller keeps out of the user's view."""
        seen = self.ranks.get(rank)
        if seen is None:  # a rank beyond the planned world: tracked all the same
            seen = self.ranks[rank] = RankRendezvous(rank, host)
        found = parse(text, self.run_id)
        if found is None:
            if not self.complete():
                error = network_error(text)
                seen.error = error or seen.error
            return False
        state, error = found
        if self.started is None:
            self.started = now
        if state == "error":
            seen.error = error
            if not self.complete() and self.failed is None:
                self.failed = now
            if seen.state != "ready":
                seen.state = "error" if seen.state in (None, "waiting") else seen.state
        else:
            seen.state = state
        return True

    def complete(self) -> bool:
        """Whether every rank joined and finished its first collective."""
        if not self._complete:
            self._complete = all(p.state == "ready" for p in self.ranks.values())
        return self._complete

    def overdue(self, now: float) -> bool:
        """Whether the job should end for its rendezvous: begun and incomplete, and
        either the bound (and the slack) passed since it began, or a rank said its
        rendezvous failed a slack ago (the others have had time to say theirs)."""
        if self.started is None or self.complete():
            return False
        if now >= self.started + self.bound + self.slack:
            return True
        return self.failed is not None and now >= self.failed + self.slack

    def fails(self, ranks: list[int], now: float) -> bool:
        """Whether the failure of ``ranks`` is the rendezvous's, to be reported as such
        once ``overdue`` rather than at once as a rank's own: the rendezvous begun and
        incomplete, and one of them inside it (its error marker and its exit code reach
        the supervisor in either order)."""
        if self.started is None or self.complete():
            return False
        inside = any(r in self.ranks and self.ranks[r].state not in (None, "ready") for r in ranks)
        if inside and self.failed is None:
            self.failed = now
        return inside or self.failed is not None

    def missing(self) -> list[RankRendezvous]:
        return [p for p in self.ranks.values() if not p.joined]

    def report(self) -> list[str]:
        """The ranks that joined, in one line; then one line for each rank not ready:
        its node, where it got to, the last network error it saw."""
        joined = [p for p in self.ranks.values() if p.joined]
        lines = []
        if joined:
            lines.append("joined: " + ", ".join(f"rank {p.rank} ({p.host})" for p in joined))
        for p in self.ranks.values():
            if p.state != "ready":
                error = f"last network error: {p.error}" if p.error else "no network error seen"
                lines.append(f"rank {p.rank} on {p.host}: {p.words()}; {error}")
        return lines

    def to_json(self, now: float) -> dict[str, Any]:
        """status.json's "rendezvous": the bound, the seconds since it began, each rank."""
        since = None if self.started is None else round(now - self.started, 1)
        return {
            "timeout": self.bound,
            "seconds": since,
            "joined": sorted(p.rank for p in self.ranks.values() if p.joined),
            "missing": sorted(p.rank for p in self.missing()),
            "ranks": [p.to_json() for p in sorted(self.ranks.values(), key=lambda p: p.rank)],
        }
