"""Message sizes of ``cpuaccel bench net``: read from the command line (``64M``,
``16KiB``, ``8``: binary units, as message sizes go in powers of 2) and written back
the same way (``8 B``, ``2 KiB``, ``64 MiB``)."""

from __future__ import annotations

import re

UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
_SIZE = re.compile(r"([0-9]{1,12})\s*([KMG]?)(?:I?B)?", re.IGNORECASE)


def parse_size(text: str) -> int | None:
    """Bytes of ``64M``, ``64MiB``, ``64MB``, ``2k``, ``512B`` or ``8``; None when
    ``text`` is none of those."""
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        return None
    return int(match.group(1)) * UNITS[match.group(2).upper()]


def size_text(size: int) -> str:
    """8 B, 2 KiB, 64 MiB; a size that is no whole unit stays in the smaller one."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"
