"""The live run page in a real headless browser (Debian's chromium through Playwright,
testsupport/browser.py) against the real server on fake run folders
(testsupport/fake_run.py): the runs list, 64 ranks, charts growing as lines arrive,
100k metric lines, hostile log lines, the token, the Stop button. Every test also fails
if the page asks for any address but the server's own (no CDN). Screenshots:
artifacts/dashboard/page-*.png. The real job: tests/cluster/test_dashboard_page.py."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("playwright")

from cpuaccel.dashboard.server import Server, Services, build_app
from cpuaccel.errors import UsageError
from testsupport.browser import CHROMIUM, Browser, Chromium, points, wait_for
from testsupport.fake_run import FakeRun, make_run, metric_line

if not os.access(CHROMIUM, os.X_OK):
    pytest.skip(f"no {CHROMIUM} (tools/system-deps.sh installs it)", allow_module_level=True)

TOKEN = "page-test-token"
HOSTILE = '<script>window.pwned = 1</script><img src="/x" onerror="window.pwned = 2"> & <b>bold</b>'


class Stopper:
    """What the page's Stop does on the server, for fake runs: records the call, then
    ends the fake run, or fails as the stop engine does when it cannot reach the head."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.fail = False
        self.runs: dict[str, FakeRun] = {}

    def __call__(self, folder: Path) -> dict[str, Any]:
        self.calls.append(folder.name)
        if self.fail:
            raise UsageError("node0 is not in the inventory", hint="give -i INVENTORY")
        self.runs[folder.name].end("stopped")
        return {"state": "stopped", "already": False, "left": {}}


@pytest.fixture
def stopper() -> Stopper:
    return Stopper()


@pytest.fixture(scope="module")
def chromium() -> Iterator[Chromium]:
    """One chromium for the file's tests; each test's browser is a fresh context on it."""
    with Chromium() as started:
        yield started


@pytest.fixture
def browser(runs: Path, stopper: Stopper, chromium: Chromium) -> Iterator[Browser]:
    services = Services(runs, TOKEN, {"127.0.0.1"}, stopper)
    server = Server(build_app(services), "127.0.0.1", 0)
    server.start()
    try:
        with Browser(f"http://127.0.0.1:{server.port}", chromium=chromium) as opened:
            yield opened
    finally:
        server.stop()


def states(page: Any) -> list[str]:
    found: list[str] = page.eval_on_selector_all(
        "#ranks [data-rank]", "cells => cells.map(c => c.dataset.state)"
    )
    return found


def test_runs_list_shows_every_run_and_takes_the_token_out_of_the_address(
    browser: Browser, runs: Path
) -> None:
    running = make_run(runs, nodes=2, ppn=2, metrics=30)
    done = make_run(runs, nodes=1, ppn=4, metrics=10, state="succeeded")
    failed = make_run(runs, nodes=3, ppn=1, metrics=5, state="failed")
    page = browser.open(f"/?token={TOKEN}")
    page.wait_for_selector("#runs tr[data-run]")
    wait_for(page, lambda: page.locator("#runs tr[data-run]").count() == 3, "3 rows")
    for run, state, shape in ((running, "running", "2 × 2"), (done, "succeeded", "1 × 4")):
        row = page.locator(f'#runs tr[data-run="{run.run_id}"]')
        assert row.locator("td.state").text_content() == state
        assert shape in (row.text_content() or "")
        assert row.locator("a").get_attribute("href") == f"/run/{run.run_id}"
    failed_row = page.locator(f'#runs tr[data-run="{failed.run_id}"]')
    assert failed_row.locator("td.state").text_content() == "failed"
    assert "token" not in page.url  # history.replaceState took it out
    assert page.evaluate("localStorage.getItem('cpuaccel-token')") == TOKEN
    browser.shot(page, "page-list")
    page.click(f'a[href="/run/{running.run_id}"]')  # the link opens the run: token kept
    page.wait_for_selector("#ranks [data-rank]")
    assert page.text_content("#state") == "running"


def test_a_run_of_64_ranks_shows_every_rank_its_node_and_its_log(
    browser: Browser, runs: Path
) -> None:
    run = make_run(runs, nodes=16, ppn=4, metrics=200, log_lines=8)
    page = browser.open(f"/run/{run.run_id}?token={TOKEN}")
    wait_for(page, lambda: page.locator("#ranks [data-rank]").count() == 64, "64 ranks")
    assert states(page) == ["running"] * 64
    assert page.locator("#ranks .node").count() == 16
    node3 = page.locator('#ranks .node[data-host="node3"] [data-rank]')
    assert node3.evaluate_all("cells => cells.map(c => c.dataset.rank)") == [
        "12",
        "13",
        "14",
        "15",
    ]
    assert page.locator("#logs [data-log-rank]").count() == 64
    last = page.text_content('#logs [data-log-rank="63"] pre') or ""
    assert last.splitlines()[-1] == "rank 63 line 7: step 200 ok"
    assert page.text_content("#f-shape") == "16 × 4"
    assert page.text_content("#f-precision") == "bf16"
    assert page.is_visible("#stop")
    wait_for(page, lambda: points(page) == 200, "the 200 points")
    browser.shot(page, "page-64-ranks")


def test_the_charts_gain_points_as_lines_arrive_and_the_page_settles_when_the_run_ends(
    browser: Browser, runs: Path
) -> None:
    run = make_run(runs, nodes=2, ppn=2, metrics=40)
    page = browser.open(f"/run/{run.run_id}?token={TOKEN}")
    wait_for(page, lambda: points(page) == 40, "the first 40 points")
    for total in (55, 70, 85):
        run.append_metrics(15)
        run.append_logs(1)
        wait_for(page, lambda total=total: points(page) == total, f"{total} points")
    assert page.text_content("#f-step") == "84"
    tail = page.text_content('#logs [data-log-rank="1"] pre') or ""
    assert tail.splitlines()[-1] == "rank 1 line 22: step 85 ok"
    browser.shot(page, "page-chart-growing")
    run.end("failed", {1: 3})
    wait_for(page, lambda: page.text_content("#state") == "failed", "the state failed")
    wait_for(page, lambda: page.get_attribute("#live", "data-live") == "ended", "polls ending")
    assert states(page) == ["failed"] * 4  # rank 1 by its code, the others by the run's
    assert page.get_attribute('[data-rank="1"]', "data-state") == "failed"
    assert "exit 3" in (page.get_attribute('[data-rank="1"]', "title") or "")
    assert not page.is_visible("#stop")
    browser.shot(page, "page-chart-ended")


def test_100k_metric_lines_load_decimated_then_update(browser: Browser, runs: Path) -> None:
    run = make_run(runs, nodes=16, ppn=4, metrics=100_000)
    page = browser.open(f"/run/{run.run_id}?token={TOKEN}")
    wait_for(page, lambda: points(page) > 0, "the first load", timeout=120)
    first = points(page)
    assert first <= 2000  # the server's bound: every k-th line, the last kept
    assert "every k-th" in (page.text_content("#points-note") or "")
    # (kept below the charts' title after the updates: the points are still thinned)
    assert page.text_content("#f-step") == "99999"
    run.append_metrics(300)
    wait_for(page, lambda: points(page) == first + 300, "300 more points", timeout=120)
    run.append_metrics(300)
    wait_for(page, lambda: points(page) == first + 600, "300 more again", timeout=120)
    assert page.text_content("#f-step") == "100599"
    assert page.locator("#ranks [data-rank]").count() == 64
    browser.shot(page, "page-100k-lines")


def test_a_rewritten_metrics_file_drops_the_old_points(browser: Browser, runs: Path) -> None:
    run = make_run(runs, nodes=1, ppn=2, metrics=50)
    page = browser.open(f"/run/{run.run_id}?token={TOKEN}")
    wait_for(page, lambda: points(page) == 50, "the first 50 points")
    fresh = run.path / "metrics.new"  # a run restarted in the same folder: a new file
    fresh.write_text("".join(metric_line(s, 0.0, first=s == 0, world=2) for s in range(10)))
    fresh.replace(run.path / "metrics.jsonl")
    wait_for(page, lambda: points(page) == 10, "the 10 points of the new file")
    steps = page.evaluate("window.cpuaccelCharts.data.step")
    assert steps == list(range(10))
    browser.shot(page, "page-reset")


def test_log_lines_with_html_stay_text(browser: Browser, runs: Path) -> None:
    run = make_run(runs, nodes=1, ppn=2, metrics=10)
    with (run.path / "rank-1.log").open("a") as log:
        log.write(HOSTILE + "\n")
    page = browser.open(f"/run/{run.run_id}?token={TOKEN}")
    wait_for(page, lambda: HOSTILE in (page.text_content("#logs") or ""), "the hostile line")
    assert page.locator("#logs script, #logs img, #logs b").count() == 0
    assert page.evaluate("window.pwned") is None
    assert (page.text_content('[data-log-rank="1"] pre') or "").splitlines()[-1] == HOSTILE
    browser.shot(page, "page-hostile-log")


def test_without_the_token_the_page_says_which_url_to_open(browser: Browser, runs: Path) -> None:
    run = make_run(runs, nodes=1, ppn=2, metrics=10)
    page = browser.open(f"/run/{run.run_id}")  # a fresh profile: no token kept
    page.wait_for_selector("#message:not([hidden])")
    assert "open the URL cpuaccel dashboard printed" in (page.text_content("#message") or "")
    assert page.get_attribute("#message", "data-status") == "403"
    assert page.locator("#ranks [data-rank]").count() == 0 and page.is_hidden("#run-view")
    browser.shot(page, "page-403")
    listing = browser.open("/?token=not-the-token")
    listing.wait_for_selector("#message:not([hidden])")
    assert "open the URL cpuaccel dashboard printed" in (listing.text_content("#message") or "")


def test_stop_dismissed_does_nothing(browser: Browser, runs: Path, stopper: Stopper) -> None:
    run = make_run(runs, nodes=2, ppn=2, metrics=10)
    page = browser.open(f"/run/{run.run_id}?token={TOKEN}")
    wait_for(page, lambda: points(page) == 10, "the run's points")
    asked: list[str] = []
    posts: list[str] = []
    page.on("request", lambda r: posts.append(r.url) if r.method == "POST" else None)

    def dismiss(dialog: Any) -> None:
        asked.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", dismiss)
    page.click("#stop")
    wait_for(page, lambda: bool(asked), "the confirm dialog")
    assert run.run_id in asked[0]
    # The click handler returns at once after a dismissed confirm: after one poll more
    # (a new point), nothing was posted and nothing stopped.
    run.append_metrics(1)
    wait_for(page, lambda: points(page) == 11, "a poll after the dialog")
    assert posts == [] and stopper.calls == []
    assert page.is_hidden("#stop-result") and page.is_visible("#stop")
    assert page.text_content("#state") == "running"
    browser.shot(page, "page-stop-dismissed")


def test_stop_accepted_that_fails_shows_the_error(
    browser: Browser, runs: Path, stopper: Stopper
) -> None:
    run = make_run(runs, nodes=2, ppn=2, metrics=10)
    stopper.fail = True
    page = browser.open(f"/run/{run.run_id}?token={TOKEN}")
    wait_for(page, lambda: points(page) == 10, "the run's points")
    page.on("dialog", lambda dialog: dialog.accept())
    page.click("#stop")
    page.wait_for_selector('#stop-result[data-result="error"]')
    text = page.text_content("#stop-result") or ""
    assert "node0 is not in the inventory" in text and "give -i INVENTORY" in text
    assert stopper.calls == [run.run_id]
    assert page.text_content("#state") == "running" and page.is_visible("#stop")
    browser.shot(page, "page-stop-error")


def test_stop_accepted_stops_the_run(browser: Browser, runs: Path, stopper: Stopper) -> None:
    run = make_run(runs, nodes=2, ppn=2, metrics=10)
    stopper.runs[run.run_id] = run
    page = browser.open(f"/run/{run.run_id}?token={TOKEN}")
    wait_for(page, lambda: points(page) == 10, "the run's points")
    page.on("dialog", lambda dialog: dialog.accept())
    page.click("#stop")
    page.wait_for_selector('#stop-result[data-result="ok"]')
    assert page.text_content("#stop-result") == "stopped: nothing left on any node"
    assert stopper.calls == [run.run_id]
    wait_for(page, lambda: page.text_content("#state") == "stopped", "the state stopped")
    wait_for(page, lambda: page.is_hidden("#stop"), "the Stop button hidden")
    assert states(page) == ["stopped"] * 4
    browser.shot(page, "page-stop-done")


class FailingHead:
    """A remote watcher (dashboard/remote.Watcher's touch) whose head is unreachable."""

    def touch(self, run: Any) -> dict[str, object]:
        return {"error": "node7: connection refused", "fetched": None}


def test_a_remote_run_whose_head_cannot_be_reached_says_so(runs: Path, chromium: Chromium) -> None:
    run = make_run(runs, nodes=2, ppn=2, metrics=10)
    services = Services(runs, TOKEN, {"127.0.0.1"}, None, FailingHead())  # type: ignore[arg-type]
    server = Server(build_app(services), "127.0.0.1", 0)
    server.start()
    try:
        with Browser(f"http://127.0.0.1:{server.port}", chromium=chromium) as browser:
            page = browser.open(f"/run/{run.run_id}?token={TOKEN}")
            page.wait_for_selector("#remote[data-error]")
            text = page.text_content("#remote") or ""
            assert "copying from the run's head failed: node7: connection refused" in text
            assert points(page) == 10  # what was copied is still shown
            browser.shot(page, "page-remote-error")
    finally:
        server.stop()


@pytest.mark.parametrize(("first_rate", "shown"), [(50_000.0, "clipped"), (600.0, "fitted")])
def test_the_throughput_chart_fits_the_steps_after_the_warm_up(
    browser: Browser, runs: Path, first_rate: float, shown: str
) -> None:
    run = make_run(runs, nodes=1, ppn=1, metrics=0, state="succeeded")
    rates = [first_rate] + [640.0 + 10 * (i % 3) for i in range(29)]
    lines = [f'{{"step": {i}, "loss": 1.0, "samples_per_s": {r}}}\n' for i, r in enumerate(rates)]
    (run.path / "metrics.jsonl").write_text("".join(lines))
    page = browser.open(f"/run/{run.run_id}?token={TOKEN}")
    wait_for(page, lambda: points(page) == 30, "the 30 points")
    assert page.get_attribute("#chart-rate", "data-warmup") == shown
    top = page.evaluate("window.cpuaccelCharts.rateTop")
    assert top == pytest.approx(660.0 * 1.1)  # the steady steps' highest, plus 10%
    legend = page.eval_on_selector_all(
        "#chart-rate .u-legend .u-series .u-label", "cells => cells.map(c => c.textContent)"
    )
    if shown == "clipped":
        assert legend[1] == "samples/s (warm-up step clipped)"
    else:
        assert legend[1] == "samples/s"
    browser.shot(page, f"page-chart-warm-up-{shown}")
