"""The rank side of the rendezvous bound (``run --rendezvous-timeout``).

``cpuaccel run`` exports CPUACCEL_RENDEZVOUS (the bound, in seconds) to every rank. The
worker then calls ``install``, which changes nothing of the script: it waits for
torch.distributed's c10d module to be imported (a finder at the head of
``sys.meta_path``, gone after that one import) and wraps its ``init_process_group``,
the one every way in goes through: ``dist.init_process_group()`` with no arguments,
Accelerate's ``Accelerator()``, cpuaccel's own ``init``. The wrapped call:

- says ``waiting``, then ``joined`` when torch returns, through the labeller's own pipe
  (the markers' form and their reading: cpuaccel/node/rendezvous.py);
- gives torch the bound as its ``timeout`` when the script gave none, so that neither
  the TCPStore nor gloo waits torch's default 30 minutes for a peer that never comes;
- closes the rendezvous with one barrier on the new group, as torch's own
  TORCH_DIST_INIT_BARRIER=1 does: a rank that met the store but cannot reach its peers
  (a lazily connecting backend) is found here, within the bound, rather than in the
  first step; ``ready`` when it completes;
- then gives the group and its store back the timeout torch would have chosen, so that
  a long wait later in the run (a rank evaluating while the others wait) is bound by
  --hang-timeout, as without cpuaccel, not by this;
- says ``error`` with the first line of what init_process_group or the barrier raised
  (a TCPStore timeout, gloo's connectFullMesh failure), then raises it as it was.

Stdlib only, no torch: the worker imports it, and torch is imported by the script.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

from cpuaccel import _labels
from cpuaccel.node.rendezvous import ENV, marker

C10D = "torch.distributed.distributed_c10d"
TIMEOUT_ARG = 2  # init_process_group(backend, init_method, timeout, ...): its position


def bound_of(env: Mapping[str, str]) -> tuple[str, float] | None:
    """(run id, bound in seconds) when the run asked for the rendezvous to be followed."""
    run_id = env.get("CPUACCEL_RUN_ID")
    try:
        bound = float(env.get(ENV, ""))
    except ValueError:
        return None
    return (run_id, bound) if run_id and bound > 0 else None


class _Follow:
    """Wraps init_process_group when c10d is imported: a finder at the head of
    sys.meta_path that lets the others find the module, then adds its wrap to the
    loader's exec_module, and leaves sys.meta_path after that one import."""

    def __init__(self, run_id: str, bound: float, write: Callable[[str], None]) -> None:
        self.run_id = run_id
        self.bound = bound
        self.write = write

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname != C10D:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec: ModuleSpec | None = None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                break
        if spec is None:
            return None
        loader: Any = spec.loader
        execute = getattr(loader, "exec_module", None)
        if loader is None or execute is None:
            return spec

        def exec_module(module: ModuleType) -> None:
            execute(module)
            wrap(module, self.run_id, self.bound, self.write)

        loader.exec_module = exec_module
        return spec


def wrap(c10d: Any, run_id: str, bound: float, write: Callable[[str], None]) -> None:
    """c10d's init_process_group followed, as the module docstring says."""
    original = c10d.init_process_group
    if getattr(original, "__cpuaccel_followed__", False):
        return

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> None:
        write(marker(run_id, "waiting"))
        ours = len(args) <= TIMEOUT_ARG and kwargs.get("timeout") is None
        if ours:
            import datetime

            kwargs["timeout"] = datetime.timedelta(seconds=bound)
        try:
            original(*args, **kwargs)
            write(marker(run_id, "joined"))
            c10d.barrier()
        except Exception as exc:
            write(marker(run_id, "error", f"{type(exc).__name__}: {exc}"))
            raise
        if ours:
            _default_timeout_back(c10d)
        write(marker(run_id, "ready"))

    init_process_group.__cpuaccel_followed__ = True  # type: ignore[attr-defined]
    c10d.init_process_group = init_process_group
    package = sys.modules.get("torch.distributed")  # its copy, when it made one already
    if package is not None and getattr(package, "init_process_group", None) is original:
        vars(package)["init_process_group"] = init_process_group


def _default_timeout_back(c10d: Any) -> None:
    """The timeout torch chooses when the script gives none, on the default group and
    its store (the bound was for the rendezvous only). A torch without these private
    helpers keeps the bound."""
    try:
        group = c10d._get_default_group()
        backend = c10d.get_backend(group)
        timeout = c10d._get_default_timeout(backend)
        c10d._get_default_store().set_timeout(timeout)
        if backend != "mpi":
            c10d._set_pg_timeout(timeout, group)
    except Exception:  # private helpers of torch's: the bound stays
        pass


def install(
    env: Mapping[str, str] | None = None, write: Callable[[str], None] | None = None
) -> bool:
    """Follow this process's rendezvous when the run asked for it; whether it does."""
    found = bound_of(os.environ if env is None else env)
    if found is None:
        return False
    follow = _Follow(*found, write or _labels.control)
    if C10D in sys.modules:  # imported already: wrapped where it is
        wrap(sys.modules[C10D], follow.run_id, follow.bound, follow.write)
    else:
        sys.meta_path.insert(0, follow)
    return True
