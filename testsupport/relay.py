"""A delaying TCP relay for the test cluster: network latency without ``netem``.

This machine's kernel has no ``netem`` qdisc, so latency is added in user space: one
asyncio process listens on one port per node and forwards each connection to that
node's sshd, holding every chunk it forwards for ``delay`` seconds in each direction
(so a round trip through it costs at least 2 x delay). Chunks keep their order: each
direction is a queue drained by one task that sleeps until a chunk is due, so the delay
adds latency without cutting bandwidth, as a long link would.

Both tools of a bench connect through it: the inventory names the relay's address and
port (``ansible_host``/``ansible_port`` per node), and :func:`relayed_known_hosts`
records each node's key at that address and port. Started and ended by pid::

    relay = Relay.start([(listen_port, "10.77.71.1", 22), ...], "10.77.71.254", 0.002)
    ...
    relay.stop()

or from a shell: ``python -m testsupport.relay --delay-ms 2 --listen ADDR
PORT=HOST:PORT ...`` (it prints ``ready`` once every port listens).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cpuaccel.testbed.cluster import Cluster

CHUNK = 65536
READY = "ready"


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    """Copy reader to writer, each chunk delivered ``delay`` s after it arrived."""
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def deliver() -> None:
        while True:
            due, data = await queue.get()
            if not data:
                break
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
        with contextlib.suppress(OSError):
            if writer.can_write_eof():
                writer.write_eof()  # half-close: the other direction may still talk

    sender = asyncio.ensure_future(deliver())
    try:
        while True:
            data = await reader.read(CHUNK)
            queue.put_nowait((time.monotonic() + delay, data))
            if not data:
                break
        await sender
    except (OSError, asyncio.IncompleteReadError):
        sender.cancel()
    finally:
        if not sender.done():
            sender.cancel()


async def _relay_one(
    client_r: asyncio.StreamReader,
    client_w: asyncio.StreamWriter,
    target: tuple[str, int],
    delay: float,
) -> None:
    try:
        node_r, node_w = await asyncio.open_connection(*target)
    except OSError:
        client_w.close()
        return
    try:
        await asyncio.gather(
            _pump(client_r, node_w, delay), _pump(node_r, client_w, delay), return_exceptions=True
        )
    finally:
        for w in (node_w, client_w):
            w.close()


async def serve(
    listen: str, routes: Sequence[tuple[int, str, int]], delay: float, ready: asyncio.Event
) -> None:
    """Listen on ``listen:port`` for every (port, host, host_port) route until cancelled."""
    servers = []
    for port, host, host_port in routes:

        async def handle(
            r: asyncio.StreamReader, w: asyncio.StreamWriter, t: tuple[str, int] = (host, host_port)
        ) -> None:
            # Cancelled at shutdown: end quietly (Python 3.11's stream callback would
            # otherwise log a traceback for every connection still open).
            with contextlib.suppress(asyncio.CancelledError):
                await _relay_one(r, w, t, delay)

        servers.append(await asyncio.start_server(handle, listen, port, backlog=512))
    ready.set()
    try:
        await asyncio.Event().wait()
    finally:
        for server in servers:
            server.close()


def parse_route(text: str) -> tuple[int, str, int]:
    """``PORT=HOST:PORT`` as (listen port, host, port); ValueError names the bad text."""
    port, sep, target = text.partition("=")
    host, colon, host_port = target.rpartition(":")
    if not (sep and colon and host and port.isdigit() and host_port.isdigit()):
        raise ValueError(f"route {text!r}: expected LISTENPORT=HOST:PORT")
    return int(port), host, int(host_port)


class Relay:
    """The relay process, started and ended by its pid."""

    def __init__(self, proc: subprocess.Popen[str], listen: str, delay: float) -> None:
        self.proc = proc
        self.listen = listen
        self.delay = delay

    @classmethod
    def start(
        cls, routes: Sequence[tuple[int, str, int]], listen: str, delay: float, timeout: float = 30
    ) -> Relay:
        argv = [sys.executable, "-m", "testsupport.relay", "--listen", listen]
        argv += ["--delay-ms", f"{delay * 1000:g}"]
        argv += [f"{port}={host}:{host_port}" for port, host, host_port in routes]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        relay = cls(proc, listen, delay)
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()  # bounded: the child prints or exits
        if line != READY:
            relay.stop()
            raise RuntimeError(f"relay did not start (exit {proc.poll()}): {line!r}")
        return relay

    def stop(self, timeout: float = 5.0) -> int:
        """SIGTERM the relay (its pid), wait, SIGKILL if it lingers; its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return self.proc.returncode

    def __enter__(self) -> Relay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def relayed_known_hosts(known_hosts: Path, ports: dict[str, int], listen: str, out: Path) -> Path:
    """known_hosts with each node's key also under ``[listen]:port``, where ssh looks it up
    when it connects through the relay (a key is recorded per address and port)."""
    lines = known_hosts.read_text().splitlines()
    extra = []
    for line in lines:
        names, _, key = line.partition(" ")
        for name in names.split(","):
            if name in ports:
                extra.append(f"[{listen}]:{ports[name]} {key}")
    out.write_text("\n".join([*lines, *extra]) + "\n")
    return out


def relayed_hosts(
    cluster: Cluster, port_base: int, folder: Path
) -> tuple[dict[str, dict[str, object]], str]:
    """Inventory overrides that send every node of ``cluster`` through the relay's port
    ``port_base + index``, and the ssh options (a known_hosts with the keys under those
    ports, checked strictly) both cpuaccel and Ansible take from the inventory."""
    ports = {node.name: port_base + node.index for node in cluster.nodes}
    known = relayed_known_hosts(
        cluster.known_hosts_path, ports, cluster.controller_address, folder / "known_hosts"
    )
    overrides: dict[str, dict[str, object]] = {
        name: {"ansible_host": cluster.controller_address, "ansible_port": port}
        for name, port in ports.items()
    }
    return overrides, f"-o UserKnownHostsFile={known} -o StrictHostKeyChecking=yes"


async def _main_async(listen: str, routes: list[tuple[int, str, int]], delay: float) -> None:
    ready = asyncio.Event()
    task = asyncio.ensure_future(serve(listen, routes, delay, ready))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    waiter = asyncio.ensure_future(ready.wait())
    await asyncio.wait([task, waiter], return_when=asyncio.FIRST_COMPLETED)
    if ready.is_set():
        print(READY, flush=True)
    with contextlib.suppress(asyncio.CancelledError):
        await task
    # Connections still open (Ansible's ControlPersist masters): cancel and await their
    # tasks here, or asyncio logs each one as destroyed while pending.
    others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for other in others:
        other.cancel()
    await asyncio.gather(*others, return_exceptions=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testsupport.relay")
    parser.add_argument("--listen", required=True, help="address the relay listens on")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="added per chunk, per way")
    parser.add_argument("routes", nargs="+", help="LISTENPORT=HOST:PORT")
    args = parser.parse_args(argv)
    if not 0 <= args.delay_ms <= 10_000:
        parser.error(f"--delay-ms {args.delay_ms}: expected 0..10000")
    try:
        routes = [parse_route(r) for r in args.routes]
    except ValueError as exc:
        parser.error(str(exc))
    asyncio.run(_main_async(args.listen, routes, args.delay_ms / 1000))
    return 0


if __name__ == "__main__":
    sys.exit(main())
