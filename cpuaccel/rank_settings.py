"""The variables of a rank's environment: the CPUACCEL_* ones its runtime reads and the
values each one takes, torchrun's that every rank gets, and which may differ per host.

One home for both sides of a launch, in one wording: the runtime (``cpuaccel.init``, in
the rank) refuses a bad value with :class:`~cpuaccel.errors.SettingError`
(:func:`check`), and the controller checks the same variables where the user wrote them
(``--env``, the project file's ``env``, the inventory's ``cpuaccel_env``), so a typo is
one line naming that flag or file:line before any node is touched, not a failure on
every rank after the job started. No torch here: the CLI imports it.
"""

from __future__ import annotations

from collections.abc import Mapping

from cpuaccel.errors import SettingError

ATTENTION_ENV = "CPUACCEL_ATTENTION"
ATTENTION_POLICIES = ("auto", "autocast", "fp32")
BACKEND_ENV = "CPUACCEL_BACKEND"
KNOWN_BACKENDS = ("gloo", "ccl", "mpi")
GRAD_SYNC_ENV = "CPUACCEL_GRAD_SYNC"
GRAD_SYNC_MODES = ("mpi", "pg")
GRAD_REDUCE_ENV = "CPUACCEL_GRAD_REDUCE"
GRAD_REDUCE_MODES = ("ordered", "library")
DETERMINISTIC_ENV = "CPUACCEL_DETERMINISTIC"
SWITCH_VALUES = ("1", "0", "true", "false", "yes", "no", "on", "off")
TRACKERS_ENV = "CPUACCEL_TRACKERS"
TRACKERS = ("tensorboard",)
WEIGHTS_ENV = "CPUACCEL_WEIGHTS"
WEIGHTS = ("fp32", "bf16")
# Each node's interface for the job, as ADDRESS=INTERFACE words (cpuaccel.network.choice):
# the worker sets GLOO_SOCKET_IFNAME and the like from its own node's entry.
NODE_IFACES_ENV = "CPUACCEL_NODE_IFACES"
# Each node's own cpuaccel_env entries, where they differ between the nodes: a JSON object
# {ADDRESS: {NAME: value}}; the worker sets its own node's before the script starts.
HOST_ENV = "CPUACCEL_HOST_ENV"
# The attempt's number under --max-restarts (0 first), which the supervisors write.
RESTART_ENV = "CPUACCEL_RESTART"

# torchrun's variables, each as every rank gets it (the worker derives them from the
# launcher's; a value already in the environment wins): name -> (what torchrun sets it
# to, what cpuaccel sets it to). docs/run.md's list is written from this table
# (cpuaccel.config.settings_doc); TORCHELASTIC_USE_AGENT_STORE is left out, as no
# agent of cpuaccel's hosts the store it announces.
TORCHRUN_ENV: dict[str, tuple[str, str]] = {
    "RANK": ("the worker's global rank", "the same: the launcher's rank"),
    "LOCAL_RANK": ("its rank on its node", "the same"),
    "WORLD_SIZE": ("workers in the job", "the same: nodes x `--ppn`"),
    "LOCAL_WORLD_SIZE": ("`--nproc-per-node`", "`--ppn`"),
    "GROUP_RANK": ("the agent's (node's) rank", "the node's index, head 0"),
    "NODE_RANK": ("not set (its `--node-rank` flag)", "as `GROUP_RANK`"),
    "GROUP_WORLD_SIZE": ("agents (nodes)", "nodes"),
    "ROLE_RANK": ("rank among its role's workers", "as `RANK`"),
    "ROLE_NAME": ("`--role`, `default`", "`default`"),
    "ROLE_WORLD_SIZE": ("workers of its role", "as `WORLD_SIZE`"),
    "MASTER_ADDR": ("the store's host", "the head's name or address"),
    "MASTER_PORT": ("the store's port", "`--master-port`"),
    "TORCHELASTIC_RUN_ID": ("`--rdzv-id`, `none`", "the run's id"),
    "TORCHELASTIC_RESTART_COUNT": ("restarts so far", "the attempt's number, 0 first"),
    "TORCHELASTIC_MAX_RESTARTS": ("`--max-restarts`", "`--max-restarts`"),
    "TORCHELASTIC_ERROR_FILE": (
        "a file of its own for `@record`",
        "`runs/<id>/error-<rank>.json` on the rank's node",
    ),
}
MAX_RESTARTS_ENV = "TORCHELASTIC_MAX_RESTARTS"

# What cannot differ between the nodes of one job, and why: exact names, then prefixes.
_JOB_WIDE: dict[str, str] = {
    name: "every rank must agree on it"
    for name in (
        "MASTER_ADDR",
        "MASTER_PORT",
        "WORLD_SIZE",
        "GROUP_WORLD_SIZE",
        "ROLE_WORLD_SIZE",
        "ROLE_NAME",
        "ACCELERATE_MIXED_PRECISION",
        "ACCELERATE_USE_CPU",
    )
}
for _name in ("RANK", "LOCAL_RANK", "ROLE_RANK"):
    _JOB_WIDE[_name] = "each rank has its own, derived by cpuaccel"
_JOB_WIDE_PREFIXES: tuple[tuple[str, str], ...] = (
    ("I_MPI_", "the launcher reads it once for the whole job"),
    ("HYDRA_", "the launcher reads it once for the whole job"),
    ("OMPI_", "the launcher reads it once for the whole job"),
    ("PMI_", "the launcher sets it"),
    ("PMIX_", "the launcher sets it"),
    ("SLURM_", "Slurm sets it"),
    ("TORCHELASTIC_", "every rank must agree on it"),
    ("CPUACCEL_", "a setting of the whole job"),
    ("LD_", "it is read before the rank's Python starts"),
    ("PYTHON", "it is read before the rank's Python starts"),
)


def host_env_problem(name: str) -> str | None:
    """Why variable ``name`` cannot take another value on one host than on the others
    (a launcher-wide one, one every rank must agree on, one read before the worker can
    set it), or None."""
    if name in _JOB_WIDE:
        return _JOB_WIDE[name]
    return next((why for prefix, why in _JOB_WIDE_PREFIXES if name.startswith(prefix)), None)


# name -> (the values it takes, whether a comma-separated list of them, what they mean)
CHOICES: dict[str, tuple[tuple[str, ...], bool, str]] = {
    ATTENTION_ENV: (ATTENTION_POLICIES, False, "attention's precision under bf16"),
    BACKEND_ENV: (KNOWN_BACKENDS, False, "the process group's backend"),
    GRAD_SYNC_ENV: (GRAD_SYNC_MODES, False, "how gradients are averaged"),
    GRAD_REDUCE_ENV: (GRAD_REDUCE_MODES, False, "in what order gradients are summed"),
    DETERMINISTIC_ENV: (SWITCH_VALUES, False, "whether timing may choose anything"),
    TRACKERS_ENV: (TRACKERS, True, "where ctx.log also writes"),
    WEIGHTS_ENV: (WEIGHTS, False, "the parameters' dtype under bf16"),
}


def split_names(text: str) -> list[str]:
    """A comma-separated list, lower-cased, blanks dropped, each name once."""
    return list(dict.fromkeys(w.strip().lower() for w in text.split(",") if w.strip()))


def value_problem(name: str, value: str) -> str | None:
    """Why ``value`` cannot be variable ``name``'s (the name is the caller's to say), or
    None: fine, empty (the runtime's default), or not a variable of the runtime's."""
    if name not in CHOICES:
        return None
    allowed, listed, meaning = CHOICES[name]
    given = split_names(value) if listed else [value.strip().lower()]
    wrong = [item for item in given if item and item not in allowed]
    if not wrong:
        return None
    choices = f"{', '.join(allowed[:-1])} or {allowed[-1]}" if len(allowed) > 1 else allowed[0]
    verdict = "is not a choice" if len(wrong) == 1 else "are not choices"
    return f"{', '.join(map(repr, wrong))} {verdict} ({meaning}); use {choices}"


def switch(value: str) -> bool:
    """A checked switch's value: ``1``, ``true``, ``yes``, ``on`` are True."""
    return value.strip().lower() in ("1", "true", "yes", "on")


def check(name: str, value: str, origin: str) -> None:
    """The rank's side: SettingError ``origin: why`` (``$NAME`` or ``init(x=...)``) when
    ``value`` cannot be variable ``name``'s."""
    problem = value_problem(name, value)
    if problem is not None:
        raise SettingError(f"{origin}: {problem}")


def forced_value(
    name: str, argument: str, requested: str | None, environ: Mapping[str, str]
) -> tuple[str | None, str]:
    """(value, origin) of what forces variable ``name`` in a rank: init's ``argument``
    (``requested``) over ``$NAME``, checked (:func:`check`) and lower-cased; the value is
    None when neither is given. The origin is what an error about the value names."""
    value, origin = requested, f"init({argument}=...)"
    if not value and environ.get(name):
        value, origin = environ[name], f"${name}"
    if not value:
        return None, origin
    check(name, value, origin)
    return value.strip().lower(), origin
