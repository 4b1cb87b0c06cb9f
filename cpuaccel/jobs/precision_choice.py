"""What ``--mixed-precision`` becomes in every rank's environment.

``auto`` (the runtime's default) is settled here, once for the whole job, from the
chosen nodes' facts: bf16 only when *every* node has AMX-BF16 or AVX512-BF16, since a
job runs at the pace of its slowest rank and emulated bf16 is slower than fp32. Settling
it on the controller (rather than letting each rank look at its own CPU) keeps every
rank of a mixed cluster on the same precision and lets the choice be printed once.

Accelerate knows ``no``/``bf16`` (not ``fp32`` or ``auto``), so what is exported is
always one of those two once the nodes are known; a dry run, which asks no node,
shows ``auto`` and a placeholder.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cpuaccel.facts.gather import Facts
from cpuaccel.facts.problems import native_bf16
from cpuaccel.inventory.host import Host

PLACEHOLDER = "<bf16 if every node has AMX-BF16 or AVX512-BF16, else no>"


@dataclass(frozen=True)
class PrecisionChoice:
    accelerate: str | None  # ACCELERATE_MIXED_PRECISION (None: not exported)
    cpuaccel: str | None  # CPUACCEL_MIXED_PRECISION
    note: str | None = None  # one line saying what auto chose and why


def choose_precision(
    value: str | None, hosts: Sequence[Host], facts: Mapping[str, Facts] | None
) -> PrecisionChoice:
    """The exported values for ``value`` (a settled ``--mixed-precision``) on ``hosts``."""
    if value is None:
        return PrecisionChoice(None, None)
    if value in ("no", "fp32"):
        return PrecisionChoice("no", "no")
    known = {h.name: facts[h.name] for h in hosts if facts and h.name in facts}
    lacking = [name for name, f in known.items() if native_bf16(f) is None]
    if value != "auto":  # an explicit bf16 is honoured, with a warning where it is emulated
        note = None
        if lacking:
            note = (
                f"warning: mixed precision bf16 without native bf16 on {_shown(lacking)} "
                "(emulated, may be slower than fp32; --mixed-precision auto would pick fp32)"
            )
        return PrecisionChoice(value, value, note)
    if len(known) < len(hosts):
        return PrecisionChoice(PLACEHOLDER, "auto")
    if not lacking:
        flags = sorted({native_bf16(f) or "" for f in known.values()})
        return PrecisionChoice(
            "bf16", "bf16", f"precision auto -> bf16: every node has {' or '.join(flags)}"
        )
    return PrecisionChoice(
        "no",
        "no",
        f"precision auto -> fp32: no AMX-BF16 or AVX512-BF16 on {_shown(lacking)} "
        "(bf16 would be emulated; pass --mixed-precision bf16 to use it anyway)",
    )


def _shown(names: Sequence[str]) -> str:
    """The first three names, and how many more."""
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return ", ".join(names[:3]) + more
