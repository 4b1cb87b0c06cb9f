"""What the preparers share (a module's step across the task's hosts before their own
runs: synchronize_broadcast, copy_broadcast): one broadcast of the task's large files to
the hosts that lack them, each at its own folder."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from cpuaccel.connectors import broadcast
from cpuaccel.executor import ConnectionPool
from cpuaccel.playbook.session import HostContext, module_python


def deliver(
    targets: Sequence[tuple[HostContext, str]],
    files: Sequence[broadcast.PayloadFile],
    pool: ConnectionPool,
    note: Callable[[str], None],
    moved: Callable[[int, int], None],
    keep: Mapping[str, frozenset[str]] | None = None,
) -> dict[str, broadcast.Delivery]:
    """``files`` to each target's host below its folder (each keeping ``keep``'s names,
    else all), relayed by the agent's interpreter: provision may be what makes
    cpuaccel_python. A host that kept them has them on its HostContext (``broadcast``),
    for the task's result; every host's Delivery is returned."""
    sender = broadcast.Broadcast(
        pool.get,
        pool.options,
        [ctx.host for ctx, _ in targets],
        {ctx.host.name: folder for ctx, folder in targets},
        files,
        keep=keep,
        note=note,
        progress=moved,
        python=module_python,
    )
    contexts = {ctx.host.name: ctx for ctx, _ in targets}
    done = sender.run()
    for name, delivery in done.items():
        if delivery.ok:
            contexts[name].broadcast = sorted(delivery.kept)
    return done
