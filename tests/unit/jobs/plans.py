"""A run's plan without nodes, for the tests of the files it renders and of the head's
launcher check: two hosts' facts as the preflight gathers them, a script argument that
a shell or ssh_config could misread."""

from __future__ import annotations

from typing import Any

from cpuaccel.config.effective import resolve
from cpuaccel.inventory.host import Host
from cpuaccel.inventory.inventory import Inventory
from cpuaccel.jobs.plan import RunPlan, Script, build_plan

RUN_ID = "20260101-000000-abcdef"
# Everything a shell or ssh_config could misread, short of what ssh_config cannot hold.
HOSTILE = "a b $(touch M) `touch M` 'q' ; & | * ? # % ~x"


def plan_of(chosen: list[Host], **flags: Any) -> RunPlan:
    inventory = Inventory(None, {h.name: h for h in chosen}, {})
    settings = resolve({"ppn": 2, **flags}, None, inventory, chosen)
    cpu = {"sockets": 1, "physical_cores": 4}
    facts = {
        h.name: {
            "cpu": cpu,
            "mpi": {"launchers": [{"flavour": "impi", "path": "/opt/impi/bin/mpirun"}]},
            "packages": {},
            "setvars": {"path": None},
        }
        for h in chosen
    }
    return build_plan(settings, Script("train.py", ("--x", HOSTILE)), facts, RUN_ID)
