"""The training runtime each rank runs: ``ctx = cpuaccel.init(...)`` and its helpers.

See :mod:`cpuaccel.runtime.context` for the API; the other modules are its parts:
``env`` (rank and world from the launcher), ``backend`` (process group, IPEX),
``gradsync`` (MPI gradient allreduce), ``data`` (sharded loaders), ``checkpoint``
(atomic saves), ``metrics`` (metrics.jsonl).
"""

from __future__ import annotations

from cpuaccel.runtime.context import Context, init

__all__ = ["Context", "init"]
