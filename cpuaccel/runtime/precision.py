"""Mixed precision: the autocast dtype a name stands for, and the CPU's native bf16.

``auto`` (the default) is bf16 where the CPU computes it natively (AMX or AVX512-BF16)
and fp32 elsewhere: without those instructions bf16 is emulated and slower than fp32.
An explicit ``bf16`` is honoured anyway.

bf16 means ``torch.autocast("cpu", dtype=torch.bfloat16)`` around the forward and,
besides attention's precision (:mod:`cpuaccel.runtime.attention`), nothing more:
parameters, gradients and the optimizer's update stay fp32, with no bf16 weight copies
kept across steps (the casts they would save are a negligible share of a step:
docs/benchmarks.md, "Training").
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from cpuaccel.errors import SettingError

PRECISION_ENV = "CPUACCEL_MIXED_PRECISION"
AUTO = "auto"
PRECISIONS: dict[str, torch.dtype | None] = {
    "no": None,
    "fp32": None,
    "none": None,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
}
# The /proc/cpuinfo flags of native bf16: AMX's tiles, and AVX512's bf16 dot products.
NATIVE_BF16_FLAGS = ("amx_bf16", "amx_tile", "avx512_bf16")
CPUINFO = "/proc/cpuinfo"


@dataclass(frozen=True)
class Precision:
    """What ``mixed_precision`` resolved to, and the one line that says why."""

    dtype: torch.dtype | None
    note: str | None  # None: nothing to say (fp32 asked for)

    @property
    def name(self) -> str:
        return "bf16" if self.dtype is not None else "fp32"


def precision_dtype(mixed_precision: str | None) -> torch.dtype | None:
    """The autocast dtype of an explicit name (``auto`` is :func:`resolve_precision`'s)."""
    name = (mixed_precision or "no").strip().lower()
    if name in ("fp16", "float16"):
        raise SettingError(
            "mixed_precision='fp16' is not supported on CPUs (it needs loss scaling and is "
            "not faster there): use 'bf16'"
        )
    if name not in PRECISIONS:
        raise SettingError(f"mixed_precision={mixed_precision!r}: use 'auto', 'bf16' or 'no'")
    return PRECISIONS[name]


def resolve_precision(mixed_precision: str, flags: set[str] | None = None) -> Precision:
    """``auto``, ``bf16`` or ``no`` (``fp32``) against this CPU's flags (default: read
    from /proc/cpuinfo), with the line ``init`` prints on rank 0."""
    native = cpu_bf16_support(flags)
    if mixed_precision.strip().lower() == AUTO:
        if native:
            return Precision(torch.bfloat16, f"precision auto -> bf16: the CPU has {native}")
        return Precision(
            None,
            "precision auto -> fp32: this CPU has no AMX or AVX512-BF16 (bf16 would be emulated)",
        )
    dtype = precision_dtype(mixed_precision)
    if dtype is None:
        return Precision(None, None)
    if native:
        return Precision(dtype, f"mixed precision bf16: the CPU has {native}")
    return Precision(
        dtype,
        "mixed precision bf16: this CPU has no native bf16 (may be slower than fp32; "
        "'auto' would pick fp32)",
    )


def cpu_flags(text: str | None = None, path: str = CPUINFO) -> set[str]:
    """The first processor's flags in /proc/cpuinfo's text (read from path when None);
    empty when unknown (not Linux)."""
    if text is None:
        try:
            text = Path(path).read_text()
        except OSError:
            return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return set()


def cpu_bf16_support(flags: set[str] | None = None) -> str:
    """The CPU's native bf16 instructions, e.g. "amx_bf16, avx512_bf16" ("" when none)."""
    found = cpu_flags() if flags is None else flags
    return ", ".join(f for f in NATIVE_BF16_FLAGS if f in found)
