"""A failure that every rank raises, shown once: ``[ranks 0-15 node0]`` rather than sixteen
copies of one traceback.

What the terminal shows of a foreground run passes through :class:`Folding`. A rank's
traceback (from ``Traceback (most recent call last):`` to its exception line, chained
ones included) is held until it is whole; the frames of cpuaccel's own rank wrapper
(``cpuaccel/worker.py`` and ``runpy``, which every script's traceback starts with) are
left out; tracebacks that are then identical are printed once, labelled with every rank
that raised it, when ``WINDOW`` seconds have passed since the first of them or when the
attempt ends, whichever comes first. Every other line passes straight through. The
rank logs in runs/<id>/ are written before this, and stay complete.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

HEADER = "Traceback (most recent call last):"
# The lines between two chained tracebacks (with a blank line either side).
CHAIN = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)
# Seconds a whole traceback waits for the same one from other ranks: the other ranks of
# a failing job raise within moments of each other, or are ended by the supervisor.
WINDOW = 2.0
# Seconds after an exception line within which a chained traceback ("During handling of
# the above exception ...") may follow it: Python writes them all at once.
SETTLE = 0.5
# A traceback longer than this is shown as it is, not held (a runaway rank's output).
MAX_LINES = 2000
# A frame of cpuaccel's rank wrapper: the worker, and runpy that it runs the script with.
_OWN_FRAME = re.compile(r'^  File "(?:[^"]*/cpuaccel/worker\.py|<frozen runpy>|[^"]*/runpy\.py)"')

Show = Callable[[str, "int | None", str, str], None]  # stream, rank, host, text
ShowGroup = Callable[[Sequence[int], Sequence[str], Sequence[str]], None]  # ranks, hosts, lines


def without_own_frames(lines: Sequence[str]) -> list[str]:
    """The traceback without cpuaccel's own frames: each such ``  File`` line and the
    source and caret lines under it."""
    kept: list[str] = []
    skipping = False
    for line in lines:
        if line.startswith('  File "'):
            skipping = _OWN_FRAME.match(line) is not None
            if skipping:
                continue
        elif skipping and line.startswith("    "):
            continue
        else:
            skipping = False
        kept.append(line)
    return kept


def ranks_text(ranks: Sequence[int]) -> str:
    """``0-3,8,10-11``: the ranks in order, consecutive ones as a range."""
    spans: list[list[int]] = []
    for rank in sorted(set(ranks)):
        if spans and rank == spans[-1][1] + 1:
            spans[-1][1] = rank
        else:
            spans.append([rank, rank])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def _ends(text: str) -> bool:
    """Whether ``text``, in a traceback, is its exception line (the last one)."""
    return bool(text) and not text[0].isspace() and text != HEADER and text not in CHAIN


@dataclass
class _Held:
    """A rank's traceback being read: its lines, and where its last exception line ends
    them (0 while none has come; a chained traceback may follow it)."""

    host: str
    lines: list[str]
    end: int = 0
    timer: threading.Timer | None = None


@dataclass
class _Group:
    lines: tuple[str, ...]
    ranks: list[int] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    timer: threading.Timer | None = None


class Folding:
    """``show`` (the terminal's labelled line) with identical tracebacks folded into one
    ``show_group`` (several ranks) or shown rank by rank (one)."""

    def __init__(
        self, show: Show, show_group: ShowGroup, window: float = WINDOW, settle: float = SETTLE
    ) -> None:
        self.show = show
        self.show_group = show_group
        self.window = window
        self.settle = settle
        self._held: dict[int, _Held] = {}
        self._groups: dict[tuple[str, ...], _Group] = {}
        self._lock = threading.RLock()  # lines come from a reader thread, flushes from timers

    def __call__(self, stream: str, rank: int | None, host: str, text: str) -> None:
        with self._lock:
            if rank is None or stream != "err":
                self.show(stream, rank, host, text)
                return
            held = self._held.get(rank)
            if held is None:
                if text == HEADER:
                    self._held[rank] = _Held(host, [text])
                else:
                    self.show(stream, rank, host, text)
                return
            if held.end:  # after an exception line: a chained traceback, or not
                if text == "" or text in CHAIN or text == HEADER:
                    held.lines.append(text)
                    if text == HEADER:
                        held.end = 0
                    return
                self._finish(rank)
                self.show(stream, rank, host, text)
                return
            held.lines.append(text)
            if _ends(text) or len(held.lines) >= MAX_LINES:
                held.end = len(held.lines)
                held.timer = threading.Timer(self.settle, self._settled, (rank, held))
                held.timer.daemon = True
                held.timer.start()

    def _settled(self, rank: int, held: _Held) -> None:
        """Nothing followed the exception line for a while: the traceback is whole."""
        with self._lock:
            if self._held.get(rank) is held and held.end:
                self._finish(rank)

    def _finish(self, rank: int) -> None:
        held = self._held.pop(rank)
        if held.timer is not None:
            held.timer.cancel()
        end = held.end or len(held.lines)
        self._whole(rank, held.host, held.lines[:end])
        for text in held.lines[end:]:  # blank lines after it that began no chain
            self.show("err", rank, held.host, text)

    def _whole(self, rank: int, host: str, lines: list[str]) -> None:
        key = tuple(without_own_frames(lines))
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = _Group(key)
            group.timer = threading.Timer(self.window, self._emit, (key,))
            group.timer.daemon = True
            group.timer.start()
        group.ranks.append(rank)
        if host not in group.hosts:
            group.hosts.append(host)

    def _emit(self, key: tuple[str, ...]) -> None:
        with self._lock:
            group = self._groups.pop(key, None)
            if group is None:
                return
            if group.timer is not None:
                group.timer.cancel()
            if len(group.ranks) == 1:
                for text in group.lines:
                    self.show("err", group.ranks[0], group.hosts[0], text)
            else:
                self.show_group(sorted(group.ranks), group.hosts, group.lines)

    def flush(self) -> None:
        """The attempt ended: every held traceback shown now (one cut short as it is)."""
        with self._lock:
            for rank in sorted(self._held):
                self._finish(rank)
            for key in list(self._groups):
                self._emit(key)
