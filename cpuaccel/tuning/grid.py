"""The settings ``cpuaccel tune`` tries: ranks per node x threads per rank (and the
allocator), from the nodes' cores, or from ``--grid`` (checked here, where it enters).

ipexrun and ``torch.backends.xeon.run_cpu`` pick ranks and threads by fixed rules; tune
measures the user's own script at each setting instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from cpuaccel.config.settings import ALLOCATOR_CHOICES
from cpuaccel.errors import UsageError

AXES = ("ppn", "threads", "allocator")
MAX_VALUE = 4096  # ranks or threads per node: a bound that catches a typo (1e9)
MAX_TRIALS = 64  # each trial is a real run: more is a mistake, not a tune
EXAMPLE = "e.g. --grid 'ppn=1,2 threads=1,2' or --grid allocator=none,tcmalloc"


@dataclass(frozen=True)
class Trial:
    """One setting tried: ``threads`` is OMP_NUM_THREADS per rank."""

    ppn: int
    threads: int
    allocator: str

    def label(self) -> str:
        return f"ppn {self.ppn} x threads {self.threads}, allocator {self.allocator}"


@dataclass(frozen=True)
class GridSpec:
    """What --grid fixed (None: from the nodes' facts)."""

    ppn: tuple[int, ...] | None = None
    threads: tuple[int, ...] | None = None
    allocator: tuple[str, ...] | None = None


def _bad(text: str, why: str) -> UsageError:
    return UsageError(f"--grid {text!r}: {why}", hint=EXAMPLE)


def _whole(item: str, word: str) -> int:
    if not (word.isascii() and word.isdigit()) or len(word) > 6:
        raise _bad(item, f"{word!r} is not a whole number")
    value = int(word)
    if not 1 <= value <= MAX_VALUE:
        raise _bad(item, f"{value} is not 1 to {MAX_VALUE}")
    return value


def _values(item: str, axis: str, text: str) -> tuple[int, ...] | tuple[str, ...]:
    words = text.split(",")
    if not text or any(not w for w in words):
        raise _bad(item, f"{axis} needs values separated by commas, none empty")
    if len(set(words)) != len(words):
        raise _bad(item, f"{axis} names a value twice")
    if axis == "allocator":
        for word in words:
            if word not in ALLOCATOR_CHOICES:
                raise _bad(item, f"allocator {word!r} is not one of {', '.join(ALLOCATOR_CHOICES)}")
        return tuple(words)
    return tuple(_whole(item, w) for w in words)


def parse_grid(items: tuple[str, ...]) -> GridSpec:
    """``--grid`` values, each one or more ``AXIS=V,V`` words (AXIS ppn, threads or
    allocator), every axis at most once."""
    found: dict[str, tuple[int, ...] | tuple[str, ...]] = {}
    for given in items:
        words = given.split()
        if not words:
            raise _bad(given, "empty")
        for word in words:
            axis, sep, text = word.partition("=")
            if not sep or axis not in AXES:
                raise _bad(word, f"expected AXIS=V,V with AXIS one of {', '.join(AXES)}")
            if axis in found:
                raise _bad(word, f"{axis} given twice")
            found[axis] = _values(word, axis, text)
    return GridSpec(**found)  # type: ignore[arg-type]


def ppn_choices(cores: int, sockets: int) -> list[int]:
    """Ranks per node worth trying: the powers of two that divide the cores (1, 2, 4,
    ...), the sockets (a rank a socket, run's default), and the cores themselves (one
    thread a rank)."""
    cores = max(1, cores)
    found = {p for p in (2**k for k in range(cores.bit_length())) if cores % p == 0}
    found.add(cores)
    if 1 <= sockets <= cores and cores % sockets == 0:
        found.add(sockets)
    return sorted(found)


def thread_choices(cores: int, ppn: int) -> list[int]:
    """Every core busy (cores / ppn), and half of them (memory-bound steps often run as
    fast on fewer threads, leaving the rest to the allocator and the sync)."""
    full = max(1, cores // ppn)
    return sorted({full, max(1, full // 2)}, reverse=True)


def build_grid(spec: GridSpec, cores: int, sockets: int, allocator: str) -> list[Trial]:
    """Ranks x threads at ``allocator`` (the run's own setting): the first stage. The
    allocators are tried at the best of it (``allocator_trials``)."""
    trials: list[Trial] = []
    for ppn in spec.ppn or ppn_choices(cores, sockets):
        for threads in spec.threads or thread_choices(cores, ppn):
            trials.append(Trial(ppn, threads, allocator))
    return trials


def allocator_trials(
    spec: GridSpec, best: Trial, present: list[str], tried: list[Trial]
) -> list[Trial]:
    """The allocators at the best ranks x threads: --grid's, else none and those every
    node has (tcmalloc, jemalloc); nothing when no node has one and none was asked."""
    names = list(spec.allocator) if spec.allocator else (["none", *present] if present else [])
    fresh = [Trial(best.ppn, best.threads, name) for name in names]
    return [t for t in fresh if t not in tried]


def check_size(trials: list[Trial], allocators: int) -> None:
    if len(trials) + allocators > MAX_TRIALS:
        raise UsageError(
            f"--grid asks for {len(trials) + allocators} trials, more than {MAX_TRIALS}",
            hint="give fewer values, e.g. --grid 'ppn=1,2,4 threads=8'",
        )
