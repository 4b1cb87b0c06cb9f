"""A notebook cell's function run on every rank: ``cpuaccel.notebook.launch``.

Importing this package costs little: the controller's modules are imported by
``launch`` when it is called (a rank imports this package too, to run
``cpuaccel.notebook.rank``, and needs none of them).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from cpuaccel.notebook.errors import JobError, RankError, ResultRefused

__all__ = ["JobError", "RankError", "ResultRefused", "launch"]


def launch(
    fn: Callable[..., Any],
    *args: Any,
    nodes: int | str | None = 1,
    ppn: int | None = None,
    inventory: str | os.PathLike[str] | None = None,
    gather: bool = False,
    progress: bool = False,
    **settings: Any,
) -> Any:
    """Run ``fn(*args)`` on every rank of a job on ``nodes`` nodes, ``ppn`` ranks each,
    from a notebook (or any Python program): the value rank 0 returned, or with
    ``gather=True`` the list of every rank's, by rank.

    ``fn`` may be defined in the notebook: it is pickled with its arguments
    (cloudpickle: by value for the kernel's own definitions), sent with the current
    folder's sync (the project) and run under the bundled runtime, where
    ``cpuaccel.init()`` works as in a script. ``nodes=1`` without an inventory runs on
    this machine; ``inventory`` (else ``$CPUACCEL_INVENTORY``, else ./inventory.yaml)
    names the nodes; ``nodes=None`` takes the project file's or the inventory's count.
    ``settings``: the run settings of ``cpuaccel.launch`` (``env``, ``timeout``,
    ``mixed_precision``, ``max_restarts`` ...), and its host keywords (``limit``,
    ``user`` ...).

    Rank 0's output is printed as it comes (sys.stdout), and every rank's errors
    (sys.stderr, labelled with the rank); cpuaccel's own lines only with
    ``progress=True``. The preflight also checks that each node's Python (major.minor)
    and cloudpickle are the caller's.

    Raises ``RankError`` (the function raised on a rank: its traceback there),
    ``JobError`` (the job ended with no value: a rank killed, a node lost, a timeout),
    ``ResultRefused`` (a JobError: a rank's result file was changed on its node, so its
    value is refused unread),
    ``cpuaccel.errors.PreflightError`` (no job started), ``UsageError``, ``HostError``;
    ``KeyboardInterrupt`` once an interrupt (the kernel's, Ctrl-C) has ended the job on
    every node."""
    from cpuaccel.notebook.launching import launch_function

    try:
        return launch_function(
            fn, args, nodes=nodes, ppn=ppn, inventory=inventory, gather=gather,
            progress=progress, settings=settings,
        )  # fmt: skip
    except JobError as exc:  # what happened is on the ranks: no frame of ours to show
        raise exc.with_traceback(None) from None
