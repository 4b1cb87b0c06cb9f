"""``cpuaccel run --dashboard``: the page of the run being started, served from this
``cpuaccel run``.

The server starts before the launch (a port in use is refused before anything
starts); the run's id is known once its folder appears in ./runs, so a thread waits
for the first new folder and then prints (and opens) its page. A foreground run's page
closes with the run: the server stays a few seconds after the end, so that the page
shows it, and says so. A detached run's page is served after the start until Ctrl-C:
the job goes on without it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from cpuaccel import ui
from cpuaccel.cli.dashboard import (
    DEFAULT_PORT,
    Page,
    Wiring,
    can_open_browser,
    serve_until_interrupted,
)
from cpuaccel.cli.options import Target
from cpuaccel.errors import UsageError
from cpuaccel.jobs import detached
from cpuaccel.jobs.result import JobReport
from cpuaccel.runs import records
from cpuaccel.ui import escape

LINGER = 3.0  # seconds served after a foreground run ends: the page's last polls
WAIT = 0.2  # seconds between two looks for the run's folder


class RunPage:
    def __init__(self, target: Target, port: int) -> None:
        setting = target.inventory_setting
        wiring = Wiring(
            detached.inventory_path(setting.value if setting else None),
            target.connect.connect_timeout,
            target.connect.host_key_checking is False,
        )
        self.runs = records.runs_folder()
        self.before = set(records.run_ids(self.runs))
        try:
            self.page = Page("127.0.0.1", port, wiring, self.runs)
        except BaseException:
            wiring.close()
            raise
        self.done = threading.Event()
        self.announced = False
        self.thread = threading.Thread(target=self._announce, name="run-page", daemon=True)
        self.thread.start()

    def _announce(self) -> None:
        """Print the page of the first run folder that was not there before."""
        while not self.done.wait(WAIT):
            new = sorted(set(records.run_ids(self.runs)) - self.before)
            if new:
                self.show(new[0])
                return

    def show(self, run_id: str) -> None:
        self.announced = True
        self.page.announce(f"/run/{run_id}", browser=can_open_browser())

    def around(self, launch: Callable[[], JobReport], detach: bool) -> JobReport:
        """``launch()`` (job.launch) with the page served; a foreground run's page
        closes with the run, a detached one's is left to ``ended`` after the report."""
        try:
            report = launch()
        except BaseException:
            self.ended(None, detach)
            raise
        if not detach:
            self.ended(report, detach)
        return report

    def ended(self, report: JobReport | None, detach: bool) -> None:
        """After job.launch: a started detached job is served until Ctrl-C; otherwise
        the page closes now (after LINGER s when a run was shown)."""
        self.done.set()
        self.thread.join()
        started = report is not None and report.detached is not None and report.exit_code == 0
        if detach and started and report is not None:
            if not self.announced:  # a detached start records its run at its end
                self.show(str(report.run_id))
            ui.stderr().print(
                f"dashboard: serving the page of {escape(str(report.run_id))} until Ctrl-C "
                "(the job goes on without it)"
            )
            serve_until_interrupted(self.page)
            return
        if report is not None and not detach:
            time.sleep(LINGER)
        self.page.close()
        ui.stderr().print("dashboard: the run has ended; its page is closed")


def start(target: Target) -> RunPage:
    """The page on the dashboard's usual port, else (taken: a `cpuaccel dashboard` may
    be running) on any free one: the URL printed says which."""
    try:
        return RunPage(target, DEFAULT_PORT)
    except UsageError:
        return RunPage(target, 0)
