"""The one request of a run (jobs/request.py): the run id made there, and a detached run
inside a Slurm allocation refused as the request is made."""

from __future__ import annotations

from pathlib import Path

import pytest

from cpuaccel.config.effective import resolve
from cpuaccel.config.settings import LaunchSettings
from cpuaccel.connectors.connect_options import ConnectOptions
from cpuaccel.errors import UsageError
from cpuaccel.inventory.host import Host
from cpuaccel.inventory.inventory import Inventory
from cpuaccel.jobs.given_id import FORM
from cpuaccel.jobs.plan import Script
from cpuaccel.jobs.request import LaunchRequest

SCRIPT = Script("train.py", (), "proj")


def settings_on(*hosts: Host) -> LaunchSettings:
    inventory = Inventory(None, {h.name: h for h in hosts}, {})
    return resolve({"ppn": 1}, None, inventory, list(hosts))


def test_a_request_without_a_run_id_gets_a_new_one_and_keeps_a_given_one(
    tmp_path: Path,
) -> None:
    settings = settings_on(Host("n0", {}))
    made = LaunchRequest(settings, SCRIPT, tmp_path, ConnectOptions(), 4)
    other = LaunchRequest(settings, SCRIPT, tmp_path, ConnectOptions(), 4)
    assert FORM.fullmatch(made.run_id) and made.run_id != other.run_id
    given = "20260101-000000-abcdef"
    assert LaunchRequest(settings, SCRIPT, tmp_path, ConnectOptions(), 4, given).run_id == given


def test_a_detached_request_inside_a_slurm_job_is_refused_as_it_is_made(tmp_path: Path) -> None:
    settings = settings_on(Host("n0", {"cpuaccel_slurm_job": "4242"}))
    LaunchRequest(settings, SCRIPT, tmp_path, ConnectOptions(), 4)  # in the foreground: fine
    with pytest.raises(UsageError, match="--detach inside Slurm job 4242"):
        LaunchRequest(settings, SCRIPT, tmp_path, ConnectOptions(), 4, detach=True)


def test_the_project_is_used_where_it_is_only_when_every_host_is_this_machine(
    tmp_path: Path,
) -> None:
    here = settings_on(Host("localhost", {"ansible_connection": "local"}))
    away = settings_on(Host("n0", {}))
    assert LaunchRequest(here, SCRIPT, tmp_path, ConnectOptions(), 1).local_project == str(tmp_path)
    assert LaunchRequest(away, SCRIPT, tmp_path, ConnectOptions(), 1).local_project is None
