"""A real headless browser for the dashboard's page tests: Playwright's sync API
driving Debian's chromium (/usr/bin/chromium, not a Playwright download), with a fresh
context (its own cookies, storage and cache) per browser and no network but the
dashboard's own server. One :class:`Chromium` process may serve several browsers in
turn, so that a file of page tests starts chromium once.

Every request the page makes goes through a route: one to another address than the
server's (a CDN, a font, a telemetry ping) is refused and recorded, and ``close`` (or
``assert_offline``) fails the test that caused it: the page must work offline.
Screenshots go to ``artifacts/dashboard/`` in the repo (gitignored), kept for people
to look at.
"""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from playwright.sync_api import (
    Browser as PlaywrightBrowser,
)
from playwright.sync_api import (
    BrowserContext,
    Page,
    Playwright,
    Route,
    ViewportSize,
    sync_playwright,
)

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts" / "dashboard"
# No sandbox (tests run as root), no GPU, and none of chromium's own network traffic
# (QUIC probes, component updates, sync, first-run pages).
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT: ViewportSize = {"width": 1400, "height": 1000}


def origin(url: str) -> tuple[str, str, int | None]:
    parts = urllib.parse.urlsplit(url)
    return parts.scheme, parts.hostname or "", parts.port


class Chromium:
    """One headless chromium process, for browsers opened on it one after another."""

    def __init__(self) -> None:
        self._playwright: Playwright | None = None
        self.process: PlaywrightBrowser | None = None

    def __enter__(self) -> Chromium:
        self._playwright = sync_playwright().start()
        try:
            self.process = self._playwright.chromium.launch(
                executable_path=CHROMIUM, headless=True, args=FLAGS
            )
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        if self.process is not None:
            self.process.close()
            self.process = None
        if self._playwright is not None:
            self._playwright.stop()
            self._playwright = None


class Browser:
    """A fresh browser context allowed to reach ``base`` only: on ``chromium`` when one
    is given, else on a chromium of its own."""

    def __init__(
        self, base: str, shots: Path = ARTIFACTS, chromium: Chromium | None = None
    ) -> None:
        self.base = base.rstrip("/")
        self.allowed = origin(self.base)
        if self.allowed[1] != "127.0.0.1":
            raise ValueError(f"the page is tested on 127.0.0.1 only, not {base}")
        self.shots = shots
        self.external: list[str] = []  # requests refused: each one fails the test
        self.errors: list[str] = []  # uncaught exceptions in the page's scripts
        self._chromium = chromium
        self._own: Chromium | None = None
        self._context: BrowserContext | None = None

    def __enter__(self) -> Browser:
        try:
            chromium = self._chromium
            if chromium is None:
                chromium = self._own = Chromium().__enter__()
            assert chromium.process is not None, "use Chromium as a context manager"
            self._context = chromium.process.new_context(
                viewport=VIEWPORT,
                service_workers="block",  # their fetches would bypass the route
            )
            self._context.route("**/*", self._guard)
            self._context.on("request", lambda request: self._check(request.url))
        except BaseException:
            self._stop()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop()
        if kind is None:
            self.assert_offline()

    def _local(self, url: str) -> bool:
        # data: and blob: URLs are made in the page itself, no network involved.
        return url.startswith(("data:", "blob:", "about:")) or origin(url) == self.allowed

    def _check(self, url: str) -> None:
        if not self._local(url) and url not in self.external:
            self.external.append(url)

    def _guard(self, route: Route) -> None:
        url = route.request.url
        if self._local(url):
            route.continue_()
        else:
            self._check(url)
            route.abort("blockedbyclient")

    def _stop(self) -> None:
        if self._context is not None:
            self._context.close()
            self._context = None
        if self._own is not None:
            self._own.close()
            self._own = None

    def assert_offline(self) -> None:
        assert not self.external, f"the page asked for other addresses: {self.external}"
        assert not self.errors, f"the page's scripts failed: {self.errors}"

    def open(self, path: str) -> Page:
        """A new tab on ``base + path``, loaded."""
        assert self._context is not None, "use Browser as a context manager"
        page = self._context.new_page()
        page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        page.goto(self.base + path, wait_until="load")
        return page

    def shot(self, page: Page, name: str) -> Path:
        """A full-page screenshot ``artifacts/dashboard/<name>.png``."""
        self.shots.mkdir(parents=True, exist_ok=True)
        path = self.shots / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path


def wait_for(
    page: Page, probe: Callable[[], bool], what: str, timeout: float = 30.0, every: float = 0.2
) -> None:
    """Wait (bounded) until ``probe()`` holds, letting the page's timers run meanwhile;
    fail naming ``what`` when it never does."""
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        page.wait_for_timeout(every * 1000)


def points(page: Page) -> int:
    """The points in the loss chart (``#charts[data-points]``)."""
    return int(page.get_attribute("#charts", "data-points") or 0)
