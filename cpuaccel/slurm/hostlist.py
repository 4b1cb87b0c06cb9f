"""Slurm's hostlist syntax: ``node[01-16,20],login1`` to the host names it stands for.

Slurm hands a job its nodes as one compressed string (``SLURM_JOB_NODELIST``), and
``sinfo``/``squeue`` print the same form. Expanding it ourselves saves a round trip to
``scontrol show hostnames`` and works where only the environment is there (inside a
batch script). Every name that comes out is checked as a host name, since it reaches
ssh and srun argvs.
"""

from __future__ import annotations

import re

from cpuaccel.errors import UsageError
from cpuaccel.inventory.variables import host_name_problem

# A list longer than this is a typo (node[1-1000000]), not a cluster.
MAX_HOSTS = 100_000
_RANGE = re.compile(r"(\d+)(?:-(\d+))?")


class HostlistError(UsageError):
    """A hostlist that is not Slurm's syntax, or names something that is no host."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message, hint=hint or "write Slurm's hostlist form, e.g. node[01-16,20]")


def expand(text: str, *, origin: str = "hostlist") -> list[str]:
    """The host names of ``text``, in order, duplicates kept out.

    ``origin`` names where the text came from (``SLURM_JOB_NODELIST``, ``sinfo``) for
    the error. ``a[1-2]b[3-4]`` is the product, as in Slurm.
    """
    hosts: list[str] = []
    seen: set[str] = set()
    for item in _split_top(text.strip(), origin):
        for name in _expand_item(item, origin):
            problem = host_name_problem(name)
            if problem is not None:
                raise HostlistError(f"{origin}: {problem}", hint="give Slurm node names")
            if name not in seen:
                seen.add(name)
                hosts.append(name)
                if len(hosts) > MAX_HOSTS:
                    raise HostlistError(
                        f"{origin}: {text[:60]!r} names more than {MAX_HOSTS} hosts"
                    )
    return hosts


def _split_top(text: str, origin: str) -> list[str]:
    """Split at the commas that are outside brackets."""
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
            if depth > 1:
                raise HostlistError(f"{origin}: nested '[' in {text!r}")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"{origin}: ']' without '[' in {text!r}")
        elif char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise HostlistError(f"{origin}: '[' without ']' in {text!r}")
    items.append(text[start:])
    if any(not item for item in items):
        raise HostlistError(f"{origin}: an empty name in {text!r}", hint="remove the extra ','")
    return items


def _expand_item(item: str, origin: str) -> list[str]:
    """``pre[ranges]post...`` to its names (the product of every bracket)."""
    names = [""]
    rest = item
    while rest:
        open_at = rest.find("[")
        if open_at < 0:
            names = [name + rest for name in names]
            break
        close_at = rest.index("]", open_at)
        prefix, ranges = rest[:open_at], rest[open_at + 1 : close_at]
        values = _expand_ranges(ranges, item, origin)
        names = [name + prefix + value for name in names for value in values]
        if len(names) > MAX_HOSTS:
            raise HostlistError(f"{origin}: {item[:60]!r} names more than {MAX_HOSTS} hosts")
        rest = rest[close_at + 1 :]
    return names


def _expand_ranges(ranges: str, item: str, origin: str) -> list[str]:
    """``01-03,7`` to ``["01", "02", "03", "7"]``: the zero padding of each start kept."""
    values: list[str] = []
    for part in ranges.split(","):
        match = _RANGE.fullmatch(part.strip())
        if match is None:
            raise HostlistError(
                f"{origin}: {part!r} in {item!r} is not a number or a range like 01-16"
            )
        low, high = match.group(1), match.group(2) or match.group(1)
        if int(high) < int(low):
            raise HostlistError(f"{origin}: the range {part!r} in {item!r} goes backwards")
        if int(high) - int(low) >= MAX_HOSTS:
            raise HostlistError(f"{origin}: {item[:60]!r} names more than {MAX_HOSTS} hosts")
        width = len(low)
        values.extend(str(n).zfill(width) for n in range(int(low), int(high) + 1))
    return values
