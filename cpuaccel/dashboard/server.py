"""The dashboard's web server: a Starlette app served by uvicorn from a thread.

Routes (the contract with the page, static/): ``/`` and ``/run/{id}`` serve
static/index.html, ``/static/`` the page's files, ``/api/ping``, ``/api/runs``,
``/api/runs/{id}?since=N&tail=K`` (snapshot.RunView) and ``POST /api/runs/{id}/stop``.
Every ``/api/`` request carries the server's token (header X-Cpuaccel-Token): the page
can stop jobs, and any local process or web page could otherwise call it. Every request
names this server in its Host header (a DNS-rebinding page names its own domain). A run
id is one of ./runs' ids (records.run_ids) before any path is made from it. Every
response forbids framing (``NoFraming``): a page that frames the dashboard could lead
a click onto its Stop button.
A client is bounded (``Bounded``): at most MAX_CONNECTIONS at once, a whole request
within REQUEST_SECONDS of its first byte (or of the connection, or of the previous
answer), its headers within HEADER_BYTES and its body within BODY_BYTES: a few dozen
sockets that send a header byte now and then (slowloris) are closed, not waited for,
and the owner's page is answered meanwhile.
Imported only by the ``dashboard`` verb and ``run --dashboard``: starlette and uvicorn
cost start-up time that no other verb should pay.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h11
import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.gzip import GZipMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from cpuaccel.dashboard.remote import Watcher
from cpuaccel.dashboard.snapshot import DEFAULT_TAIL, MAX_TAIL, RunView
from cpuaccel.errors import EXIT_NODE_FAILED, CpuaccelError
from cpuaccel.history.records import load, row, run_ids

STATIC = Path(__file__).parent / "static"
TOKEN_HEADER = "x-cpuaccel-token"
START_WAIT = 30.0  # seconds uvicorn may take to listen on the socket bound here
MISSING = "<!doctype html><title>cpuaccel</title><p>The page's files are missing (static/).</p>"
FRAME_ANCESTORS = b"frame-ancestors 'none'"
CSP = b"content-security-policy"
XFO = b"x-frame-options"
Stopper = Callable[[Path], dict[str, Any]]
# Bounds on a client (Bounded): a browser sends its few hundred bytes of a request at
# once and opens a handful of connections.
MAX_CONNECTIONS = 64
REQUEST_SECONDS = 5.0
HEADER_BYTES = 16 << 10
BODY_BYTES = 64 << 10


def new_token() -> str:
    return secrets.token_urlsafe(24)


@dataclass
class Services:
    """What the app serves: the runs folder, its token, who may be named as Host, and
    how a run is stopped and a remote one kept live (given by the verb, which owns the
    inventory and the connections)."""

    runs: Path
    token: str
    hosts: set[str]
    stopper: Stopper | None = None
    watcher: Watcher | None = None
    views: dict[str, RunView] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def view(self, run_id: str) -> RunView:
        with self.lock:
            if run_id not in self.views:
                self.views[run_id] = RunView(self.runs / run_id)
            return self.views[run_id]


def _json(doc: Any, status: int = 200) -> Response:
    body = json.dumps(doc, separators=(",", ":"), allow_nan=False)
    return Response(body, status, media_type="application/json")


def error(message: str, fix: str, status: int) -> Response:
    return _json({"error": message, "fix": fix}, status)


def host_name(header: str) -> str:
    """The name in a Host header, without its port ("[::1]:80" -> "::1")."""
    if header.startswith("["):
        return header[1:].split("]", 1)[0].lower()
    return header.rsplit(":", 1)[0].lower() if header.count(":") == 1 else header.lower()


class Bounded(H11Protocol):
    """uvicorn's h11 protocol, bounded against slow or greedy clients.

    A connection past MAX_CONNECTIONS is closed as it is made. Each request (its line,
    headers and body) must have arrived REQUEST_SECONDS after the connection is made or
    the previous answer is sent, else the connection is closed: a client that trickles
    a header byte at a time holds nothing for long. One that stops reading our answers
    is dropped after REQUEST_SECONDS of that. More than HEADER_BYTES + BODY_BYTES
    for one request closes the connection too (a chunked body says no length up front;
    h11 itself refuses headers past HEADER_BYTES with a 400, and ``Guard`` a declared
    length past BODY_BYTES with a 413)."""

    deadline: asyncio.TimerHandle | None = None
    stuck: asyncio.TimerHandle | None = None  # the client takes none of our answer
    taken = 0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > MAX_CONNECTIONS:
            transport.close()
            return
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self.stuck is not None:
            self.stuck.cancel()
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        """The answer waits on the client: if it reads none of it for REQUEST_SECONDS,
        the connection is dropped (a close would wait for the client to read)."""
        super().pause_writing()
        if self.stuck is None:
            self.stuck = self.loop.call_later(REQUEST_SECONDS, self.transport.abort)

    def resume_writing(self) -> None:
        if self.stuck is not None:
            self.stuck.cancel()
            self.stuck = None
        super().resume_writing()

    def data_received(self, data: bytes) -> None:
        self.taken += len(data)
        if self.taken > HEADER_BYTES + BODY_BYTES and self.conn.their_state is not h11.DONE:
            self._close()
            return
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE and self.conn.their_state is not h11.SEND_BODY:
            self._disarm()  # the whole request is here (or the connection is ending)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self._arm()  # the next request on this connection has its own time

    def _arm(self) -> None:
        self._disarm()
        self.taken = 0
        self.deadline = self.loop.call_later(REQUEST_SECONDS, self._close)

    def _disarm(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None

    def _close(self) -> None:
        self._disarm()
        if not self.transport.is_closing():
            self.transport.close()


class Guard:
    """Refuses a request whose Host is not this server's (400), a body declared longer
    than BODY_BYTES (413), and an /api/ request without the token (403), before any
    route sees it."""

    def __init__(self, app: ASGIApp, services: Services) -> None:
        self.app = app
        self.services = services

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        refused: Response | None = None
        if host_name(headers.get("host", "")) not in self.services.hosts:
            refused = error(
                f"Host {headers.get('host', '')!r} is not this server's",
                "open the URL cpuaccel dashboard printed",
                400,
            )
        elif _declared_length(headers.get("content-length", "0")) > BODY_BYTES:
            refused = error(
                f"a request body of more than {BODY_BYTES} bytes",
                "send the page's own requests",
                413,
            )
        elif scope["path"].startswith("/api/") and not secrets.compare_digest(
            headers.get(TOKEN_HEADER, "").encode(), self.services.token.encode()
        ):
            refused = error(
                "missing or wrong token", "open the URL cpuaccel dashboard printed", 403
            )
        if refused is not None:
            await refused(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _declared_length(text: str) -> int:
    """A Content-Length header's value (h11 has checked it is a whole number)."""
    try:
        return int(text)
    except ValueError:
        return 0


def unframed(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """A response's headers, saying that no page may frame it: ``frame-ancestors 'none'``
    in each Content-Security-Policy header (replacing a frame-ancestors it had), or in
    one of its own when there is none, and ``X-Frame-Options: DENY`` (for browsers that
    do not know frame-ancestors). The page's meta CSP cannot say either: browsers
    ignore frame-ancestors in a meta element."""
    kept: list[tuple[bytes, bytes]] = []
    policies = 0
    for name, value in headers:
        lower = name.lower()
        if lower == XFO:
            continue
        if lower == CSP:
            directives = [d.strip() for d in value.split(b";")]
            others = [d for d in directives if d and not d.lower().startswith(b"frame-ancestors")]
            value = b"; ".join([*others, FRAME_ANCESTORS])
            policies += 1
        kept.append((name, value))
    if not policies:
        kept.append((CSP, FRAME_ANCESTORS))
    return [*kept, (XFO, b"DENY")]


class NoFraming:
    """Every response of the app it wraps (the whole app: its refusals and its 500s
    too) carries the headers of :func:`unframed`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def framed(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": unframed(message.get("headers") or [])}
            await send(message)

        await self.app(scope, receive, framed)


def _run_id(request: Request, services: Services) -> str | None:
    """The path's run id when it is one of ./runs' (checked before any path is made)."""
    run_id = str(request.path_params["run_id"])
    return run_id if run_id in run_ids(services.runs) else None


def _no_run(request: Request) -> Response:
    return error(
        f"no run {request.path_params['run_id']!r} in this project's runs/",
        "pick a run from the list (cpuaccel ps)",
        404,
    )


def _int_param(request: Request, name: str, default: int, high: int | None) -> int | None:
    text = request.query_params.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        return None
    return value if value >= 0 and (high is None or value <= high) else None


def build_app(services: Services) -> ASGIApp:
    async def page(request: Request) -> Response:
        index = STATIC / "index.html"
        if not index.is_file():  # a tree without the page's files (a broken install)
            return Response(MISSING, 500, media_type="text/html")
        return FileResponse(index, headers={"Cache-Control": "no-store"})

    async def ping(request: Request) -> Response:
        return _json({"ok": True, "time": time.time()})

    async def runs(request: Request) -> Response:
        return _json(await run_in_threadpool(_rows, services))

    async def one(request: Request) -> Response:
        run_id = _run_id(request, services)
        if run_id is None:
            return _no_run(request)
        since = _int_param(request, "since", 0, None)
        tail = _int_param(request, "tail", DEFAULT_TAIL, MAX_TAIL)
        if since is None or tail is None:
            return error(
                "since and tail are whole numbers (tail at most 50)", "reload the page", 400
            )
        doc = await run_in_threadpool(_one, services, run_id, since, tail)
        return _json(doc)

    async def stop(request: Request) -> Response:
        run_id = _run_id(request, services)
        if run_id is None:
            return _no_run(request)
        if services.stopper is None:
            return error("this server cannot stop runs", "use cpuaccel stop", 501)
        try:
            done = await run_in_threadpool(services.stopper, services.runs / run_id)
        except CpuaccelError as exc:  # a node unreachable (69) is the gateway's failure
            status = 502 if exc.exit_code == EXIT_NODE_FAILED else 409
            return error(exc.message, exc.hint or f"try cpuaccel stop {run_id}", status)
        except OSError as exc:
            return error(f"stopping {run_id}: {exc}", f"try cpuaccel stop {run_id}", 500)
        return _json(done)

    routes = [
        Route("/", page),
        Route("/run/{run_id}", page),
        Route("/api/ping", ping),
        Route("/api/runs", runs),
        Route("/api/runs/{run_id}", one),
        Route("/api/runs/{run_id}/stop", stop, methods=["POST"]),
        Mount("/static", StaticFiles(directory=STATIC, check_dir=False), name="static"),
    ]
    middleware = [
        Middleware(Guard, services=services),
        Middleware(GZipMiddleware, minimum_size=1024),
    ]
    return NoFraming(Starlette(routes=routes, middleware=middleware))


def _rows(services: Services) -> dict[str, Any]:
    now = time.time()
    found = []
    for run_id in reversed(run_ids(services.runs)):
        run = load(services.runs / run_id)
        if services.watcher is not None and run.state() == "running":
            services.watcher.touch(run)  # a remote run's state comes from its head
        found.append(row(run, now))
    return {"runs": found}


def _one(services: Services, run_id: str, since: int, tail: int) -> dict[str, Any]:
    view = services.view(run_id)
    doc = view.snapshot(since, tail)
    if services.watcher is not None:
        remote = services.watcher.touch(load(view.path))
        if remote is not None:
            doc["remote"] = remote
    return doc


class Server:
    """uvicorn serving ``app`` from a thread of this process (the verb's, or run's).

    The socket is bound here, before the thread starts: a port in use is an OSError
    the caller turns into one line, not uvicorn's log and exit inside its thread."""

    def __init__(self, app: ASGIApp, host: str, port: int) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.sock.bind((host, port))
        except OSError:
            self.sock.close()
            raise
        self.port = int(self.sock.getsockname()[1])  # the one the system gave for 0
        config = uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            http=Bounded,
            ws="none",  # no route speaks WebSocket: no upgrade escapes Bounded's deadline
            limit_concurrency=MAX_CONNECTIONS,  # requests past it are answered 503
            h11_max_incomplete_event_size=HEADER_BYTES,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self._serve, name="dashboard", daemon=True)

    def _serve(self) -> None:
        self.server.run(sockets=[self.sock])

    def start(self) -> None:
        """Serve from the thread; returns once uvicorn listens."""
        self.thread.start()
        deadline = time.monotonic() + START_WAIT  # nothing waits forever
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise OSError(f"the dashboard server did not start within {START_WAIT:g} s")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(5.0)
        self.sock.close()
