"""Shared fixtures: a real 3-node namespace cluster for tests marked `cluster`.

The tests are laid out by what they test: ``tests/unit/<package>/`` (no cluster: one
folder a package of cpuaccel, the top-level modules in ``tests/unit/`` itself),
``tests/cluster/`` (real namespace nodes; what its files share is in
``tests/cluster/fixtures.py``) and ``tests/docs/``. This file applies to all of them.

The one rule for cluster tests: a test that needs root and namespace nodes is marked
``cluster`` explicitly, so that ``-m "not cluster"`` and a reader see it without following
fixtures. A file of cluster tests only (every file of ``tests/cluster/``) says so once
with ``pytestmark = pytest.mark.cluster``; a file that mixed them with plain tests would
put ``@pytest.mark.cluster`` on each. A test that uses the ``cluster`` fixture (directly
or through another fixture) without the mark is a collection error.

Cluster tests need root. Off root they are skipped with the reason; with
``CPUACCEL_REQUIRE_CLUSTER=1`` (set by CI) they fail with it instead, so a CI run cannot pass
by skipping them.

Running ``python -m cpuaccel`` from a test: :mod:`testsupport.command`.

``CPUACCEL_TEST_CLUSTER_ID`` (default 0) picks the cluster id of the session cluster, so that
two test sessions on one machine do not fight over the same names.

In parallel (``pytest -n 3 --dist loadgroup``, pytest-xdist), the unit of work is a
file: its tests run on one worker in their order, so that its module fixtures (a
cluster test file's state, the hostile corpus's cases started all at once, a browser,
Ansible's answers) run once. Files go to whichever worker is free, and two kinds of
file go together as one unit:

- the Slurm test files (SLURM_FILES): one worker starts the one Slurm bed;
- the files whose tests start a local run on the default master port
  (LOCAL_PORT_FILES): their ranks meet on that one port of this machine.

Each worker that runs a cluster test has a session cluster of its own (its id the base
id plus ten times the worker's number), so no two cluster tests ever share a node at
the same time.

The groups are read off each test's file by the scheduler below, not from
``xdist_group`` marks: xdist carries a mark as a suffix of the test's id, which pytest 9
no longer lets a plugin change, so such marks group nothing there.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from cpuaccel.testbed import slurm as slurm_bed
from cpuaccel.testbed import slurm_db
from cpuaccel.testbed.cluster import Cluster, unavailable_reason

REQUIRE_ENV = "CPUACCEL_REQUIRE_CLUSTER"
CLUSTER_ID_ENV = "CPUACCEL_TEST_CLUSTER_ID"
SESSION_NODES = 3
WORKER_ID_STEP = 10  # a worker's session cluster id: base + step x its number (gw0, gw1...)

# The cluster test files that use the Slurm bed: one group, so that one worker starts it.
SLURM_FILES = frozenset({
    "test_slurm_bed.py", "test_slurm_inventory.py", "test_slurm_run.py", "test_slurm_submit.py",
})  # fmt: skip


# The plain test files whose tests start a local run on the default master port (found by
# holding that port during every test: these, and only these, failed). A new such file
# joins them, or its runs name a free port.
LOCAL_PORT_FILES = frozenset({
    "tests/unit/api/test_launching.py", "tests/unit/jobs/test_given_id.py",
    "tests/unit/jobs/test_hang.py", "tests/unit/jobs/test_tracebacks.py",
    "tests/unit/notebook/test_launching.py",
})  # fmt: skip


def _cluster_required() -> bool:
    return os.environ.get(REQUIRE_ENV, "") == "1"


def _refusal() -> str | None:
    reason = unavailable_reason()
    if reason is None:
        return None
    if _cluster_required():
        return f"{REQUIRE_ENV}=1 but the cluster tests cannot run: {reason}"
    return f"cluster test skipped: {reason} (set {REQUIRE_ENV}=1 to make this a failure)"


def pytest_configure(config: pytest.Config) -> None:
    """The files the groups name exist: a renamed one would leave its tests ungrouped."""
    root = config.rootpath / "tests"
    named = [f"cluster/{name}" for name in sorted(SLURM_FILES)]
    named += [path.removeprefix("tests/") for path in sorted(LOCAL_PORT_FILES)]
    missing = [name for name in named if not (root / name).is_file()]
    if missing:
        raise pytest.UsageError(
            "tests/conftest.py groups files that do not exist: " + ", ".join(missing)
        )


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Runs before `-m` deselection, so that `-m "not cluster"` cannot hide an unmarked one.
    unmarked = [
        item.nodeid
        for item in items
        if "cluster" in getattr(item, "fixturenames", ())
        and item.get_closest_marker("cluster") is None
    ]
    if unmarked:
        raise pytest.UsageError(
            "these tests use the cluster fixture but are not marked `cluster` (see "
            "tests/conftest.py): " + ", ".join(unmarked)
        )
    elsewhere = [
        item.nodeid
        for item in items
        if item.get_closest_marker("cluster") is not None
        and not item.nodeid.startswith("tests/cluster/")
    ]
    if elsewhere:
        raise pytest.UsageError(
            "these cluster tests are outside tests/cluster/, where the parallel run's "
            "groups look for them (tests/conftest.py): " + ", ".join(elsewhere)
        )


def group_of(nodeid: str) -> str:
    """The unit of work of a test by its id's file (see the module's docstring): the
    file itself, or the group it belongs to. Every cluster test lives in tests/cluster/."""
    path = nodeid.split("::", 1)[0]
    if path.startswith("tests/cluster/") and path.rsplit("/", 1)[-1] in SLURM_FILES:
        return "slurm-bed"
    return "local-port" if path in LOCAL_PORT_FILES else path


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """With ``--dist loadgroup``: xdist's scope scheduling, a scope being a test's unit
    of work (:func:`group_of`); any other mode is xdist's own."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    return ByGroup(config, log)


def session_cluster_id() -> int:
    """This session's cluster id: the base id, moved by the xdist worker's number."""
    base = int(os.environ.get(CLUSTER_ID_ENV, "0"))
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    number = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    return base + WORKER_ID_STEP * number


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("cluster") is None:
        return
    refusal = _refusal()
    if refusal is None:
        return
    if _cluster_required():
        pytest.fail(refusal, pytrace=False)
    pytest.skip(refusal)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """A 3-node cluster (id 0 by default), started once per session and shared.

    Tests may stop a node's sshd only inside ``with cluster.sshd_stopped(name):``.
    """
    refusal = _refusal()
    if refusal is not None:
        if _cluster_required():
            pytest.fail(refusal, pytrace=False)
        pytest.skip(refusal)
    with Cluster(SESSION_NODES, cluster_id=session_cluster_id()) as started:
        yield started


@pytest.fixture(scope="session")
def inventory(cluster: Cluster) -> str:
    """The session cluster's inventory.yaml, as the `-i` argument of a command line."""
    return str(cluster.inventory_path)


@pytest.fixture(scope="session")
def slurm(cluster: Cluster) -> slurm_bed.SlurmBed:
    """Slurm on the session cluster (munged, slurmctld, slurmdbd for sacct, one slurmd a
    node; :mod:`cpuaccel.testbed.slurm`), started once, stopped with the cluster.

    Client commands need ``{**os.environ, **slurm.env}`` (``SLURM_CONF``). A test that
    drains or cuts a node restores it and may call ``slurm.wait_idle()``.
    """
    # Accounting too: the Slurm tests read exit codes through sacct.
    reason = slurm_bed.unavailable_reason() or slurm_db.unavailable_reason()
    if reason is not None:
        message = f"Slurm test bed cannot start: {reason}"
        if _cluster_required():
            pytest.fail(f"{REQUIRE_ENV}=1 but {message}", pytrace=False)
        pytest.skip(message)
    return cluster.start_slurm()


@pytest.fixture(autouse=True)
def _slurm_left_clean(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test that used Slurm: no job of it left, every node idle, every daemon
    running (what was not is put right and warned about, so the next test starts clean)."""
    yield
    if "slurm" not in request.fixturenames:
        return
    try:
        bed: slurm_bed.SlurmBed = request.getfixturevalue("slurm")
    except (Exception, pytest.skip.Exception, pytest.fail.Exception):
        return  # the bed never came up; its own error is reported already
    wrong = slurm_bed.restore(bed)
    if wrong:
        warnings.warn(f"{request.node.nodeid} left Slurm so: {'; '.join(wrong)}", stacklevel=1)


@pytest.fixture(autouse=True)
def _cluster_left_running(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test that used the shared cluster, bring back any sshd it left stopped."""
    yield
    if "cluster" not in request.fixturenames:
        return
    try:
        shared: Cluster = request.getfixturevalue("cluster")
    except (Exception, pytest.skip.Exception, pytest.fail.Exception):
        return  # the cluster never came up; its own error is reported already
    restarted = shared.ensure_running()
    if restarted:
        warnings.warn(
            f"{request.node.nodeid} left sshd stopped on {restarted}; restarted them "
            "(use `with cluster.sshd_stopped(name):`)",
            stacklevel=1,
        )
