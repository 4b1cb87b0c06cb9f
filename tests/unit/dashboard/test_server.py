"""The dashboard's server (uvicorn on 127.0.0.1, an ephemeral port) through urllib: token,
Host and run-id checks, the update protocol, stop, and the data bounds with 64 ranks x
100k metric lines (bench/dashboard_load.py measures the times); the verb's refusals."""

from __future__ import annotations

import gzip
import json
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cpuaccel.dashboard.server import Server, Services, build_app, unframed
from cpuaccel.dashboard.snapshot import MAX_POINTS
from cpuaccel.errors import EXIT_OK, EXIT_USAGE, UsageError
from testsupport.command import cpuaccel
from testsupport.fake_run import FakeRun, make_run

TOKEN = "test-token"
# The first response of a 64-rank, 100k-line run (5 log lines a rank), measured at
# 110 kB as JSON and 36 kB gzip'ed (README, "The live run page"): bounds with headroom.
FIRST_BYTES = 160_000
FIRST_GZIP_BYTES = 60_000


class Client:
    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"

    def call(
        self, path: str, *, token: str | None = TOKEN, method: str = "GET", **headers: str
    ) -> tuple[int, bytes, dict[str, str]]:
        if token is not None:
            headers["X-Cpuaccel-Token"] = token
        request = urllib.request.Request(self.base + path, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:
                return answer.status, answer.read(), dict(answer.headers)
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read(), dict(exc.headers)

    def json(self, path: str, **kwargs: Any) -> Any:
        status, body, _ = self.call(path, **kwargs)
        assert status == 200, body
        return json.loads(body)


@pytest.fixture
def stopped() -> list[Path]:
    return []


@pytest.fixture
def client(runs: Path, stopped: list[Path]) -> Iterator[Client]:
    def stopper(folder: Path) -> dict[str, Any]:
        if folder.name.endswith("bad"):
            raise UsageError("the head is not in the inventory", hint="give -i INVENTORY")
        stopped.append(folder)
        return {"state": "stopped", "already": False, "left": {}}

    services = Services(runs, TOKEN, {"127.0.0.1", "localhost"}, stopper)
    server = Server(build_app(services), "127.0.0.1", 0)
    server.start()
    try:
        yield Client(server.port)
    finally:
        server.stop()


def test_api_refuses_a_missing_or_wrong_token_and_a_foreign_host(
    client: Client, runs: Path
) -> None:
    run = make_run(runs)
    for token in (None, "wrong"):
        status, body, _ = client.call(f"/api/runs/{run.run_id}", token=token)
        assert status == 403 and "token" in json.loads(body)["error"]
    status, body, _ = client.call("/api/runs", Host="attacker.example:8265")
    assert status == 400 and "attacker.example" in json.loads(body)["error"]
    assert client.call("/", token=None, Host="attacker.example")[0] == 400
    assert client.call("/api/ping", Host="localhost:8265")[0] == 200


def _framing(base: str, path: str, method: str = "GET", **headers: str) -> tuple[int, Any]:
    """(status, the response's headers, duplicates kept) of a request to the server."""
    request = urllib.request.Request(base + path, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, answer.headers
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers


def _assert_unframed(status_and_headers: tuple[int, Any], status: int) -> None:
    got, headers = status_and_headers
    assert got == status
    assert headers.get_all("X-Frame-Options") == ["DENY"]
    policies = headers.get_all("Content-Security-Policy")
    assert policies == ["frame-ancestors 'none'"], policies


def test_every_response_forbids_framing(client: Client, runs: Path) -> None:
    """A meta CSP cannot say frame-ancestors: the headers say it, on every response (a
    page framing the dashboard could lead a click onto Stop)."""
    run = make_run(runs, metrics=3000)  # a response large enough to be gzip'ed
    token = {"X-Cpuaccel-Token": TOKEN}
    cases = [
        ("/", {}, 200),
        (f"/run/{run.run_id}", {}, 200),
        ("/static/app.js", {}, 200),
        ("/static/nope.js", {}, 404),
        ("/api/ping", token, 200),
        ("/api/runs", token, 200),
        (f"/api/runs/{run.run_id}", {**token, "Accept-Encoding": "gzip"}, 200),
        ("/api/runs/nope", token, 404),
        ("/api/runs", {}, 403),  # refused by the guard, before any route
        ("/api/runs", {**token, "Host": "attacker.example"}, 400),
    ]
    for path, headers, status in cases:
        _assert_unframed(_framing(client.base, path, **headers), status)
    _assert_unframed(_framing(client.base, "/api/runs", "POST", **token), 405)


def test_a_server_error_forbids_framing_too(runs: Path) -> None:
    def crashing(folder: Path) -> dict[str, Any]:
        raise RuntimeError("a bug")

    run = make_run(runs, metrics=1)
    server = Server(build_app(Services(runs, TOKEN, {"127.0.0.1"}, crashing)), "127.0.0.1", 0)
    server.start()
    try:
        base = f"http://127.0.0.1:{server.port}"
        answer = _framing(
            base, f"/api/runs/{run.run_id}/stop", "POST", **{"X-Cpuaccel-Token": TOKEN}
        )
        _assert_unframed(answer, 500)
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("given", "sent"),
    [
        ([], [(b"content-security-policy", b"frame-ancestors 'none'")]),
        (
            [(b"Content-Security-Policy", b"default-src 'self'; frame-ancestors *")],
            [(b"Content-Security-Policy", b"default-src 'self'; frame-ancestors 'none'")],
        ),
        (
            [(b"content-security-policy", b"img-src 'self';"), (b"X-Frame-Options", b"ALLOW")],
            [(b"content-security-policy", b"img-src 'self'; frame-ancestors 'none'")],
        ),
    ],
    ids=["none", "replaced", "merged"],
)
def test_frame_ancestors_is_merged_into_a_csp_header_a_response_has(
    given: list[tuple[bytes, bytes]], sent: list[tuple[bytes, bytes]]
) -> None:
    assert unframed([(b"content-type", b"text/html"), *given]) == [
        (b"content-type", b"text/html"), *sent, (b"x-frame-options", b"DENY"),
    ]  # fmt: skip


def test_a_run_id_not_in_runs_is_refused_before_any_path(client: Client, runs: Path) -> None:
    make_run(runs)
    (runs.parent / "secret").mkdir()
    (runs.parent / "secret" / "run.json").write_text("{}")
    for bad in ("nope", "..%2Fsecret", "%2E%2E", "..", "x%00"):
        status, body, _ = client.call(f"/api/runs/{bad}")
        assert status == 404, (bad, body)
        assert client.call(f"/api/runs/{bad}/stop", method="POST")[0] == 404
    status, body, _ = client.call(f"/api/runs/{make_run(runs).run_id}?tail=51")
    assert status == 400 and json.loads(body)["fix"]


def test_runs_list_is_ps_rows_newest_first(client: Client, runs: Path) -> None:
    old = make_run(runs, "20250101-000000-aaaaaa", state="succeeded")
    new = make_run(runs, "20250102-000000-bbbbbb", metrics=7)
    rows = client.json("/api/runs")["runs"]
    assert [r["id"] for r in rows] == [new.run_id, old.run_id]
    assert rows[0]["state"] == "running" and rows[0]["step"] == 6
    assert rows[1]["state"] == "succeeded" and rows[1]["script"] == "train.py"


def test_records_nested_too_deep_are_left_out_not_a_500(client: Client, runs: Path) -> None:
    """A deep status.json (brought home by fetch) and a line of "[" x 3000 in
    metrics.jsonl: the run list and the run's page still answer, saying what was left out."""
    deep = make_run(runs, "20250101-000000-aaaaaa", metrics=5, state="succeeded")
    (deep.path / "status.json").write_text("[" * 3000)
    with (deep.path / "metrics.jsonl").open("a") as f:
        f.write("[" * 3000 + "\n")
    deep.append_metrics(2)
    rows = client.json("/api/runs")["runs"]
    why = "status.json: not read: values nested more than 200 levels deep"
    assert rows[0]["id"] == deep.run_id and rows[0]["problems"] == [why]
    assert rows[0]["state"] == "succeeded" and rows[0]["step"] == 6
    doc = client.json(f"/api/runs/{deep.run_id}")
    assert doc["metrics"]["step"] == list(range(7)) and doc["run"]["problems"] == [why]


def test_an_update_returns_only_new_lines_and_ended_says_when_to_stop(
    client: Client, runs: Path
) -> None:
    run = make_run(runs, metrics=30)
    first = client.json(f"/api/runs/{run.run_id}")
    assert first["metrics"]["next"] == 30 and first["metrics"]["step"] == list(range(30))
    run.append_metrics(4)
    run.append_logs(1, ranks=[2])
    update = client.json(f"/api/runs/{run.run_id}?since=30&tail=1")
    assert update["metrics"]["step"] == [30, 31, 32, 33] and not update["metrics"]["reset"]
    assert update["ranks"][2]["log_tail"] == ["rank 2 line 20: step 34 ok"]
    run.end("succeeded")
    last = client.json(f"/api/runs/{run.run_id}?since=34")
    assert last["ended"] and last["metrics"]["step"] == []
    assert {r["state"] for r in last["ranks"]} == {"succeeded"}


def test_stop_calls_the_stop_engine_and_gives_its_errors_with_a_fix(
    client: Client, runs: Path, stopped: list[Path]
) -> None:
    run = make_run(runs)
    status, body, _ = client.call(f"/api/runs/{run.run_id}/stop", method="POST")
    assert status == 200 and json.loads(body) == {"state": "stopped", "already": False, "left": {}}
    assert stopped == [run.path]
    assert client.call(f"/api/runs/{run.run_id}/stop")[0] == 405  # GET never stops
    bad = make_run(runs, "20250101-000000-bad")
    status, body, _ = client.call(f"/api/runs/{bad.run_id}/stop", method="POST")
    assert status == 409 and json.loads(body)["fix"] == "give -i INVENTORY"


def test_64_ranks_100k_lines_first_load_and_update_are_bounded(client: Client, runs: Path) -> None:
    run: FakeRun = make_run(runs, nodes=16, ppn=4, metrics=100_000)
    status, body, headers = client.call(f"/api/runs/{run.run_id}", **{"Accept-Encoding": "gzip"})
    assert status == 200 and headers.get("content-encoding") == "gzip"
    assert len(body) <= FIRST_GZIP_BYTES
    doc = json.loads(gzip.decompress(body))
    assert len(json.dumps(doc, separators=(",", ":"))) <= FIRST_BYTES
    metrics = doc["metrics"]
    assert metrics["decimated"] and len(metrics["step"]) <= MAX_POINTS
    assert metrics["step"][-1] == 99_999 and metrics["next"] == 100_000
    assert len(doc["ranks"]) == 64 and all(len(r["log_tail"]) == 5 for r in doc["ranks"])
    run.append_metrics(10)
    update = client.json(f"/api/runs/{run.run_id}?since=100000")
    assert update["metrics"]["step"] == list(range(100_000, 100_010))
    assert not update["metrics"]["decimated"] and update["metrics"]["next"] == 100_010


def test_the_verb_refuses_a_port_in_use_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        done = cpuaccel("dashboard", "--port", port, "--no-browser", cwd=tmp_path)
    assert done.returncode == EXIT_USAGE, done
    assert "Traceback" not in done.stderr and f"--port {port}" in done.stderr
    assert "fix:" in done.stderr


def test_other_verbs_do_not_import_the_server() -> None:
    prelude = (
        "import atexit, sys\n"
        "atexit.register(lambda: print('LOADED', sorted(m for m in sys.modules"
        " if m.split('.')[0] in ('starlette', 'uvicorn'))))"
    )
    for args in (("--help",), ("ps", "--help"), ("dashboard", "--help")):
        done = cpuaccel(*args, prelude=prelude)
        assert done.returncode == EXIT_OK, done
        assert "LOADED []" in done.stdout, (args, done.stdout[-300:])


def test_run_dashboard_with_dry_run_is_refused(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    done = cpuaccel("run", "--dry-run", "--dashboard", "train.py", cwd=tmp_path)
    assert done.returncode == EXIT_USAGE, done
    assert "--dashboard and --dry-run together" in done.stderr and "fix:" in done.stderr


def test_an_address_not_of_this_machine_is_one_line_naming_it(tmp_path: Path) -> None:
    proc = cpuaccel("dashboard", "--no-browser", "--bind", "a\nb", cwd=tmp_path)
    assert proc.returncode == EXIT_USAGE, proc.stdout + proc.stderr
    assert "--bind 'a\\nb': cannot listen there" in proc.stderr, proc.stderr
    assert "give an address of this machine" in proc.stderr and "Traceback" not in proc.stderr
