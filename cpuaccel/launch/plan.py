"""RunPlan: everything a job needs, decided from the inventory, the flags and node facts.

Values that come from the nodes' facts (cores, sockets, the MPI flavour) are optional,
so that ``--dry-run`` can build a plan without contacting any node and show those values
as placeholders.
"""

from __future__ import annotations

import posixpath
import secrets
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cpuaccel.errors import UsageError
from cpuaccel.facts.gather import Facts
from cpuaccel.inventory.host import Host
from cpuaccel.launch import launchers
from cpuaccel.launch.launchers import Launcher, LaunchSpec

DEFAULT_MASTER_PORT = 29500
# Where allocators and Intel OpenMP usually are; rank.sh uses the first that exists.
ALLOCATORS = {
    "tcmalloc": (
        "{prefix}/lib/libtcmalloc.so",
        "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4",
        "/usr/lib64/libtcmalloc.so.4",
    ),
    "jemalloc": (
        "{prefix}/lib/libjemalloc.so",
        "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
        "/usr/lib64/libjemalloc.so.2",
    ),
}
IOMP = ("{prefix}/lib/libiomp5.so",)


@dataclass(frozen=True)
class RunRequest:
    """What the user asked for on the command line."""

    script: str  # relative to the project folder
    args: tuple[str, ...] = ()
    nodes: int | None = None
    ppn: int | None = None
    launcher: str = "auto"
    master_port: int = DEFAULT_MASTER_PORT
    env: Mapping[str, str] = field(default_factory=dict)
    project_name: str = "project"


def new_run_id() -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


@dataclass
class RunPlan:
    run_id: str
    hosts: list[Host]
    ppn: int | None
    threads: int | None
    launcher: Launcher
    mpirun: str
    python: str
    workdir: str
    project_dir: str
    run_dir: str  # on the nodes
    env: dict[str, str]
    secret_env: dict[str, str]
    setvars: str | None
    allocator: str
    request: RunRequest
    shared_cores: bool = False  # several chosen nodes are one machine

    @property
    def head(self) -> Host:
        return self.hosts[0]

    @property
    def world(self) -> int | None:
        return None if self.ppn is None else self.ppn * len(self.hosts)

    def path(self, name: str) -> str:
        return posixpath.join(self.run_dir, name)

    def spec(self) -> LaunchSpec:
        return LaunchSpec(
            mpirun=self.mpirun,
            hostfile=self.path("hostfile"),
            world=self.world or f"<{len(self.hosts)} x ppn>",
            ppn=self.ppn or "<ppn: sockets per node>",
            threads=self.threads or "<cores per rank>",
            ssh_wrapper=self.path("ssh.sh"),
            rank_argv=("/bin/sh", self.path("rank.sh"), self.request.script, *self.request.args),
            exported=tuple(self.env),
            shared_cores=self.shared_cores,
        )

    def command(self) -> list[str]:
        return self.launcher.argv(self.spec())


def nodes_per_machine(hosts: Sequence[Host], facts: Mapping[str, Facts]) -> int:
    """How many of the chosen nodes share one machine (one kernel boot id) at most:
    1 on a real cluster; more for containers or namespaces of one host."""
    boots = [str(facts[h.name].get("boot_id") or "") for h in hosts if h.name in facts]
    counts = Counter(b for b in boots if b)
    return max(counts.values(), default=1)


def _same(hosts: Sequence[Host], what: str, read: Any) -> str:
    values = {h.name: read(h) for h in hosts}
    if len(set(values.values())) > 1:
        listing = ", ".join(f"{k}={v}" for k, v in values.items())
        raise UsageError(
            f"{what} differs between the chosen nodes ({listing})",
            hint=f"set {what} once for all of them (in all: vars), as rank.sh runs everywhere",
        )
    return str(next(iter(values.values())))


def choose_hosts(hosts: Sequence[Host], nodes: int | None) -> list[Host]:
    if not hosts:
        raise UsageError("no hosts selected", hint="check -i and --limit")
    if nodes is None:
        return list(hosts)
    if nodes < 1 or nodes > len(hosts):
        raise UsageError(
            f"--nodes {nodes}, but {len(hosts)} host(s) are selected "
            f"({', '.join(h.name for h in hosts)})",
            hint="lower --nodes, or add hosts to the inventory / widen --limit",
        )
    return list(hosts[:nodes])


def build_plan(
    request: RunRequest,
    hosts: Sequence[Host],
    facts: Mapping[str, Facts] | None = None,
    run_id: str | None = None,
    local_project: str | None = None,
) -> RunPlan:
    """Decide the job. ``facts`` (by host name) refine what the inventory cannot say.

    ``local_project``: when every chosen host is the controller itself, the project
    folder is used where it is (nothing to sync) and runs go below it.
    """
    chosen = choose_hosts(hosts, request.nodes)
    head = chosen[0]
    python = _same(chosen, "cpuaccel_python", lambda h: h.python)
    workdir = _same(chosen, "cpuaccel_workdir", lambda h: h.workdir)
    head_facts = (facts or {}).get(head.name)
    if workdir.startswith("~") and head_facts and head_facts.get("workdir"):
        # The default ~/cpuaccel: paths in the scripts are quoted, so the shell would not
        # expand ~; use the head's own expansion (the probe reports it).
        workdir = str(head_facts["workdir"])
    launcher = _launcher(request.launcher, head, head_facts)
    mpirun = str(head.vars.get("cpuaccel_mpirun") or "")
    if not mpirun and head_facts:
        mpirun = next(
            (
                lau["path"]
                for lau in head_facts["mpi"]["launchers"]
                if lau["flavour"] == launcher.flavour
            ),
            "",
        )
    mpirun = mpirun or launcher.default_mpirun(python)
    cpu = head_facts["cpu"] if head_facts else None
    ppn = request.ppn or (int(cpu["sockets"]) if cpu else None)
    backend = str(request.env.get("CPUACCEL_BACKEND") or head.vars.get("cpuaccel_backend") or "")
    if not backend and head_facts and head_facts["packages"].get("oneccl_bindings_for_pytorch"):
        backend = "ccl"
    ccl_workers = int(head.vars.get("cpuaccel_ccl_workers", 1)) if backend == "ccl" else 0
    sharing = nodes_per_machine(chosen, facts or {})
    threads = None
    if cpu and ppn:
        # Cores are the machine's: nodes that are one machine split them between them.
        threads = max(1, int(cpu["physical_cores"]) // (ppn * sharing) - ccl_workers)
    run_id = run_id or new_run_id()
    if local_project is not None:
        project_dir, run_dir = local_project, posixpath.join(local_project, "runs", run_id)
    else:
        project_dir = posixpath.join(workdir, request.project_name)
        run_dir = posixpath.join(workdir, "runs", run_id)
    env: dict[str, str] = {
        "CPUACCEL_RUN_ID": run_id,  # how cpuaccel finds this job's processes, and only them
        "CPUACCEL_RUN_DIR": run_dir,
        "CPUACCEL_LABEL_OUTPUT": "1",
        "MASTER_ADDR": head.name,
        "MASTER_PORT": str(request.master_port),
        "OMP_NUM_THREADS": str(threads) if threads else "<physical cores per node / ppn>",
        # As `accelerate launch --cpu` does: without it, a plain Accelerator() on a node
        # without a GPU silently trains as separate one-process jobs.
        "ACCELERATE_USE_CPU": "true",
    }
    if backend:
        env["CPUACCEL_BACKEND"] = backend
    if backend == "ccl":
        env["CCL_WORKER_COUNT"] = str(ccl_workers)
        env["CCL_ATL_TRANSPORT"] = "ofi"
    if head.vars.get("cpuaccel_fi_provider"):
        env["FI_PROVIDER"] = str(head.vars["cpuaccel_fi_provider"])
    env.update({str(k): str(v) for k, v in (head.vars.get("cpuaccel_env") or {}).items()})
    env.update(request.env)
    secret_env = {str(k): str(v) for k, v in (head.vars.get("cpuaccel_secret_env") or {}).items()}
    for key in secret_env:
        env.pop(key, None)
    allocator = str(head.vars.get("cpuaccel_allocator", "auto"))
    if allocator not in ("auto", "none", *ALLOCATORS):
        raise UsageError(
            f"cpuaccel_allocator is {allocator!r}",
            hint="use auto, tcmalloc, jemalloc or none",
        )
    return RunPlan(
        run_id=run_id,
        hosts=chosen,
        ppn=ppn,
        threads=threads,
        launcher=launcher,
        mpirun=mpirun,
        python=python,
        workdir=workdir,
        project_dir=project_dir,
        run_dir=run_dir,
        env=env,
        secret_env=secret_env,
        setvars=head.setvars or ((head_facts or {}).get("setvars") or {}).get("path"),
        allocator=allocator,
        request=request,
        shared_cores=sharing > 1,
    )


def _launcher(name: str, head: Host, head_facts: Facts | None) -> Launcher:
    name = str(head.vars.get("cpuaccel_launcher", name)) if name == "auto" else name
    if name != "auto":
        return launchers.get(name)
    if head_facts is None:
        return launchers.get("impi")  # the default; facts refine it when a node is asked
    return launchers.pick([lau["flavour"] for lau in head_facts["mpi"]["launchers"]])


def allocator_candidates(plan: RunPlan) -> list[str]:
    prefix = posixpath.dirname(posixpath.dirname(plan.python))
    names = list(ALLOCATORS) if plan.allocator == "auto" else [plan.allocator]
    if plan.allocator == "none":
        return []
    return [c.format(prefix=prefix) for name in names for c in ALLOCATORS[name]]


def iomp_candidates(plan: RunPlan) -> list[str]:
    prefix = posixpath.dirname(posixpath.dirname(plan.python))
    return [c.format(prefix=prefix) for c in IOMP]
