"""Run one action on many hosts at once: the parallel core every verb shares.

A bounded thread pool (``--forks``) opens one connection per host and runs the action
on it. Each host ends ok, failed or unreachable with its reason; one host's failure
never stops the others, and results come back in inventory order.

A node program with the same request on every host (``call_all``) goes the same way,
or, for the nodes of one Slurm allocation, in ONE srun step over them all
(connectors/srun.call_everywhere), which spares Slurm a step a node and the job a round
of srun start-ups; a ``jobctl`` request goes to the host's program kept open since the
preflight (``KeptPrograms``) while it lives.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from cpuaccel import ui
from cpuaccel.connectors.base import Connector
from cpuaccel.connectors.choose import connector_for
from cpuaccel.connectors.connect_options import ConnectOptions
from cpuaccel.errors import CpuaccelError, HostError, Unreachable
from cpuaccel.inventory.host import Host

if TYPE_CHECKING:
    from cpuaccel.connectors import programs

T = TypeVar("T")
K = TypeVar("K")
R = TypeVar("R")

# pdsh and ClusterShell use windows of 32 and 64: enough for dozens of hosts at once
# without one controller opening hundreds of sessions.
DEFAULT_FORKS = 32


class Status(str, Enum):
    OK = "ok"
    FAILED = "failed"
    UNREACHABLE = "unreachable"


@dataclass(frozen=True)
class HostResult(Generic[T]):
    host: Host
    status: Status
    value: T | None = None
    error: str | None = None
    hint: str | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status is Status.OK


Action = Callable[[Connector], T]
Answer = dict[str, Any]


def failed(host: Host, exc: CpuaccelError, seconds: float) -> HostResult[Any]:
    """The result of a host whose answer is an error: unreachable or failed, its reason."""
    status = Status.UNREACHABLE if isinstance(exc, Unreachable) else Status.FAILED
    reason = exc.reason if isinstance(exc, HostError) else exc.message
    return HostResult(host, status, None, reason, exc.hint, seconds)


class ConnectionPool:
    """Connections kept open across the phases of one command (preflight, copy, launch,
    sweep), so that each host costs one SSH handshake, not one per phase."""

    def __init__(self, options: ConnectOptions) -> None:
        self.options = options
        self._lock = threading.Lock()
        self._conns: dict[str, Connector] = {}

    def get(self, host: Host) -> Connector:
        with self._lock:
            conn = self._conns.get(host.name)
            if conn is None:
                conn = self._conns[host.name] = connector_for(host, self.options)
                fresh = True
            else:
                fresh = False
        if fresh:
            try:
                conn.connect()
            except BaseException:
                self.discard(host)
                raise
        return conn

    def open_hosts(self) -> list[str]:
        """The names of the hosts with a connection open now."""
        with self._lock:
            return list(self._conns)

    def lost(self, hosts: Sequence[Host]) -> list[str]:
        """Names of the hosts whose open connection has died, in ``hosts``' order (a
        host not connected yet is not lost: the next ``get`` connects it)."""
        with self._lock:
            conns = [self._conns.get(host.name) for host in hosts]
        return [host.name for host, conn in zip(hosts, conns, strict=True) if conn and conn.lost()]

    def discard(self, host: Host) -> None:
        """Forget (and close) a host's connection, after it failed."""
        with self._lock:
            conn = self._conns.pop(host.name, None)
        if conn is not None:
            conn.close()

    def close(self) -> None:
        with self._lock:
            conns, self._conns = list(self._conns.values()), {}
        for conn in conns:
            conn.close()

    def __enter__(self) -> ConnectionPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _connected(
    host: Host, action: Action[T], options: ConnectOptions, pool: ConnectionPool | None
) -> T:
    if pool is None:
        with connector_for(host, options) as conn:
            return action(conn)
    try:
        return action(pool.get(host))
    except Unreachable:
        pool.discard(host)  # a broken connection is not reused
        raise


def _run_one(
    host: Host, action: Action[T], options: ConnectOptions, pool: ConnectionPool | None = None
) -> HostResult[T]:
    started = time.monotonic()
    try:
        value = _connected(host, action, options, pool)
    except CpuaccelError as exc:
        return failed(host, exc, time.monotonic() - started)
    except Exception as exc:  # a bug on one host must not hide the others' results
        error = f"internal error: {type(exc).__name__}: {exc}"
        return HostResult(host, Status.FAILED, None, error, None, time.monotonic() - started)
    return HostResult(host, Status.OK, value, seconds=time.monotonic() - started)


def fan_out(
    items: Sequence[K],
    work: Callable[[K], R],
    *,
    forks: int,
    on_done: Callable[[R], None] | None = None,
    one_inline: bool = False,
) -> list[R]:
    """``work(item)`` for every item, at most ``forks`` at a time; results in items' order.

    The thread pool under ``run_on_hosts``, open to a caller whose work decides itself
    when (and whether) to connect, as the playbook's strategy does for controller-only
    tasks. ``on_done`` is called from the calling thread as each item finishes. With
    ``one_inline``, a single item runs in the calling thread, with no pool. ``work``
    turns user errors into results; an exception is a bug and is raised once all finish.
    """
    if forks < 1:
        raise ValueError("forks must be at least 1")
    if not items:
        return []
    if one_inline and len(items) == 1:
        # No worker thread for a one-node check, whose cost is its start-up. Opt-in: a
        # Ctrl-C then ends the work itself, where the workers let it finish first.
        result = work(items[0])
        if on_done is not None:
            on_done(result)
        return [result]
    # Worker threads of its own rather than concurrent.futures' pool: that module (with
    # logging, which it imports) would weigh on the start-up of every command.
    import queue

    calls = iter([(index, ui.carried(work), item) for index, item in enumerate(items)])
    taking = threading.Lock()
    finished: queue.SimpleQueue[tuple[int, Any, BaseException | None]] = queue.SimpleQueue()

    def worker() -> None:
        while True:
            with taking:
                call = next(calls, None)
            if call is None:
                return
            index, run, item = call
            try:
                finished.put((index, run(item), None))
            except BaseException as exc:  # raised by the calling thread, once all finish
                finished.put((index, None, exc))

    workers = [threading.Thread(target=worker) for _ in range(min(forks, len(items)))]
    for thread in workers:
        thread.start()
    results: dict[int, R] = {}
    try:
        for _ in items:
            index, result, error = finished.get()
            if error is not None:
                raise error
            results[index] = result
            if on_done is not None:
                on_done(result)
    finally:  # an error or a Ctrl-C: raised once every item has run, as pools do
        for thread in workers:
            thread.join()
    return [results[index] for index in range(len(items))]


def run_on_hosts(
    hosts: Sequence[Host],
    action: Action[T],
    *,
    forks: int = DEFAULT_FORKS,
    options: ConnectOptions | None = None,
    on_result: Callable[[HostResult[T]], None] | None = None,
    pool: ConnectionPool | None = None,
    one_inline: bool = False,
) -> list[HostResult[T]]:
    """Run ``action(connector)`` on every host, at most ``forks`` at a time.

    ``on_result`` is called (from the calling thread) as each host finishes, for progress.
    With a ``pool``, connections come from it and stay open for the next phase;
    ``one_inline`` as ``fan_out``'s.
    """
    opts = pool.options if pool is not None else (options or ConnectOptions())

    def one(host: Host) -> HostResult[T]:
        result = _run_one(host, action, opts, pool)
        why = f": {result.error}" if result.error else ""
        ui.detail(1, host.name, f"{result.status.value} in {result.seconds:.2f} s{why}")
        return result

    return fan_out(hosts, one, forks=forks, on_done=on_result, one_inline=one_inline)


def in_one_step(hosts: Sequence[Host]) -> bool:
    """True when every host is a node of the same Slurm allocation."""
    jobs = {h.slurm_job for h in hosts}
    return bool(hosts) and None not in jobs and len(jobs) == 1


@dataclass(frozen=True)
class Request:
    """A node program's request on every host: ``program`` with ``words`` (the same on
    every host, or a host's own from a function of it) and ``payload`` on stdin, each
    answer awaited ``timeout`` s at most; ``what`` names it in a host's error."""

    program: str
    words: Sequence[str] | Callable[[Host], list[str]]
    what: str
    timeout: float
    payload: bytes = b""

    def words_for(self, host: Host) -> list[str]:
        return self.words(host) if callable(self.words) else list(self.words)


class KeptPrograms:
    """The preflight's programs kept open on the nodes (connectors/programs.Kept), by
    host name, for the job's later requests (its files, its sweep): closed (EOF, which
    ends them having written nothing) when no job is to start and when the run ends."""

    def __init__(self) -> None:
        self._open: dict[str, programs.Kept] = {}
        self._lock = threading.Lock()

    def add(self, name: str, program: programs.Kept) -> None:
        with self._lock:
            old, self._open[name] = self._open.get(name), program
        if old is not None:
            old.close()

    def get(self, name: str) -> programs.Kept | None:
        with self._lock:
            program = self._open.get(name)
        return program if program is not None and program.alive else None

    def close(self) -> None:
        with self._lock:
            gone, self._open = list(self._open.values()), {}
        for program in gone:
            program.close()


def call_all(
    hosts: Sequence[Host],
    request: Request,
    *,
    forks: int,
    pool: ConnectionPool,
    kept: KeptPrograms | None = None,
) -> list[HostResult[Answer]]:
    """``request`` on every host; one result a host, in the order given. A ``jobctl``
    request goes to a host's program in ``kept`` while it lives; one that is gone gives
    way to a fresh call."""
    if in_one_step(hosts):
        return in_step(hosts, request)
    from cpuaccel.connectors import programs

    what, timeout = request.what, request.timeout

    def one(conn: Connector) -> Answer:
        words, payload = request.words_for(conn.host), request.payload
        if kept is not None and request.program == "jobctl":
            open_ = kept.get(conn.host.name)
            return programs.call_kept(open_, conn, words, payload, what=what, timeout=timeout)
        return programs.call(conn, request.program, words, payload, what=what, timeout=timeout)

    return run_on_hosts(list(hosts), one, forks=forks, pool=pool)


def in_step(hosts: Sequence[Host], request: Request) -> list[HostResult[Answer]]:
    """``request`` on every host of one allocation (``in_one_step``) in ONE srun step;
    one result a host, in the order given, each with the step's time."""
    from cpuaccel.connectors import srun

    started = time.monotonic()
    answers = srun.call_everywhere(
        hosts, request.program, request.words_for, request.payload, what=request.what,
        timeout=request.timeout,
    )  # fmt: skip
    seconds = time.monotonic() - started
    results: list[HostResult[Answer]] = []
    for host in hosts:
        answer = answers[host.name]
        if isinstance(answer, HostError):
            results.append(failed(host, answer, seconds))
        else:
            results.append(HostResult(host, Status.OK, answer, seconds=seconds))
    return results
