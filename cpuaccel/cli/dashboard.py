"""``cpuaccel dashboard``: the live run page of ./runs, served until Ctrl-C.

The server (cpuaccel/dashboard/server.py: Starlette on uvicorn) is imported only when
the page is served: starlette and uvicorn are no part of any other verb's start-up.
``Page`` is the part ``run --dashboard`` shares (cli/run.py).
"""

from __future__ import annotations

import contextlib
import errno
import html
import ipaddress
import os
import signal
import socket
import sys
import tempfile
import threading
import time
import webbrowser
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from cpuaccel import ui
from cpuaccel.api.heads import Heads
from cpuaccel.cli.options import head_options
from cpuaccel.errors import CpuaccelError, UsageError
from cpuaccel.history import records
from cpuaccel.jobs import teardown as stop_engine
from cpuaccel.ui import escape

if TYPE_CHECKING:
    from cpuaccel.dashboard.remote import Watcher
    from cpuaccel.dashboard.server import Server

EPILOG = """\b
Examples:
  cpuaccel dashboard                     # http://127.0.0.1:8265/?token=... opens
  cpuaccel dashboard --no-browser --port 9000
  cpuaccel dashboard -i inventory.yaml   # detached runs' heads reached through it
  cpuaccel dashboard --bind 0.0.0.0      # reachable from other machines: says so
  ssh -L 8265:127.0.0.1:8265 controller  # or: watch it from a laptop through ssh
  cpuaccel run --dashboard train.py      # the page of the run it starts

\b
The page lists the runs of ./runs (run it from the project folder); each run's page
shows its nodes × ranks and their state, loss, samples/s and gradient-sync share as
steps arrive, each rank's last log lines, and a Stop button (as cpuaccel stop). The
URL printed carries a token made for this server: the page's requests need it.
A detached run whose head is another machine is copied home while its page is open.

\b
Exit codes: 0 after Ctrl-C; 64 a bad flag or the port in use.
"""
DEFAULT_PORT = 8265
LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1"}


def is_loopback(bind: str) -> bool:
    if bind.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(bind).is_loopback
    except ValueError:
        return False


def _addresses(name: str) -> set[str]:
    try:
        return {str(info[4][0]) for info in socket.getaddrinfo(name, None)}
    except OSError:
        return set()


def allowed_hosts(bind: str) -> set[str]:
    """The names a request may give in its Host header: loopback's, and the bound
    address's (for a wildcard bind, this machine's names and their addresses)."""
    found = set(LOOPBACK_NAMES) | {bind.lower()}
    if not is_loopback(bind):
        for name in (socket.gethostname(), socket.getfqdn()):
            found |= {name.lower()} | _addresses(name)
    return found


def url_host(bind: str) -> str:
    if bind in ("0.0.0.0", "::", ""):
        return socket.getfqdn()
    return f"[{bind}]" if ":" in bind else bind


class Wiring:
    """How the server reaches nodes: the heads of detached runs (ps's Heads) and the
    stop engine, both through -i (else the inventory each run recorded)."""

    def __init__(self, inventory_path: str | None, connect_timeout: float, no_hkc: bool) -> None:
        self.inventory_path = inventory_path
        self.heads = Heads(inventory_path, connect_timeout, no_hkc)
        self.stopping = 0  # stops under way: the server waits for them before it ends
        self.idle = threading.Condition()

    def stop(self, folder: Path) -> dict[str, Any]:
        with self.idle:
            self.stopping += 1
        try:
            return self._stop(folder)
        finally:
            with self.idle:
                self.stopping -= 1
                self.idle.notify_all()

    def wait_idle(self, seconds: float) -> None:
        """Until no stop is under way (a run --dashboard page stopping its own run ends
        the run first; its answer is still given), at most ``seconds``."""
        with self.idle:
            self.idle.wait_for(lambda: self.stopping == 0, seconds)

    def _stop(self, folder: Path) -> dict[str, Any]:
        from cpuaccel.cli.stop import run_hosts

        record = stop_engine.read_record(folder)
        path = self.inventory_path or record.get("inventory")
        target = self.heads.target(str(path) if path else None)
        hosts = run_hosts(target, record)
        done = stop_engine.stop(folder, record, hosts, target.connect, target.forks)
        swept = {host: len(procs) for host, procs in done.swept.items()}
        return {"state": done.state, "already": done.already, "left": done.left, "swept": swept}

    def close(self) -> None:
        self.heads.close()


class Page:
    """The server, its token and its remote watcher, started on ``bind:port``."""

    def __init__(self, bind: str, port: int, wiring: Wiring, runs: Path) -> None:
        from cpuaccel.dashboard.remote import Watcher
        from cpuaccel.dashboard.server import Server, Services, build_app, new_token

        self.bind, self.wiring = bind, wiring
        self.token = new_token()
        self.watcher: Watcher = Watcher(wiring.heads.connector)
        services = Services(runs, self.token, allowed_hosts(bind), wiring.stop, self.watcher)
        try:
            self.server: Server = Server(build_app(services), bind, port)
        except OSError as exc:
            self.watcher.close()
            in_use = exc.errno == errno.EADDRINUSE
            raise UsageError(
                f"--port {port} --bind {bind!r}: cannot listen there ({exc.strerror or exc})",
                hint="give another port (--port 0 takes any free one), or stop what uses it"
                if in_use
                else "give an address of this machine, e.g. --bind 127.0.0.1",
            ) from None
        try:
            self.server.start()
        except OSError as exc:  # uvicorn ended, or did not listen in time: one line
            self.watcher.close()
            raise CpuaccelError(str(exc), hint="try again, or another --port") from None
        self.redirect: Path | None = None

    def url(self, path: str = "/") -> str:
        return f"http://{url_host(self.bind)}:{self.server.port}{path}?token={self.token}"

    def announce(self, path: str = "/", browser: bool = True) -> None:
        err = ui.stderr()
        if not is_loopback(self.bind):
            err.print(
                f"[yellow]warning:[/] the dashboard listens on {escape(self.bind)}, not only "
                "this machine: anyone who can reach it and has the URL's token can stop runs"
            )
        err.print(f"dashboard: {escape(self.url(path))}", highlight=False, soft_wrap=True)
        if browser:
            self.redirect = open_browser(self.url(path))

    def close(self) -> None:
        self.wiring.wait_idle(stop_engine.SUPERVISOR_WAIT + 60)
        self.server.stop()
        self.watcher.close(wait=2.0)
        self.wiring.close()
        if self.redirect is not None:
            self.redirect.unlink(missing_ok=True)


def can_open_browser() -> bool:
    return bool(
        os.environ.get("BROWSER")
        or os.environ.get("DISPLAY")
        or os.environ.get("WAYLAND_DISPLAY")
        or sys.platform in ("darwin", "win32")
    )


def open_browser(url: str) -> Path | None:
    """Open ``url`` through a 0600 file that redirects to it (as Jupyter does): the
    token never appears in a browser's argv, which other users can read in ps."""
    if not can_open_browser():
        return None
    fd, name = tempfile.mkstemp(prefix="cpuaccel-dashboard-", suffix=".html")  # 0600
    href = html.escape(url, quote=True)
    with os.fdopen(fd, "w") as f:
        f.write(f'<!doctype html><meta http-equiv="refresh" content="0;url={href}">')
        f.write(f'<a href="{href}">cpuaccel dashboard</a>\n')
    with contextlib.suppress(webbrowser.Error):  # the URL is printed: the user opens it
        webbrowser.open(Path(name).as_uri())
    return Path(name)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM ends the server as Ctrl-C does: cleanly


def serve_until_interrupted(page: Page) -> None:
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        while page.server.thread.is_alive():
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        page.close()
    ui.stderr().print("dashboard stopped")


@click.command(epilog=EPILOG)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=DEFAULT_PORT,
    show_default=True,
    help="The port to listen on (0: any free one).",
)
@click.option(
    "--bind",
    default="127.0.0.1",
    show_default=True,
    metavar="ADDR",
    help="The address to listen on. Another than loopback makes the page (and its "
    "Stop button) reachable from other machines: a warning says so.",
)
@click.option("--no-browser", is_flag=True, help="Print the URL only; open no browser.")
@head_options
def dashboard_command(
    port: int,
    bind: str,
    no_browser: bool,
    inventory_path: str | None,
    connect_timeout: float,
    no_host_key_checking: bool,
) -> None:
    """Serve the live page of the runs in ./runs (state, charts, logs, stop) until Ctrl-C."""
    runs = records.runs_folder()
    wiring = Wiring(inventory_path, connect_timeout, no_host_key_checking)
    try:
        page = Page(bind, port, wiring, runs)
    except BaseException:
        wiring.close()
        raise
    if not runs.is_dir():
        ui.stderr().print(f"no runs in {escape(str(runs))} yet: the list fills as runs start")
    page.announce("/", browser=not no_browser)
    serve_until_interrupted(page)
