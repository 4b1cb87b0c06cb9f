"""cpuaccel: provision, sync and launch distributed PyTorch training on Intel Xeon clusters.

The training runtime (``cpuaccel.init``) is loaded on first use, so that importing
cpuaccel (the CLI, the worker) does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from cpuaccel.runtime import Context, init, record_checkpoint

__all__ = ["Context", "__version__", "init", "record_checkpoint"]
_RUNTIME = ("Context", "init", "record_checkpoint")


def __getattr__(name: str) -> Any:
    if name in _RUNTIME:
        from cpuaccel import runtime

        return getattr(runtime, name)
    raise AttributeError(f"module 'cpuaccel' has no attribute {name!r}")
