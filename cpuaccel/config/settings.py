"""The settings of a run: the table that declares each one once, and ``LaunchSettings``,
one frozen object holding every value with its source.

``TABLE`` is to cpuaccel's run settings what an Ansible module's argument spec is to its
parameters: each entry says what the setting is (its kind and check), how it is given (a
flag of run, submit, tune or ``config show``, with the spellings Accelerate and torchrun
users type; a project-file key; the head node's inventory variables; the questionnaire's
question), what it defaults to, the variables every rank gets it as, and whether
``config show`` prints it. Everything else is derived from it: the click options
(``cli/options.py``), the project file's keys and checks (``config/project.py``), the
checks of its inventory variables on every host (``INVENTORY_VARIABLES``),
``config.effective.resolve``, the ranks' variables (``rank_env``, for jobs/plan.py),
the questionnaire's questions, ``config show``'s rows and the settings table of
docs/run.md (``config/settings_doc.py``).

``config.effective.resolve`` builds a ``LaunchSettings``; ``jobs.plan.build_plan`` reads
it (and no inventory variable); ``config show`` prints it. Keeping the types here, apart
from the precedence rules, lets both sides import them without importing each other.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from cpuaccel.config.kinds import (
    Derived,
    Duration,
    EnvVars,
    Folder,
    HostEnvVars,
    Kind,
    MpirunWords,
    Network,
    NodeCount,
    NonEmptyText,
    OneOf,
    Patterns,
    PlainText,
    RanksPerNode,
    SlurmBlock,
    Switch,
    WholeNumber,
)
from cpuaccel.inventory import variables
from cpuaccel.inventory.host import DEFAULT_PYTHON, DEFAULT_WORKDIR, Host
from cpuaccel.inventory.variables import Declared
from cpuaccel.rank_settings import (
    BACKEND_ENV,
    DETERMINISTIC_ENV,
    GRAD_REDUCE_ENV,
    GRAD_REDUCE_MODES,
    KNOWN_BACKENDS,
    MAX_RESTARTS_ENV,
    WEIGHTS,
    WEIGHTS_ENV,
)

FLAG, PROJECT, INVENTORY, ENVIRONMENT, DEFAULT = (
    "flag",
    "project file",
    "inventory",
    "environment",
    "default",
)
DEFAULT_MASTER_PORT = 29500
MASTER_PORTS = WholeNumber(1, 65535)  # master_port's kind (Accelerate's main_process_port too)
DEFAULT_CCL_WORKERS = 1
DEFAULT_RENDEZVOUS_TIMEOUT = 120.0  # seconds: torch's own default waits 30 minutes
DEFAULT_RESTART_DELAY = 3.0  # seconds between a failed attempt's end and the next's preflight
MAX_RESTARTS = 1000  # a bound, so that a typo (30000) is caught
LAUNCHER_CHOICES = ("auto", "impi", "mpich", "openmpi", "slurm")
# The list as prose, for cpuaccel.yaml's comment and the questionnaire.
LAUNCHER_WORDS = ", ".join(LAUNCHER_CHOICES[:-1]) + " or " + LAUNCHER_CHOICES[-1]
# cpuaccel_allocator: "auto" preloads whichever of them the node has (jobs/plan.py).
ALLOCATOR_CHOICES = ("auto", "none", "tcmalloc", "jemalloc")
PRECISION_CHOICES = ("auto", "bf16", "fp32", "no")
_ENV_FIX = "write one NAME: value line per variable, e.g. cpuaccel_env: {FI_PROVIDER: tcp}"

T = TypeVar("T")


@dataclass(frozen=True)
class Setting(Generic[T]):
    name: str
    value: T
    source: str  # FLAG, PROJECT, INVENTORY, ENVIRONMENT or DEFAULT
    where: str | None = None  # "--ppn", "cpuaccel.yaml:4", "inventory.yaml:12"

    def to_json(self) -> dict[str, Any]:
        value: Any = self.value
        if isinstance(value, SecretEnv):
            value = value.names()  # never the values, wherever a setting is printed
        return {"value": value, "source": self.source, "where": self.where}


class SecretEnv(Mapping[str, str]):
    """``cpuaccel_secret_env``: variables that go only to a 0600 file on the nodes.

    Its repr names the variables and hides the values, so that a setting printed in a
    log, an error or a debugger does not leak them.
    """

    def __init__(self, values: Mapping[str, str] | None = None) -> None:
        self._values = dict(values or {})

    def __getitem__(self, key: str) -> str:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def names(self) -> list[str]:
        return list(self._values)

    def __repr__(self) -> str:
        return f"SecretEnv({', '.join(self._values)}; values hidden)"


# ---------------------------------------------------------------- the table's shape

RUN, SUBMIT, TUNE, SHOW = "run", "submit", "tune", "show"  # SHOW: `config show`
BENCH = "bench"  # `bench net`: its job's hosts, launcher, port and environment
# The verbs that take Accelerate's and torchrun's spellings. submit asks Slurm for its
# own --nodes and hands cpuaccel's own spellings on to the run inside the job.
ALIAS_VERBS = frozenset({RUN, TUNE, SHOW})


@dataclass(frozen=True)
class VerbFlag:
    """How one verb words a flag otherwise: its help (and the choices it allows)."""

    help: str
    choices: tuple[str, ...] | None = None
    show_default: bool | None = None  # None: as the flag's
    metavar: str | None = None  # None: as the flag's


@dataclass(frozen=True)
class Flag:
    """A setting's command-line option."""

    decls: tuple[str, ...]  # its own spellings: ("-m", "--module"); () for aliases only
    help: str = ""
    metavar: str | None = None
    # "  [default: X]" after the help, X the entry's default (or its note when None).
    show_default: bool = False
    takes_text: bool = False  # the text typed goes through the kind's parse_text
    multiple: bool = False  # repeatable: the values as typed, in order
    # Accelerate's and torchrun's spellings (hidden; run's epilog lists them).
    aliases: tuple[str, ...] = ()
    aliases_take_text: bool = False  # e.g. --nproc_per_node auto: the kind's parse_text
    aliases_help: tuple[str, str] | None = None  # the epilog's line: typed, meaning
    per_verb: Mapping[str, VerbFlag] = field(default_factory=dict)

    @property
    def spelling(self) -> str:
        """The name used in messages and handed on: the long form of its own, else the
        first alias."""
        own = [d for d in self.decls if d.startswith("--")] or list(self.decls)
        return (own[-1] if own else self.aliases[0]).split("/")[0]


# When a setting's value reaches every rank as its ``env`` variables (``rank_env``).
SET = "set"  # whenever it has a value
GIVEN = "given"  # when given anywhere: its default is the runtime's own
UNDER_USER = "under the user's"  # when it has a value, unless the user's env sets it


@dataclass(frozen=True)
class Question:
    """The ``cpuaccel config`` questionnaire's question for a setting: the entry's
    default and kind answer it and check the answer (config/questionnaire.py)."""

    text: str
    flag: str  # `cpuaccel config`'s option that answers it without asking
    choices: tuple[str, ...] | None = None  # None: the kind's own


@dataclass(frozen=True)
class Entry:
    """One setting: every way it is given, and what it is when none is."""

    name: str  # the LaunchSettings field (or, with field=False, the flags mapping's key)
    kind: Kind  # its type and check (config/kinds.py)
    help: str  # one line: the project file's hint for its key
    label: str | None = None  # its row in docs/run.md's table; None: no row of its own
    flag: Flag | None = None
    verbs: frozenset[str] = frozenset()  # the verbs whose options include the flag
    key: str | None = None  # the project file's key (cpuaccel.yaml)
    variables: tuple[str, ...] = ()  # the head node's inventory variables, first wins
    fix: str | None = None  # the fix of a bad value of one (None: "fix the value of NAME")
    env: tuple[str, ...] = ()  # the variables the ranks get it as
    env_when: str = SET  # SET, GIVEN or UNDER_USER
    default: Any = None
    note: str | None = None  # what the default means, when it is computed
    shown: bool = False  # a row of `config show`
    field: bool = True  # a field of LaunchSettings
    also: str | None = None  # docs: another way to give it, when it has no flag
    question: Question | None = None  # `cpuaccel config` asks it

    def default_text(self) -> str:
        """The default as help and docs print it: the value, else the note."""
        if self.default is None or self.default in ((), [], {}):
            return self.note or "none"
        return self.kind.show(self.default)

    def default_setting(self) -> Setting[Any]:
        default = self.default
        if isinstance(default, (list, dict)):
            default = type(default)(default)  # never one list shared by two runs
        return Setting(self.name, default, DEFAULT, self.note)

    def takes(self, verb: str) -> bool:
        return self.flag is not None and verb in self.verbs


def _verbs(*names: str) -> frozenset[str]:
    return frozenset(names)


_ALL = _verbs(RUN, SUBMIT, TUNE, SHOW)
_TEXT = PlainText()

# ---------------------------------------------------------------- the table
# In `config show`'s order; the options of each verb follow it too.
TABLE: tuple[Entry, ...] = (
    # The hosts: -i and -l are every verb's (cli/options.py's host options); config show
    # prints what they said first.
    Entry(
        "inventory",
        NonEmptyText(),
        "the inventory (or MPI hostfile), relative to this file",
        label="inventory",
        key="inventory",
        also="`-i`",
        note="`$CPUACCEL_INVENTORY`, else `./inventory.yaml`, else this machine",
        shown=True,
        field=False,
    ),
    Entry(
        "limit",
        NonEmptyText(),
        "host pattern selecting hosts (like --limit)",
        label="hosts selected",
        key="limit",
        also="`-l`",
        note="every host of the inventory",
        shown=True,
        field=False,
    ),
    Entry(
        "head",
        NonEmptyText(),
        "the host that runs rank 0 and mpirun (default: the first host)",
        label="head (rank 0, mpirun)",
        flag=Flag(
            (),
            aliases=("--master_addr", "--master-addr", "--main_process_ip", "--main-process-ip"),
            aliases_help=(
                "--master_addr, --master-addr, --main_process_ip HOST",
                "the head: rank 0 and mpirun",
            ),
        ),
        verbs=_verbs(RUN, TUNE, SHOW),
        key="head",
        env=("MASTER_ADDR",),
        note="the first selected host",
        shown=True,
    ),
    # Accelerate's total over all machines: --ppn N/nodes (config/effective.py).
    Entry(
        "num_processes",
        WholeNumber(1),
        "ranks in all, split evenly over the nodes",
        flag=Flag(
            (),
            aliases=("--num_processes", "--num-processes"),
            aliases_help=("--num_processes N", "N ranks in all: --ppn N/nodes"),
        ),
        verbs=_verbs(RUN, TUNE, SHOW),
        field=False,
    ),
    Entry(
        "nodes",
        NodeCount(),
        'how many hosts (N, or "MIN:MAX": see run --nodes)',
        label="nodes",
        flag=Flag(
            ("--nodes",),
            help="How many hosts (default: all selected). MIN:MAX: a restart goes on "
            "without lost nodes while MIN remain.",
            metavar="N|MIN:MAX",
            takes_text=True,
            aliases=("--num_machines", "--num-machines", "--nnodes"),
            aliases_take_text=True,
            aliases_help=("--num_machines, --nnodes N|MIN:MAX", "--nodes N|MIN:MAX"),
            # Every trial of tune runs on the same nodes, and so does a bench: N only.
            per_verb={
                TUNE: VerbFlag("How many hosts (default: all selected).", metavar="N"),
                BENCH: VerbFlag("How many hosts (default: all selected).", metavar="N"),
            },
        ),
        verbs=_verbs(RUN, TUNE, SHOW, BENCH),
        key="nodes",
        note="every selected host",
        shown=True,
    ),
    Entry(
        "ppn",
        RanksPerNode(1),
        "ranks per node",
        label="ranks per node",
        flag=Flag(
            ("--ppn",),
            help="Ranks per node (default: sockets, or 1).",
            aliases=("--nproc-per-node", "--nproc_per_node"),
            aliases_take_text=True,
            aliases_help=(
                "--nproc-per-node, --nproc_per_node N|auto|cpu",
                "--ppn N (auto, cpu: the default)",
            ),
        ),
        verbs=_verbs(RUN, TUNE, SHOW),
        key="ppn",
        variables=("cpuaccel_ppn", variables.SLOTS_VAR),
        fix="write the ranks per node as a whole number, e.g. cpuaccel_ppn: 2",
        note="sockets per node, from the nodes' facts",
        shown=True,
    ),
    Entry(
        "launcher",
        OneOf(LAUNCHER_CHOICES),
        LAUNCHER_WORDS,
        label="launcher",
        flag=Flag(
            ("--launcher",),
            help="MPI launcher.",
            show_default=True,
            per_verb={
                SHOW: VerbFlag("MPI launcher, as run's."),
                SUBMIT: VerbFlag(
                    "As run (inside the job: auto is srun).",
                    choices=("auto", "impi", "slurm"),
                    show_default=False,
                ),
            },
        ),
        verbs=_ALL | _verbs(BENCH),
        key="launcher",
        variables=("cpuaccel_launcher",),
        default="auto",
        note="picked from the head node's MPI",
        shown=True,
        question=Question(
            f"Which MPI launches the job? ({LAUNCHER_WORDS}; auto = the head "
            "node's, impi = Intel MPI)",
            "--launcher",
        ),
    ),
    Entry(
        "master_port",
        MASTER_PORTS,
        "the rendezvous port on the head node",
        label="master port",
        flag=Flag(
            ("--master-port",),
            help="Rendezvous port (a run on this machine alone picks a free one).",
            show_default=True,
            aliases=("--master_port", "--main_process_port", "--main-process-port"),
            aliases_help=("--master_port, --main_process_port PORT", "--master-port PORT"),
        ),
        verbs=_ALL | _verbs(BENCH),
        key="master_port",
        variables=("cpuaccel_master_port",),
        env=("MASTER_PORT",),
        default=DEFAULT_MASTER_PORT,
        shown=True,
        question=Question("Port of the main process", "--master-port"),
    ),
    # Each node's own address and interface on it: cpuaccel.network.choice. A host's own
    # cpuaccel_network (its host or group vars) wins over the run's, except --network.
    Entry(
        "network",
        Network(),
        "the network the ranks talk over: a CIDR (10.1.0.0/16) or an interface name",
        label="network",
        flag=Flag(
            ("--network",),
            help="The ranks' network: a CIDR or an interface.",
            metavar="CIDR|IFACE",
            takes_text=True,
        ),
        verbs=_verbs(RUN, SUBMIT, TUNE, BENCH, SHOW),
        key="network",
        variables=("cpuaccel_network",),
        fix="write a network in CIDR form or an interface name, e.g. cpuaccel_network: 10.1.0.0/16",
        note="each node's route to the head node",
        shown=True,
    ),
    Entry(
        "mixed_precision",
        OneOf(PRECISION_CHOICES, same={"fp32": "no"}),
        "auto, bf16 or no (fp32)",
        label="precision",
        flag=Flag(
            ("--mixed-precision",),
            help="auto, bf16, or fp32 (= no). Exported as ACCELERATE_MIXED_PRECISION / "
            "CPUACCEL_MIXED_PRECISION.",
            aliases=("--mixed_precision",),
            aliases_help=("--mixed_precision P", "--mixed-precision P"),
        ),
        verbs=_ALL,
        key="mixed_precision",
        variables=("cpuaccel_mixed_precision",),
        # Accelerate scripts read the first, cpuaccel.init() the second; the values
        # are the plan's (jobs/plan.choose_precision), and an --env of either wins.
        env=("ACCELERATE_MIXED_PRECISION", "CPUACCEL_MIXED_PRECISION"),
        env_when=UNDER_USER,
        default="auto",
        note="bf16 if every node has AMX-BF16 or AVX512-BF16, else fp32",
        shown=True,
        question=Question(
            "bf16 mixed precision or fp32? (auto = bf16 where the CPU has AMX or "
            "AVX512-BF16, else fp32; bf16; fp32)",
            "--mixed-precision",
            choices=("auto", "bf16", "fp32"),
        ),
    ),
    Entry(
        "weights",
        OneOf(WEIGHTS),
        "the parameters' dtype under bf16: fp32 (autocast casts) or bf16 (fp32 masters)",
        label="weights under bf16",
        also=f"`--env {WEIGHTS_ENV}=...`",
        key="weights",
        variables=("cpuaccel_weights",),
        env=(WEIGHTS_ENV,),
        env_when=GIVEN,
        default="fp32",
        shown=True,
    ),
    Entry(
        "ccl_workers",
        WholeNumber(0, 64),
        "oneCCL worker threads per rank (CCL_WORKER_COUNT)",
        label="oneCCL workers",
        key="ccl_workers",
        variables=("cpuaccel_ccl_workers",),
        env=("CCL_WORKER_COUNT",),  # with the ccl backend only (jobs/plan.py)
        default=DEFAULT_CCL_WORKERS,
        note="used with the ccl backend",
        shown=True,
        question=Question("How many oneCCL worker threads per process?", "--ccl-workers"),
    ),
    Entry("hosts", Derived(), "the chosen hosts' names, head first", default=[], shown=True),
    Entry(
        "python",
        _TEXT,
        "Python on the nodes: an interpreter, or the venv cpuaccel provision creates",
        label="Python on the nodes",
        variables=("cpuaccel_python", "cpuaccel_venv"),
        default=DEFAULT_PYTHON,
        shown=True,
    ),
    Entry(
        "workdir",
        Folder(),
        "the nodes' folder for code and runs",
        label="work folder on the nodes",
        variables=("cpuaccel_workdir",),
        fix="give the nodes' work folder as an absolute path or one below ~/, e.g. "
        "cpuaccel_workdir: /opt/cpuaccel/work",
        default=DEFAULT_WORKDIR,
        shown=True,
    ),
    Entry(
        "env",
        EnvVars(),
        "variables set in every rank (a mapping)",
        label="environment",
        flag=Flag(
            ("--env",),
            help="Set in every rank; NAME alone passes this shell's value (secret when NAME "
            "has TOKEN, KEY, SECRET or PASSWORD in it).",
            metavar="KEY=VALUE|NAME",
            multiple=True,
            per_verb={
                SHOW: VerbFlag("Set in every rank, as run's (NAME: this shell's value)."),
                TUNE: VerbFlag("Set in every rank of every trial."),
                SUBMIT: VerbFlag("As run; a secret (TOKEN, KEY, SECRET, PASSWORD) only by NAME."),
            },
        ),
        verbs=_ALL | _verbs(BENCH),
        key="env",
        variables=("cpuaccel_env",),
        fix=_ENV_FIX,
        default={},
        shown=True,
    ),
    # A host's cpuaccel_env entries that differ from the other chosen hosts' (config/
    # effective.py settles them; the worker sets each node's own from CPUACCEL_HOST_ENV).
    Entry(
        "host_env",
        HostEnvVars(),
        "each host's own variables: its cpuaccel_env where the chosen hosts differ",
        default={},
        note="none: every host's cpuaccel_env is the same",
    ),
    Entry(
        "exclude",
        Patterns(),
        "sync: patterns left out (a list, gitignore syntax)",
        label="paths left out of the sync",
        flag=Flag(
            ("--exclude",),
            help="Sync: leave these paths out (repeatable).",
            metavar="PATTERN",
            multiple=True,
        ),
        verbs=_verbs(SHOW),
        key="exclude",
        default=[],
        shown=True,
    ),
    # --nodes MIN:MAX's MIN: restarts (and the first preflight) leave out failing nodes
    # while at least this many remain (jobs/elastic.py). None: none is left out.
    Entry(
        "min_nodes",
        WholeNumber(1),
        "the fewest nodes a restart goes on with",
        label="fewest nodes to go on with",
        also='`--nodes MIN:MAX` (`nodes: "MIN:MAX"`)',
        note="every chosen node",
        shown=True,
    ),
    # --max-restarts / --restart-delay: attempts after a failure (node/supervisor.py).
    Entry(
        "max_restarts",
        WholeNumber(0, MAX_RESTARTS),
        "attempts after a failed one (like --max-restarts), e.g. 3",
        label="restarts",
        flag=Flag(
            ("--max-restarts",),
            help="Restart a failed job up to N times, from its newest checkpoint.",
            metavar="N",
            show_default=True,
            aliases=("--max_restarts",),
            aliases_help=("--max_restarts N", "--max-restarts N"),
        ),
        verbs=_ALL,
        key="max_restarts",
        env=(MAX_RESTARTS_ENV,),  # torchrun's; the worker sets the rest
        default=0,
        note="a failed job is not restarted",
        shown=True,
    ),
    Entry(
        "restart_delay",
        Duration(0, 3600),
        "seconds to wait before a restart (like --restart-delay), e.g. 3",
        label="delay before a restart",
        flag=Flag(
            ("--restart-delay",),
            help="Wait this long before a restart (--max-restarts).",
            metavar="SECONDS",
            show_default=True,
        ),
        verbs=_verbs(RUN, SUBMIT),
        key="restart_delay",
        default=DEFAULT_RESTART_DELAY,
        shown=True,
    ),
    # Seconds without progress of any rank that end the job as hung (node/supervisor.py);
    # None: no hang detection.
    Entry(
        "hang_timeout",
        Duration(1),
        "seconds without progress of any rank that end the job (like --hang-timeout)",
        label="hang timeout",
        flag=Flag(
            ("--hang-timeout",),
            help="End the job as hung (exit 124) when no rank made progress (a step, a "
            "line) for this long.",
            metavar="SECONDS",
            show_default=True,
        ),
        verbs=_verbs(RUN, SUBMIT),
        key="hang_timeout",
        note="off",
        shown=True,
    ),
    # Seconds from the first rank's init_process_group within which every rank must have
    # joined the process group and finished its first collective, else the job ends
    # (node/rendezvous.py); the ranks' torch waits no longer either (cpuaccel/_rendezvous.py).
    Entry(
        "rendezvous_timeout",
        Duration(1, 86400),
        "seconds within which every rank joins the process group (like --rendezvous-timeout)",
        label="rendezvous timeout",
        flag=Flag(
            ("--rendezvous-timeout",),
            help="End the job (exit 124) if its ranks have not all joined this long "
            "after the first tried.",
            metavar="SECONDS",
            show_default=True,
        ),
        verbs=_verbs(RUN, SUBMIT),
        key="rendezvous_timeout",
        default=DEFAULT_RENDEZVOUS_TIMEOUT,
        shown=True,
    ),
    # Words appended to the mpirun line, checked (config/kinds.py).
    Entry(
        "launcher_args",
        MpirunWords(),
        "extra mpirun options, e.g. '-genv I_MPI_DEBUG 5' (like --launcher-args)",
        label="extra `mpirun` words",
        flag=Flag(
            ("--launcher-args",),
            help="Extra mpirun options, split as a shell would, placed before the program.",
            metavar="'WORDS'",
            takes_text=True,
        ),
        verbs=_verbs(RUN, SUBMIT),
        key="launcher_args",
        default=(),
    ),
    Entry(
        "mpirun",
        _TEXT,
        "the mpirun to run on the head node",
        label="`mpirun` to use",
        variables=("cpuaccel_mpirun",),
        note="the head node's, from its facts",
    ),
    # CPUACCEL_BACKEND in the env (any source) wins over cpuaccel_backend.
    Entry(
        "backend",
        OneOf(KNOWN_BACKENDS),
        "the process group's backend",
        label="process group backend",
        also=f"`--env {BACKEND_ENV}=...`",
        variables=("cpuaccel_backend",),
        env=(BACKEND_ENV,),
        note="ccl when the head node has oneccl_bindings_for_pytorch",
    ),
    Entry(
        "grad_reduce",
        OneOf(GRAD_REDUCE_MODES),
        "how gradients are summed: ordered (a resumed run is exact) or library",
        label="gradient sum",
        flag=Flag(
            ("--grad-reduce",),
            help="ordered: summed in rank order (resumes match bit for bit); library: "
            f"MPI's or gloo's allreduce. Exported as {GRAD_REDUCE_ENV}.",
        ),
        verbs=_verbs(RUN, SUBMIT, TUNE, SHOW),
        key="grad_reduce",
        variables=("cpuaccel_grad_reduce",),
        env=(GRAD_REDUCE_ENV,),
        env_when=GIVEN,
        default="ordered",
        shown=True,
    ),
    Entry(
        "deterministic",
        Switch(),
        "no choice by timing; reproducible reductions (I_MPI_CBWR)",
        label="deterministic",
        flag=Flag(
            ("--deterministic/--no-deterministic",),
            help="No choice made by timing, I_MPI_CBWR=1, torch's deterministic "
            f"algorithms. Exported as {DETERMINISTIC_ENV}=1.",
        ),
        verbs=_verbs(RUN, SUBMIT, TUNE, SHOW),
        key="deterministic",
        variables=("cpuaccel_deterministic",),
        env=(DETERMINISTIC_ENV,),
        note="off",
        shown=True,
    ),
    Entry(
        "fi_provider",
        _TEXT,
        "libfabric's provider for oneCCL",
        label="`FI_PROVIDER`",
        variables=("cpuaccel_fi_provider",),
        env=("FI_PROVIDER",),
        note="unset",
    ),
    # Credentials: only in a 0600 file on the nodes, never a command line or a log.
    Entry(
        "secret_env",
        EnvVars(secret=True),
        "variables set in every rank from a 0600 file (credentials)",
        label="secret environment",
        also="`--env NAME` (a NAME with TOKEN, KEY, SECRET or PASSWORD)",
        variables=("cpuaccel_secret_env",),
        fix=_ENV_FIX,
        default=SecretEnv(),
    ),
    Entry(
        "allocator",
        OneOf(ALLOCATOR_CHOICES),
        "auto, none, tcmalloc or jemalloc: preloaded in every rank (cpuaccel tune)",
        label="allocator",
        key="allocator",
        variables=("cpuaccel_allocator",),
        default="auto",
    ),
    Entry(
        "templates",
        _TEXT,
        "a folder of your own run templates",
        label="templates",
        variables=("cpuaccel_templates",),
        note="cpuaccel's own templates/",
    ),
    Entry(
        "timeout",
        Duration(0.1),
        "seconds after which the job is ended",
        label="job time limit",
        flag=Flag(("--timeout",), help="End the job after this long.", metavar="SECONDS"),
        verbs=_verbs(RUN, SUBMIT),
    ),
    Entry(
        "sync",
        Switch(),
        "sync a stale project before the launch",
        label="sync a stale project first",
        flag=Flag(("--sync/--no-sync",), help="Sync a stale project first.", show_default=True),
        verbs=_verbs(RUN),
        default=True,
    ),
    # How SCRIPT is run (jobs/plan.py): read from the flags before any setting is.
    Entry(
        "module",
        Switch(),
        "SCRIPT is a module, run as python -m runs it",
        label="SCRIPT is a module",
        flag=Flag(
            ("-m", "--module"),
            help="SCRIPT is a module name, run as `python -m SCRIPT` from the project folder.",
        ),
        verbs=_verbs(RUN, SUBMIT),
        default=False,
        field=False,
    ),
    Entry(
        "no_python",
        Switch(),
        "SCRIPT is a program, run as each rank",
        label="SCRIPT is a program",
        flag=Flag(
            ("--no-python",),
            help="SCRIPT is a program run as each rank, with RANK, WORLD_SIZE... set.",
        ),
        verbs=_verbs(RUN, SUBMIT),
        default=False,
        field=False,
    ),
    Entry(
        "slurm",
        SlurmBlock(),
        "cpuaccel submit's defaults: partition, time, account, sbatch_args, templates",
        key="slurm",
        field=False,
    ),
)
BY_NAME: dict[str, Entry] = {entry.name: entry for entry in TABLE}
# The settings' inventory variables, each checked by its entry's kind on every host when
# an inventory is loaded (Inventory.check_declared), as the inventory's own variables are.
INVENTORY_VARIABLES: dict[str, Declared] = {
    var: Declared(entry.kind.check, entry.fix) for entry in TABLE for var in entry.variables
}
# What `config show` prints, in its order.
SHOWN = tuple(entry.name for entry in TABLE if entry.shown and entry.field)


def for_verb(verb: str) -> list[Entry]:
    """The entries whose flag ``verb`` takes, in the table's order."""
    return [entry for entry in TABLE if entry.takes(verb)]


# Each field's default: the table's (a Setting from DEFAULT, with the note on it).
_DEFAULTS = {entry.name: entry.default_setting for entry in TABLE if entry.field}


@dataclass(frozen=True)
class LaunchSettings:
    """Everything ``run`` was told, settled once: a flag, else the project file, else the
    inventory (the head node's ``cpuaccel_<name>``), else the default. One field for
    each entry of ``TABLE`` with field=True, which says what each one means."""

    head: Setting[str | None] = field(default_factory=_DEFAULTS["head"])
    nodes: Setting[int | None] = field(default_factory=_DEFAULTS["nodes"])
    # None: sockets per node, from the facts
    ppn: Setting[int | None] = field(default_factory=_DEFAULTS["ppn"])
    # "auto": picked from the head node's facts
    launcher: Setting[str] = field(default_factory=_DEFAULTS["launcher"])
    master_port: Setting[int] = field(default_factory=_DEFAULTS["master_port"])
    # None: each node's route to the head (cpuaccel.network.choice)
    network: Setting[str | None] = field(default_factory=_DEFAULTS["network"])
    mixed_precision: Setting[str | None] = field(default_factory=_DEFAULTS["mixed_precision"])
    ccl_workers: Setting[int] = field(default_factory=_DEFAULTS["ccl_workers"])
    # The chosen hosts' names, head first.
    hosts: Setting[list[str]] = field(default_factory=_DEFAULTS["hosts"])
    python: Setting[str] = field(default_factory=_DEFAULTS["python"])
    workdir: Setting[str] = field(default_factory=_DEFAULTS["workdir"])
    # What the user sets in every rank.
    env: Setting[dict[str, str]] = field(default_factory=_DEFAULTS["env"])
    # What only some hosts' ranks get, by host name (their cpuaccel_env).
    host_env: Setting[dict[str, dict[str, str]]] = field(default_factory=_DEFAULTS["host_env"])
    exclude: Setting[list[str]] = field(default_factory=_DEFAULTS["exclude"])  # sync's
    min_nodes: Setting[int | None] = field(default_factory=_DEFAULTS["min_nodes"])
    max_restarts: Setting[int] = field(default_factory=_DEFAULTS["max_restarts"])
    restart_delay: Setting[float] = field(default_factory=_DEFAULTS["restart_delay"])
    hang_timeout: Setting[float | None] = field(default_factory=_DEFAULTS["hang_timeout"])
    rendezvous_timeout: Setting[float] = field(default_factory=_DEFAULTS["rendezvous_timeout"])
    launcher_args: Setting[tuple[str, ...]] = field(default_factory=_DEFAULTS["launcher_args"])
    # None: the launcher's, from the head node's facts
    mpirun: Setting[str | None] = field(default_factory=_DEFAULTS["mpirun"])
    # None: ccl where the head node has oneCCL's bindings
    backend: Setting[str | None] = field(default_factory=_DEFAULTS["backend"])
    grad_reduce: Setting[str] = field(default_factory=_DEFAULTS["grad_reduce"])
    weights: Setting[str] = field(default_factory=_DEFAULTS["weights"])
    deterministic: Setting[bool | None] = field(default_factory=_DEFAULTS["deterministic"])
    fi_provider: Setting[str | None] = field(default_factory=_DEFAULTS["fi_provider"])
    secret_env: Setting[SecretEnv] = field(default_factory=_DEFAULTS["secret_env"])
    allocator: Setting[str] = field(default_factory=_DEFAULTS["allocator"])
    templates: Setting[str | None] = field(default_factory=_DEFAULTS["templates"])
    timeout: Setting[float | None] = field(default_factory=_DEFAULTS["timeout"])
    sync: Setting[bool] = field(default_factory=_DEFAULTS["sync"])
    # The chosen hosts themselves, in the same order as ``hosts``: rank 0 and mpirun
    # run on the first.
    chosen: tuple[Host, ...] = ()

    @property
    def head_host(self) -> Host:
        return self.chosen[0]

    def shown(self) -> dict[str, Setting[Any]]:
        """The rows of ``config show``, by name."""
        return {name: getattr(self, name) for name in SHOWN}


def rank_env(
    settings: LaunchSettings, decided: Mapping[str, Any]
) -> tuple[dict[str, str], dict[str, str]]:
    """The variables the settings give every rank (each entry's ``env``), in the table's
    order: those set beside cpuaccel's own, and those set under the user's variables
    (UNDER_USER), which only a variable the user set leaves out.

    ``decided`` holds, by setting name, what the plan settled from the settings and the
    nodes' facts in place of the setting's value (the head's address, the backend); a
    tuple gives each of the entry's variables its own value, and None sets none."""
    beside: dict[str, str] = {}
    under: dict[str, str] = {}
    for entry in TABLE:
        if not entry.env:
            continue
        setting: Setting[Any] = getattr(settings, entry.name)
        if entry.env_when == GIVEN and setting.source == DEFAULT:
            continue
        value = decided.get(entry.name, setting.value)
        values = value if isinstance(value, tuple) else (value,) * len(entry.env)
        into = under if entry.env_when == UNDER_USER else beside
        for name, item in zip(entry.env, values, strict=True):
            if item is not None:
                into[name] = ("1" if item else "0") if isinstance(item, bool) else str(item)
    return beside, under
