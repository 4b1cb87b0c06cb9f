"""Mixed precision: the autocast dtype a name stands for, and the CPU's native bf16."""

from __future__ import annotations

from pathlib import Path

import torch

PRECISION_ENV = "CPUACCEL_MIXED_PRECISION"
PRECISIONS: dict[str, torch.dtype | None] = {
    "no": None,
    "fp32": None,
    "none": None,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
}


def precision_dtype(mixed_precision: str | None) -> torch.dtype | None:
    name = (mixed_precision or "no").strip().lower()
    if name in ("fp16", "float16"):
        raise ValueError(
            "mixed_precision='fp16' is not supported on CPUs (it needs loss scaling and is "
            "not faster there): use 'bf16'"
        )
    if name not in PRECISIONS:
        raise ValueError(f"mixed_precision={mixed_precision!r}: use 'bf16' or 'no'")
    return PRECISIONS[name]


def cpu_bf16_support() -> str:
    """The CPU's native bf16 instructions, from /proc/cpuinfo ("" when none or unknown)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    flags: set[str] = set()
    for line in text.splitlines():
        if line.startswith("flags"):
            flags = set(line.partition(":")[2].split())
            break
    return ", ".join(f for f in ("amx_bf16", "avx512_bf16") if f in flags)
