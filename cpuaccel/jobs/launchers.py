"""One small class per MPI launcher: the command line it takes and what it reads from env.

The launch shapes follow what each implementation documents (and what Accelerate and
ipexrun build): hydra's ``-f HOSTFILE -n N -ppn P`` for Intel MPI and MPICH, Open MPI's
``--hostfile H --map-by ppr:P:node``. Every rank runs ``rank.sh`` and every launcher
reaches other nodes through the rendered ``ssh.sh``, so the inventory's SSH settings
apply to MPI's own connections too.
"""

from __future__ import annotations

import abc
import posixpath
from dataclasses import dataclass

from cpuaccel.errors import UsageError


@dataclass(frozen=True)
class LaunchSpec:
    mpirun: str
    hostfile: str
    # Placeholders (str) in a dry run, where the nodes' facts are not known.
    world: int | str
    ppn: int | str
    threads: int | str  # cores given to each rank
    ssh_wrapper: str
    rank_argv: tuple[str, ...]
    exported: tuple[str, ...]  # variable names the ranks must see
    # Several of the job's nodes are one machine (containers, namespaces): their ranks
    # share its cores, so MPI must not spin on them.
    shared_cores: bool = False
    # --launcher-args: the user's own words for mpirun, each one argv word, placed after
    # cpuaccel's options and before the program (config/kinds.py checked them).
    extra: tuple[str, ...] = ()
    run_id: str = ""  # names the Slurm launcher's job step (its teardown finds it so)
    # The job's network (cpuaccel.network.choice): the interface name every node uses,
    # if one, and the one subnet that holds every node's address, if one.
    interface: str | None = None
    subnet: str | None = None


class Launcher(abc.ABC):
    name: str
    flavour: str  # as the fact probe reports it
    slots_syntax = False  # hostfile lines "host slots=P" instead of "host"
    # The launcher gives every rank its own block of cores (I_MPI_PIN, -bind-to,
    # --bind-to): OpenMP's "close" binding then stays inside that block. Where it does
    # not, rank.sh binds only when the rank's mask is already its own (rundir.py).
    pins_ranks = True

    @abc.abstractmethod
    def argv(self, spec: LaunchSpec) -> list[str]: ...

    def env(self, spec: LaunchSpec) -> dict[str, str]:
        """Variables the launcher itself reads (set in launch.sh, not in the ranks)."""
        return {}

    def default_mpirun(self, python: str) -> str:
        return "mpirun"


def _hydra(spec: LaunchSpec, *options: str) -> list[str]:
    """The command shape of hydra, the process manager of Intel MPI and MPICH."""
    placement = ["-f", spec.hostfile, "-n", str(spec.world), "-ppn", str(spec.ppn)]
    return [spec.mpirun, *placement, *options, *spec.extra, *spec.rank_argv]


class IntelMPI(Launcher):
    name = flavour = "impi"

    def argv(self, spec: LaunchSpec) -> list[str]:
        return _hydra(spec)  # bootstrap and pinning are read from the environment

    def env(self, spec: LaunchSpec) -> dict[str, str]:
        return {
            "I_MPI_HYDRA_BOOTSTRAP": "ssh",
            "I_MPI_HYDRA_BOOTSTRAP_EXEC": spec.ssh_wrapper,
            # Each rank gets its own block of physical cores (OMP_NUM_THREADS of them).
            "I_MPI_PIN": "1",
            "I_MPI_PIN_DOMAIN": "omp",
            "I_MPI_PIN_CELL": "core",
            "I_MPI_PIN_ORDER": "compact",
            # hydra's own connections (its proxies back to mpirun) on the job's network.
            **({"I_MPI_HYDRA_IFACE": spec.interface} if spec.interface else {}),
            # Polling ranks on cores other ranks also run on stall them by whole
            # scheduler slices: a floor under every allreduce far above its own cost.
            # Wait mode sleeps instead.
            **({"I_MPI_WAIT_MODE": "1"} if spec.shared_cores else {}),
        }

    def default_mpirun(self, python: str) -> str:
        # impi-rt installs mpirun beside the interpreter of its environment.
        return posixpath.join(posixpath.dirname(python), "mpirun")


class MPICH(Launcher):
    name = flavour = "mpich"

    def argv(self, spec: LaunchSpec) -> list[str]:
        return _hydra(
            spec,
            *("-launcher", "ssh", "-launcher-exec", spec.ssh_wrapper),
            *("-bind-to", f"core:{spec.threads}"),
            *(("-iface", spec.interface) if spec.interface else ()),
        )

    def default_mpirun(self, python: str) -> str:
        return "mpirun.mpich"


class OpenMPI(Launcher):
    name = flavour = "openmpi"
    slots_syntax = True

    def argv(self, spec: LaunchSpec) -> list[str]:
        exports: list[str] = []
        for name in spec.exported:  # Open MPI forwards only what -x names
            exports += ["-x", name]
        # Its TCP transport and its runtime's own wire-up on the job's network: a subnet
        # holds for every node whatever its interface's name.
        network = spec.subnet or spec.interface
        if network:
            for component in ("btl_tcp_if_include", "oob_tcp_if_include"):
                exports += ["--mca", component, network]
        return [
            spec.mpirun,
            "--hostfile",
            spec.hostfile,
            "-n",
            str(spec.world),
            "--map-by",
            f"ppr:{spec.ppn}:node:PE={spec.threads}",
            "--bind-to",
            "core",
            "--mca",
            "plm_rsh_agent",
            spec.ssh_wrapper,
            *exports,
            *spec.extra,
            *spec.rank_argv,
        ]

    def env(self, spec: LaunchSpec) -> dict[str, str]:
        # Open MPI refuses root unless told twice; containers and test beds run as root.
        # A rank's non-zero exit is the supervisor's to act on: Open MPI's own abort
        # kills the other ranks' processes outright and drops their last output, with
        # the exit codes they report (the supervisor ends them with SIGTERM, as under
        # every launcher). An Open MPI that does not know the variable ignores it.
        return {
            "OMPI_ALLOW_RUN_AS_ROOT": "1",
            "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
            "OMPI_MCA_orte_abort_on_non_zero_status": "0",
        }

    def default_mpirun(self, python: str) -> str:
        return "mpirun.openmpi"


# Debian's libpmi2-0: Intel MPI's PMI-2 client for ranks that srun starts (elsewhere,
# e.g. /usr/lib64/libpmi2.so: set I_MPI_PMI_LIBRARY with --env).
PMI2_LIBRARY = "/usr/lib/x86_64-linux-gnu/libpmi2.so.0"


class Slurm(Launcher):
    """Slurm as the process manager, inside an allocation: ``srun --mpi=pmi2`` starts
    every rank itself, so no ssh between nodes is needed.

    Chosen over Intel MPI's ``mpirun`` with ``I_MPI_HYDRA_BOOTSTRAP=slurm``: both start
    impi-rt's ranks as fast (docs/benchmarks.md, "Launch under Slurm"), but srun
    works from anywhere in the allocation (hydra's proxies must reach
    back to mpirun's host: from the login side they could not) and Slurm then accounts
    and cancels every rank. The step is named after the run (``cpuaccel-<id>``) so that
    the teardown can scancel exactly it (slurm/queue.py)."""

    name = flavour = "slurm"
    # srun binds a task only where the cluster's TaskPlugin does (task/affinity,
    # task/cgroup); under task/none every rank sees the whole node.
    pins_ranks = False

    def argv(self, spec: LaunchSpec) -> list[str]:
        placement = [f"--ntasks={spec.world}", f"--ntasks-per-node={spec.ppn}"]
        if isinstance(spec.world, int) and isinstance(spec.ppn, int):
            placement.insert(0, f"--nodes={spec.world // spec.ppn}")
        return [
            spec.mpirun,
            "--mpi=pmi2",
            *placement,
            f"--nodelist={spec.hostfile}",  # a path (it holds a '/'): read as the node list
            f"--job-name={step_name(spec.run_id)}",
            # A rank that fails ends the step (its other ranks), as MPI ends a job.
            "--kill-on-bad-exit=1",
            # --ppn is the user's word: `salloc -N 2` holds one CPU a node, and Slurm
            # would refuse a second task there ("More processors requested than
            # permitted"); threads per rank come from the nodes' cores, as elsewhere.
            "--overcommit",
            "--distribution=block",  # ranks 0..P-1 on the first node, as hydra's -ppn
            *spec.extra,
            *spec.rank_argv,
        ]

    def env(self, spec: LaunchSpec) -> dict[str, str]:
        # srun passes launch.sh's environment on to every rank (--export=ALL).
        return {"I_MPI_PMI_LIBRARY": PMI2_LIBRARY}

    def default_mpirun(self, python: str) -> str:
        return "srun"


def step_name(run_id: str) -> str:
    """The name of a run's srun step (squeue --steps shows it)."""
    return f"cpuaccel-{run_id}"


LAUNCHERS: dict[str, Launcher] = {cls.name: cls() for cls in (IntelMPI, MPICH, OpenMPI, Slurm)}


def get(name: str) -> Launcher:
    try:
        return LAUNCHERS[name]
    except KeyError:
        raise UsageError(
            f"unknown launcher {name!r}", hint=f"use one of: auto, {', '.join(LAUNCHERS)}"
        ) from None


def pick(flavours: list[str]) -> Launcher:
    """--launcher auto: the first launcher the head node has, Intel MPI preferred."""
    for name in ("impi", "mpich", "openmpi"):
        if name in flavours:
            return LAUNCHERS[name]
    raise UsageError(
        "no MPI launcher found on the head node",
        hint="install impi-rt in the node's environment (cpuaccel provision does), "
        "or set cpuaccel_mpirun",
    )
