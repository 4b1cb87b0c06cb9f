"""The training runtime each rank runs: ``ctx = cpuaccel.init(...)`` and its helpers.

:mod:`cpuaccel.runtime.start` holds ``init`` (joining the job) and
:mod:`cpuaccel.runtime.context` the :class:`Context` it returns; the other modules are
their parts: ``env`` (rank and world from the launcher), ``group`` (the process group's
creation and teardown), ``backend`` (process-group backend, IPEX), ``precision``
(mixed precision), ``attention`` (attention's precision under bf16, measured),
``gradsync`` (MPI gradient allreduce), ``data`` (sharded loaders), ``checkpoint``
(atomic saves), ``metrics`` (metrics.jsonl), ``trackers`` (TensorBoard).
"""

from __future__ import annotations

from cpuaccel.runtime.checkpoint import record_checkpoint
from cpuaccel.runtime.context import Context
from cpuaccel.runtime.start import init

__all__ = ["Context", "init", "record_checkpoint"]
