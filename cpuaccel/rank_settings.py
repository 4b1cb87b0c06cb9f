"""The CPUACCEL_* variables a rank's runtime reads, and the values each one takes.

One home for both sides of a launch, in one wording: the runtime (``cpuaccel.init``, in
the rank) refuses a bad value with :class:`~cpuaccel.errors.SettingError`
(:func:`check`), and the controller checks the same variables where the user wrote them
(``--env``, the project file's ``env``, the inventory's ``cpuaccel_env``), so a typo is
one line naming that flag or file:line before any node is touched, not a failure on
every rank after the job started. No torch here: the CLI imports it.
"""

from __future__ import annotations

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
