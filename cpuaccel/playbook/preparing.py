"""What the preparers share (a module's step across the task's hosts before their own
runs: synchronize_broadcast, copy_broadcast): one broadcast of the task's large files to
the hosts that lack them, each at its own folder."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from cpuaccel.connectors import broadcast
from cpuaccel.executor import ConnectionPool
from cpuaccel.playbook.session import HostContext, module_python


@dataclass(frozen=True)
class Caster:
    """How a preparer broadcasts: on the playbook's ``pool``, ``note`` taking a line for
    each node cut out or failed, ``moved`` the bytes (so far, of the total)."""

    pool: ConnectionPool
    note: Callable[[str], None]
    moved: Callable[[int, int], None]

    def deliver(
        self,
        targets: Sequence[tuple[HostContext, str]],
        files: Sequence[broadcast.PayloadFile],
        keep: Mapping[str, frozenset[str]] | None = None,
    ) -> dict[str, broadcast.Delivery]:
        """``files`` to each target's host below its folder (each keeping ``keep``'s
        names, else all), relayed by the agent's interpreter: provision may be what makes
        cpuaccel_python. A host that kept them has them on its HostContext
        (``broadcast``), for the task's result; every host's Delivery is returned."""
        sender = broadcast.Broadcast(
            self.pool,
            [ctx.host for ctx, _ in targets],
            {ctx.host.name: folder for ctx, folder in targets},
            files,
            keep=keep,
            listen=broadcast.Listeners(note=self.note, progress=self.moved),
            python=module_python,
        )
        contexts = {ctx.host.name: ctx for ctx, _ in targets}
        done = sender.run()
        for name, delivery in done.items():
            if delivery.ok:
                contexts[name].broadcast = sorted(delivery.kept)
        return done
