"""RunPlan: everything a job needs, decided from the launch settings and node facts.

``build_plan`` reads ``LaunchSettings`` (config/effective.py settled them, each with its
source) and the nodes' facts, and nothing else: no inventory variable.

Values that come from the nodes' facts (cores, sockets, the MPI flavour) are optional,
so that ``--dry-run`` can build a plan without contacting any node and show those values
as placeholders.
"""

from __future__ import annotations

import json
import os
import posixpath
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cpuaccel.config.settings import DEFAULT, FLAG, LaunchSettings, SecretEnv, Setting, rank_env
from cpuaccel.errors import SourceError, UsageError
from cpuaccel.facts.gather import Facts
from cpuaccel.facts.problems import native_bf16
from cpuaccel.inventory.host import Host
from cpuaccel.jobs import launchers
from cpuaccel.jobs.launchers import Launcher, LaunchSpec
from cpuaccel.network import choice
from cpuaccel.network.choice import JobNetwork
from cpuaccel.rank_settings import (
    DETERMINISTIC_ENV,
    GRAD_REDUCE_ENV,
    HOST_ENV,
    NODE_IFACES_ENV,
    switch,
)

# Where allocators and Intel OpenMP usually are; rank.sh uses the first that exists.
# (cpuaccel_allocator is checked against these names, with auto and none, in
# config.settings.ALLOCATOR_CHOICES.)
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


SCRIPT, MODULE, EXECUTABLE = "script", "module", "executable"


@dataclass(frozen=True)
class Script:
    """What to run: the script (relative to the project folder), its arguments, and the
    project folder's name (its folder on the nodes).

    ``mode``: ``script`` (a Python file, ``path`` relative to the project), ``module``
    (``-m``: ``path`` is a dotted module name, run as ``python -m`` does) or
    ``executable`` (``--no-python``: ``path`` is a program, relative to the project
    folder as ``./prog``, or a command looked up on the node's PATH)."""

    path: str
    args: tuple[str, ...] = ()
    project_name: str = "project"
    mode: str = SCRIPT

    def worker_argv(self) -> tuple[str, ...]:
        """The words after ``python -m cpuaccel.worker`` (rank.sh passes them on)."""
        if self.mode == MODULE:
            return ("-m", self.path, *self.args)
        if self.mode == EXECUTABLE:
            return ("--no-python", self.path, *self.args)
        # A script whose name starts with "-" must not read as one of the worker's flags.
        path = f"./{self.path}" if self.path.startswith("-") else self.path
        return (path, *self.args)


def new_run_id() -> str:
    # os.urandom, which secrets.token_hex calls: secrets' import (hmac, OpenSSL's
    # libcrypto) cost check's start-up more than the run id needs.
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{os.urandom(3).hex()}"


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
    secret_env: SecretEnv  # its repr hides the values: a plan may be printed or logged
    setvars: str | None
    allocator: str
    templates: str | None  # the user's own templates folder (cpuaccel_templates)
    script: Script
    shared_cores: bool = False  # several chosen nodes are one machine
    precision_note: str | None = None  # what --mixed-precision auto chose, and why
    launcher_args: tuple[str, ...] = ()  # --launcher-args: words for mpirun, as given
    hang_timeout: float | None = None  # --hang-timeout: both supervisors watch for a hang
    # --rendezvous-timeout: both supervisors bound the ranks' joining the process group
    rendezvous_timeout: float | None = None
    # Each node's own hostname (its facts), by inventory name: the name the output is
    # labelled with is the inventory's; logs --host takes either.
    hostnames: dict[str, str] = field(default_factory=dict)
    # Each node's address and interface for the job (None: one node, or a dry run).
    network: JobNetwork | None = None

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
            rank_argv=("/bin/sh", self.path("rank.sh"), *self.script.worker_argv()),
            exported=tuple(self.env),
            shared_cores=self.shared_cores,
            extra=self.launcher_args,
            run_id=self.run_id,
            interface=self.network.common_interface() if self.network else None,
            subnet=self.network.common_subnet() if self.network else None,
        )

    def hostfile_names(self) -> dict[str, str]:
        """How the hostfile names each node: its inventory name where every node
        resolves the names to the addresses chosen, else that address (an inventory
        of aliases, or names a node resolves otherwise). Slurm's node list takes
        Slurm's names only."""
        network = self.network
        if network is None or network.use_names or self.launcher.name == "slurm":
            return {h.name: h.name for h in self.hosts}
        return {name: c.address for name, c in network.nodes.items()}

    def command(self) -> list[str]:
        return self.launcher.argv(self.spec())


def nodes_per_machine(hosts: Sequence[Host], facts: Mapping[str, Facts]) -> int:
    """How many of the chosen nodes share one machine (one kernel boot id) at most:
    1 on a real cluster; more for containers or namespaces of one host."""
    boots = [str(facts[h.name].get("boot_id") or "") for h in hosts if h.name in facts]
    counts = Counter(b for b in boots if b)
    return max(counts.values(), default=1)


def _wanted(settings: LaunchSettings) -> Callable[[Host], choice.Wanted | None]:
    """What each host's ``cpuaccel_network`` and the run's network setting ask of it."""
    network = settings.network

    def wanted(host: Host) -> choice.Wanted | None:
        return choice.wanted_on(host, network.value, network.where, flag=network.source == FLAG)

    return wanted


def job_network(
    settings: LaunchSettings, hosts: Sequence[Host], facts: Mapping[str, Facts]
) -> JobNetwork | None:
    """The job's network over ``hosts`` (head first), from the nodes' facts and the
    network setting (cpuaccel.network.choice); None for one node or this machine alone."""
    return choice.choose(hosts, facts, _wanted(settings))


def network_wanted(settings: LaunchSettings, hosts: Sequence[Host]) -> dict[str, str]:
    """What each node's address will be, in words, before any node is asked (a dry
    run): the network named for it, or its route to the head. Empty where there is no
    network to choose (one node, this machine alone)."""
    if not choice.to_choose(hosts):
        return {}
    wanted = _wanted(settings)
    shown = {}
    for host in hosts:
        want = wanted(host)
        shown[host.name] = (
            f"its address on {want.value} ({want.where})"
            if want is not None
            else "the address of its route to the head (from its facts)"
        )
    return shown


def build_plan(
    settings: LaunchSettings,
    script: Script,
    facts: Mapping[str, Facts] | None = None,
    run_id: str | None = None,
    local_project: str | None = None,
) -> RunPlan:
    """Decide the job from the settings alone; ``facts`` (by host name) refine what the
    settings leave open (ppn, threads, the launcher and mpirun, the backend).

    ``local_project``: when every chosen host is the controller itself, the project
    folder is used where it is (nothing to sync) and runs go below it.
    """
    chosen = list(settings.chosen)
    head = chosen[0]
    head_facts = (facts or {}).get(head.name)
    workdir = _workdir(settings, head_facts)
    launcher = _launcher(settings.launcher.value, head_facts, chosen)
    mpirun = settings.mpirun.value or _mpirun_of(launcher, head_facts)
    mpirun = mpirun or launcher.default_mpirun(settings.python.value)
    cpu = head_facts["cpu"] if head_facts else None
    ppn = settings.ppn.value or (int(cpu["sockets"]) if cpu else None)
    backend = _backend(settings, head_facts)
    ccl_workers = settings.ccl_workers.value if backend == "ccl" else 0
    sharing = nodes_per_machine(chosen, facts or {})
    threads = None
    if cpu and ppn:  # cores are the machine's: nodes that are one machine split them
        threads = max(1, int(cpu["physical_cores"]) // (ppn * sharing) - ccl_workers)
    run_id = run_id or new_run_id()
    project_dir = local_project or posixpath.join(workdir, script.project_name)
    run_dir = posixpath.join(local_project or workdir, "runs", run_id)
    network = job_network(settings, chosen, facts) if facts else None
    if network is not None and not network.complete:
        network = None  # the preflight named what is wrong; a plan alone keeps names
    precision = choose_precision(settings.mixed_precision.value, chosen, facts)
    beside, under = rank_env(
        settings,
        {  # what the plan settled in place of the settings' values
            # The head's address on the job's network, unless every node resolves its
            # name to that address (an alias no node resolves, or a name on another one).
            "head": head.name if network is None or network.use_names else network.head_address,
            "backend": backend or None,
            "ccl_workers": ccl_workers if backend == "ccl" else None,
            "mixed_precision": (precision.accelerate, precision.cpuaccel),
        },
    )
    computed = _computed_env(beside, run_id, run_dir, threads, network)
    computed.update(_host_env(settings, chosen, network, facts is not None))
    if settings.hang_timeout.value is not None:  # the ranks' progress markers (_progress.py)
        from cpuaccel.node import progress  # only then: off check's start-up

        computed[progress.ENV] = f"{progress.marker_interval(settings.hang_timeout.value):g}"
    # The ranks follow their rendezvous within this bound (cpuaccel/_rendezvous.py).
    from cpuaccel.node.rendezvous import ENV as RENDEZVOUS_ENV

    computed[RENDEZVOUS_ENV] = f"{settings.rendezvous_timeout.value:g}"
    return RunPlan(
        run_id=run_id,
        hosts=chosen,
        ppn=ppn,
        threads=threads,
        launcher=launcher,
        mpirun=mpirun,
        python=settings.python.value,
        workdir=workdir,
        project_dir=project_dir,
        run_dir=run_dir,
        env=_rank_env(settings, computed, backend, under),
        secret_env=settings.secret_env.value,
        setvars=head.setvars or ((head_facts or {}).get("setvars") or {}).get("path"),
        allocator=settings.allocator.value,
        templates=settings.templates.value,
        script=script,
        shared_cores=sharing > 1,
        precision_note=precision.note,
        launcher_args=tuple(settings.launcher_args.value),
        hang_timeout=settings.hang_timeout.value,
        rendezvous_timeout=settings.rendezvous_timeout.value,
        hostnames={
            h.name: str(f["hostname"])
            for h in chosen
            if (f := (facts or {}).get(h.name)) and f.get("hostname")
        },
        network=network,
    )


def _computed_env(
    beside: Mapping[str, str],
    run_id: str,
    run_dir: str,
    threads: int | None,
    network: JobNetwork | None,
) -> dict[str, str]:
    """What every rank gets from cpuaccel itself, before the user's variables:
    ``beside``, the settings' own (config.settings.rank_env), among them."""
    ifaces = {NODE_IFACES_ENV: network.rank_map()} if network is not None else {}
    return {
        "CPUACCEL_RUN_ID": run_id,  # how cpuaccel finds this job's processes, and only them
        "CPUACCEL_RUN_DIR": run_dir,
        "CPUACCEL_LABEL_OUTPUT": "1",
        **beside,
        **ifaces,
        "OMP_NUM_THREADS": str(threads) if threads else "<physical cores per node / ppn>",
        # As `accelerate launch --cpu` does: without it, a plain Accelerator() on a node
        # without a GPU silently trains as separate one-process jobs.
        "ACCELERATE_USE_CPU": "true",
    }


def _host_env(
    settings: LaunchSettings, hosts: Sequence[Host], network: JobNetwork | None, asked: bool
) -> dict[str, str]:
    """CPUACCEL_HOST_ENV: each host's own cpuaccel_env entries (config/effective.py
    settled them), keyed by the node's address on the job's network, by which the worker
    finds its own (cpuaccel.worker.host_env), as CPUACCEL_NODE_IFACES is. One file for
    every node: the run folder may be one folder on shared storage. Without a network
    (a dry run, or a network the preflight refuses) the keys are the hosts' names."""
    own = settings.host_env.value
    if not own:
        return {}
    if network is None and asked and all(h.is_local for h in hosts):
        raise UsageError(
            f"cpuaccel_env differs between {', '.join(own)}, which are all this machine: "
            "their ranks cannot be told apart",
            hint="give cpuaccel_env one value for all of them (in all: vars)",
        )
    nodes = network.nodes if network is not None else {}
    keyed = {nodes[name].address if name in nodes else name: env for name, env in own.items()}
    return {HOST_ENV: json.dumps(keyed, sort_keys=True, separators=(",", ":"))}


def _workdir(settings: LaunchSettings, head_facts: Facts | None) -> str:
    workdir = settings.workdir.value
    if workdir.startswith("~") and head_facts and head_facts.get("workdir"):
        # The default ~/cpuaccel: paths in the scripts are quoted, so the shell would not
        # expand ~; use the head's own expansion (the probe reports it).
        workdir = str(head_facts["workdir"])
    return workdir


def _backend(settings: LaunchSettings, head_facts: Facts | None) -> str:
    """The one set (CPUACCEL_BACKEND or cpuaccel_backend), else ccl where oneCCL is."""
    backend = settings.backend.value or ""
    if not backend and head_facts and head_facts["packages"].get("oneccl_bindings_for_pytorch"):
        backend = "ccl"
    return backend


def _rank_env(
    settings: LaunchSettings,
    computed: dict[str, str],
    backend: str,
    under: Mapping[str, str],
) -> dict[str, str]:
    """What every rank gets: what cpuaccel computes, then the user's env over it (the
    inventory's cpuaccel_env, the project file's, --env), then ``under``, the settings'
    variables the user's env left unset; never a secret."""
    env = dict(computed)
    if backend == "ccl":
        env["CCL_ATL_TRANSPORT"] = "ofi"
    user = dict(settings.env.value)
    for name, value in under.items():
        user.setdefault(name, value)
    env.update(user)
    for key in settings.secret_env.value:
        env.pop(key, None)
    if switch(env.get(DETERMINISTIC_ENV, "")) and env.get(GRAD_REDUCE_ENV) == "library":
        raise UsageError(
            f"{_named(settings.deterministic, DETERMINISTIC_ENV)} asks for reproducible sums, "
            f"{_named(settings.grad_reduce, GRAD_REDUCE_ENV)} for the library's allreduce, "
            "whose order its algorithm picks",
            hint="drop one of the two (grad_reduce ordered is the default)",
        )
    return env


def _named(setting: Setting[Any], variable: str) -> str:
    """Where a setting was given, or the --env variable when that set it."""
    if setting.source == DEFAULT:
        return f"--env {variable}"
    return setting.where or setting.name


def _launcher(name: str, head_facts: Facts | None, hosts: Sequence[Host]) -> Launcher:
    if name != "auto":
        return launchers.get(name)
    if all(h.slurm_job is not None for h in hosts):  # a Slurm allocation's nodes: srun
        return launchers.get("slurm")
    if head_facts is None:
        return launchers.get("impi")  # the default; facts refine it when a node is asked
    return launchers.pick([lau["flavour"] for lau in head_facts["mpi"]["launchers"]])


def _mpirun_of(launcher: Launcher, head_facts: Facts | None) -> str:
    """The head node's mpirun of that flavour, as its facts found it; "" if none."""
    found = head_facts["mpi"]["launchers"] if head_facts else []
    return next((lau["path"] for lau in found if lau["flavour"] == launcher.flavour), "")


def allocator_candidates(plan: RunPlan) -> list[str]:
    prefix = posixpath.dirname(posixpath.dirname(plan.python))
    names = list(ALLOCATORS) if plan.allocator == "auto" else [plan.allocator]
    if plan.allocator == "none":
        return []
    return [c.format(prefix=prefix) for name in names for c in ALLOCATORS[name]]


def iomp_candidates(plan: RunPlan) -> list[str]:
    prefix = posixpath.dirname(posixpath.dirname(plan.python))
    return [c.format(prefix=prefix) for c in IOMP]


# ---------------------------------------------------------------- the precision every rank gets
# What ``--mixed-precision`` becomes in every rank's environment.
#
# ``auto`` (the runtime's default) is settled here, once for the whole job, from the
# chosen nodes' facts: bf16 only when *every* node has AMX-BF16 or AVX512-BF16, since a
# job runs at the pace of its slowest rank and emulated bf16 is slower than fp32. Settling
# it on the controller (rather than letting each rank look at its own CPU) keeps every
# rank of a mixed cluster on the same precision and lets the choice be printed once.
#
# Accelerate knows ``no``/``bf16`` (not ``fp32`` or ``auto``), so what is exported is
# always one of those two once the nodes are known; a dry run, which asks no node,
# shows ``auto`` and a placeholder.
PLACEHOLDER = "<bf16 if every node has AMX-BF16 or AVX512-BF16, else no>"


@dataclass(frozen=True)
class PrecisionChoice:
    accelerate: str | None  # ACCELERATE_MIXED_PRECISION (None: not exported)
    cpuaccel: str | None  # CPUACCEL_MIXED_PRECISION
    note: str | None = None  # one line saying what auto chose and why


def choose_precision(
    value: str | None, hosts: Sequence[Host], facts: Mapping[str, Facts] | None
) -> PrecisionChoice:
    """The exported values for ``value`` (a settled ``--mixed-precision``) on ``hosts``."""
    if value is None:
        return PrecisionChoice(None, None)
    if value in ("no", "fp32"):
        return PrecisionChoice("no", "no")
    known = {h.name: facts[h.name] for h in hosts if facts and h.name in facts}
    lacking = [name for name, f in known.items() if native_bf16(f) is None]
    if value != "auto":  # an explicit bf16 is honoured, with a warning where it is emulated
        note = None
        if lacking:
            note = (
                f"warning: mixed precision bf16 without native bf16 on {_shown(lacking)} "
                "(emulated, may be slower than fp32; --mixed-precision auto would pick fp32)"
            )
        return PrecisionChoice(value, value, note)
    if len(known) < len(hosts):
        return PrecisionChoice(PLACEHOLDER, "auto")
    if not lacking:
        flags = sorted({native_bf16(f) or "" for f in known.values()})
        return PrecisionChoice(
            "bf16", "bf16", f"precision auto -> bf16: every node has {' or '.join(flags)}"
        )
    return PrecisionChoice(
        "no",
        "no",
        f"precision auto -> fp32: no AMX-BF16 or AVX512-BF16 on {_shown(lacking)} "
        "(bf16 would be emulated; pass --mixed-precision bf16 to use it anyway)",
    )


def _shown(names: Sequence[str]) -> str:
    """The first three names, and how many more."""
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return ", ".join(names[:3]) + more


# ---------------------------------------------------------------- what a rank runs
# What each rank runs when it is not a Python script: ``-m MODULE`` or ``--no-python``.
#
# As ``python -m``, ``torchrun -m`` and ``accelerate launch -m``: a module name, run from
# the synced project folder as ``__main__``. As ``torchrun --no-python``: a program run
# as each rank, with the rank's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
# ...) derived by the worker first. Both are checked here, on the controller, so that a
# mistake is one line before any node is contacted.
def module_script(name: str, args: tuple[str, ...], project: Path) -> Script:
    """``-m pkg.train``: dotted identifiers only (it reaches the nodes as one word, and
    anything else could not be imported)."""
    parts = name.split(".")
    if not all(part.isidentifier() for part in parts):
        raise UsageError(
            f"-m {name}: not a module name",
            hint="give a dotted module name, e.g. -m pkg.train (as python -m takes it); "
            "a script file is run without -m",
        )
    return Script(name, args, project.name, MODULE)


def compile_here(what: Script, project: Path, shown: str) -> None:
    """Compile SCRIPT (or a ``-m`` module found in the project) on this machine before any
    node is contacted: a syntax error is one line naming FILE:LINE, rather than the same
    traceback from every rank after the launch. A module not found here (installed on the
    nodes) and a program (--no-python) are left to the nodes."""
    if what.mode == EXECUTABLE:
        return
    path: Path | None = project / what.path
    if what.mode == MODULE:
        path = _module_file(project, what.path)
        if path is None:
            return
        shown = path.relative_to(project).as_posix()
    assert path is not None
    try:
        source = path.read_bytes()
    except OSError:
        return  # the launch says what is wrong with the file
    import zipfile  # only here: off every command's start-up

    if zipfile.is_zipfile(path):
        return  # a zip application (.pyz, #! line or not): Python runs its __main__.py
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    hint = f"correct it and run again (this machine's Python {version} compiled it; no node "
    hint += "was contacted)"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a SyntaxWarning is the script's own business
        try:
            compile(source, shown, "exec", dont_inherit=True)
        except SyntaxError as exc:
            message = f"{type(exc).__name__}: {exc.msg}"
            raise SourceError(message, source=shown, line=exc.lineno, hint=hint) from None
        except ValueError as exc:  # a NUL byte, before Python 3.12 made it a SyntaxError
            raise SourceError(f"SyntaxError: {exc}", source=shown, hint=hint) from None


def _module_file(project: Path, name: str) -> Path | None:
    """The file ``python -m NAME`` runs from the project folder, if it is there."""
    base = project.joinpath(*name.split("."))
    for path in (base.with_name(base.name + ".py"), base / "__main__.py"):
        if path.is_file():
            return path
    return None


def program_script(program: str, args: tuple[str, ...], project: Path) -> Script:
    """``--no-python PROGRAM``: a path (relative to the project, or absolute on the nodes)
    or a bare command name. A bare name of a file in the project is that file (run as
    ./NAME, as torchrun runs it from its folder); any other bare name is looked up on
    the node's PATH."""
    if "/" not in program and not (project / program).is_file():
        if not program or program.startswith("-"):
            raise UsageError(
                f"--no-python {program!r}: not a program",
                hint="give the program to run, e.g. --no-python ./train.sh",
            )
        return Script(program, args, project.name, EXECUTABLE)  # on the node's PATH
    if program.startswith("/") and not Path(program).resolve().is_relative_to(project):
        return Script(program, args, project.name, EXECUTABLE)  # the node's own program
    path = (project / program).resolve()
    if not path.is_file():
        raise UsageError(
            f"--no-python {program}: no such file in the project folder {project}",
            hint="give a path relative to the project folder, or a command on the nodes' PATH",
        )
    if not path.is_relative_to(project):
        raise UsageError(
            f"--no-python {program} is outside the project folder {project}",
            hint="run cpuaccel from the folder that holds it (it is what gets synced)",
        )
    if not os.access(path, os.X_OK):
        raise UsageError(
            f"--no-python {program} is not executable",
            hint=f"chmod +x {program} (the nodes run it as it is synced)",
        )
    return Script(f"./{path.relative_to(project).as_posix()}", args, project.name, EXECUTABLE)
