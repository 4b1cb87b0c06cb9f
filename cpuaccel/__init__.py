"""cpuaccel: provision, sync and launch distributed PyTorch training on Intel Xeon clusters.

From Python, the CLI's verbs (docs/api.md)::

    import cpuaccel
    run = cpuaccel.launch("train.py", inventory="inventory.yaml", nodes=2, ppn=2, detach=True)
    run.wait(timeout=3600)

and, in a rank, the training runtime (``cpuaccel.init``). Each name is loaded on first
use, so that importing cpuaccel (the CLI, the worker) imports neither the controller's
libraries nor torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from cpuaccel.api.checking import check
    from cpuaccel.api.launching import launch
    from cpuaccel.api.provisioning import provision
    from cpuaccel.api.run_handle import Run, RunResult, runs
    from cpuaccel.api.syncing import sync
    from cpuaccel.runtime import Context, init, record_checkpoint

__all__ = [
    "Context",
    "Run",
    "RunResult",
    "__version__",
    "check",
    "init",
    "launch",
    "provision",
    "record_checkpoint",
    "runs",
    "sync",
]
# Where each public name lives. ``cpuaccel.launch``, ``cpuaccel.runs`` and
# ``cpuaccel.sync`` are functions: no subpackage has those names, so importing one
# never replaces them.
_LAZY = {
    "Context": "cpuaccel.runtime",
    "init": "cpuaccel.runtime",
    "record_checkpoint": "cpuaccel.runtime",
    "launch": "cpuaccel.api.launching",
    "Run": "cpuaccel.api.run_handle",
    "RunResult": "cpuaccel.api.run_handle",
    "runs": "cpuaccel.api.run_handle",
    "check": "cpuaccel.api.checking",
    "sync": "cpuaccel.api.syncing",
    "provision": "cpuaccel.api.provisioning",
}


# Submodules a user names after ``import cpuaccel`` alone (``cpuaccel.errors.UsageError``).
_SUBMODULES = ("errors", "notebook")


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"cpuaccel.{name}")
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module 'cpuaccel' has no attribute {name!r}")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value  # looked up once
    return value
