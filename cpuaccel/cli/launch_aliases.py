"""The world-size flags of ``run`` and ``config show``, with the spellings that
``accelerate launch`` and torchrun users type (issue 13, item 1).

``launch_options`` declares cpuaccel's own flags (--nodes, --ppn, --master-port,
--mixed-precision) and, hidden from the option list but named in the epilog, their
aliases: --num_machines/--nnodes, --nproc-per-node, --num_processes (a total),
--master_addr/--main_process_ip (the head), --master_port, --mixed_precision. The command
receives one ``launch_flags`` mapping for ``config.effective.resolve``, whose
``flag_names`` entry keeps the spelling typed, so that ``config show`` and errors name it.

It also stops an option-looking SCRIPT before anything is read: ``run`` passes unknown
options through (everything after SCRIPT is the script's), so an option it does not know,
typed before SCRIPT, would otherwise be taken as the script.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import click

from cpuaccel.errors import UsageError

F = TypeVar("F", bound=Callable[..., Any])

PRECISION_CHOICES = ("auto", "bf16", "fp32", "no")  # the same words in config and run
# "auto" and torchrun's "cpu": what cpuaccel does without --ppn (ranks per node from the
# nodes' sockets). Kept apart from None until the spellings are compared, so that
# `--ppn 4 --nproc-per-node auto` is a contradiction, not one of them silently lost.
_DEFAULT = "default"

EPILOG = """\b
accelerate launch / torchrun spellings (the same settings):
  --num_processes N            N ranks in all: --ppn N/nodes
  --num_machines, --nnodes N|MIN:MAX   --nodes N|MIN:MAX
  --nproc-per-node, --nproc_per_node N|auto|cpu   --ppn N (auto, cpu: the default)
  --master_addr, --master-addr, --main_process_ip HOST   the head: rank 0 and mpirun
  --master_port, --main_process_port PORT   --master-port PORT
  --mixed_precision P          --mixed-precision P
  --max_restarts N             --max-restarts N
"""


def _whole(flag: str, text: str) -> int:
    digits = text.strip()
    if not (digits.isascii() and digits.isdigit()) or int(digits) < 1:
        raise UsageError(
            f"{flag} {text}: expected a whole number of 1 or more", hint=f"e.g. {flag} 2"
        )
    return int(digits)


def _nodes(flag: str, text: Any) -> int | tuple[int, int]:
    """N, or torchrun's MIN:MAX (issue 15 item 2): MAX nodes are taken, and a restart
    may go on with as few as MIN when nodes are lost. N:N is just N."""
    low, sep, high = str(text).partition(":")
    if not sep:
        return _whole(flag, str(text))
    try:
        first, last = _whole(flag, low), _whole(flag, high)
    except UsageError:
        raise UsageError(
            f"{flag} {text}: expected MIN:MAX, whole numbers of 1 or more",
            hint=f"e.g. {flag} 2:3 (at least 2 nodes, at most 3)",
        ) from None
    if first > last:
        raise UsageError(
            f"{flag} {text}: MIN is above MAX",
            hint=f"give MIN:MAX with MIN <= MAX, e.g. {flag} {last}:{first}",
        )
    return first if first == last else (first, last)


def _ppn(flag: str, text: str) -> int | str:
    word = text.strip().lower()
    if word in ("auto", "cpu"):
        return _DEFAULT
    if word == "gpu":
        raise UsageError(
            f"{flag} gpu: cpuaccel runs its ranks on CPUs",
            hint=f"give a number of ranks per node ({flag} 2), or leave it out (sockets per node)",
        )
    return _whole(flag, text)


def _as_is(flag: str, value: Any) -> Any:
    return value


# setting -> (its own flag, or None when run has none; the aliases; how an alias's text
# becomes the value). An alias of one setting never conflicts with another's.
_Convert = Callable[[str, Any], Any]
ALIASES: dict[str, tuple[str | None, tuple[str, ...], _Convert]] = {
    "nodes": ("--nodes", ("--num_machines", "--num-machines", "--nnodes"), _nodes),
    "ppn": ("--ppn", ("--nproc-per-node", "--nproc_per_node"), _ppn),
    "num_processes": (None, ("--num_processes", "--num-processes"), _as_is),
    "head": (None, ("--master_addr", "--master-addr", "--main_process_ip",
                    "--main-process-ip"), _as_is),
    "master_port": ("--master-port", ("--master_port", "--main_process_port",
                                      "--main-process-port"), _as_is),
    "mixed_precision": ("--mixed-precision", ("--mixed_precision",), _as_is),
    "max_restarts": ("--max-restarts", ("--max_restarts",), _as_is),
}  # fmt: skip
MAX_RESTARTS = 1000  # as config/project.py bounds max_restarts: a typo (30000) is caught


def _dest(spelling: str) -> str:
    # --num-machines and --num_machines are two options: their names must differ.
    return "alias_" + spelling.lstrip("-").replace("-", "_h_")


def _alias_type(setting: str) -> Any:
    if setting == "num_processes":
        return click.IntRange(1)
    if setting == "master_port":
        return click.IntRange(1, 65535)
    if setting == "max_restarts":
        return click.IntRange(0, MAX_RESTARTS)
    if setting == "mixed_precision":
        return click.Choice(PRECISION_CHOICES, case_sensitive=False)
    return str


# cpuaccel's own world-size options, by setting name; ``submit`` declares some of them
# from here too (cli/submit_run_flags.py), so each has one declaration.
OWN_OPTIONS: dict[str, Callable[[Any], Any]] = {
    "nodes": click.option(
        "--nodes",
        metavar="N|MIN:MAX",
        help="How many hosts (default: all selected). MIN:MAX: a restart goes on "
        "without lost nodes while MIN remain.",
    ),
    "ppn": click.option(
        "--ppn", type=click.IntRange(1), help="Ranks per node (default: sockets, or 1)."
    ),
    "master_port": click.option(
        "--master-port",
        type=click.IntRange(1, 65535),
        help="Rendezvous port.  [default: 29500]",
    ),
    "mixed_precision": click.option(
        "--mixed-precision",
        type=click.Choice(PRECISION_CHOICES, case_sensitive=False),
        help="auto, bf16, or fp32 (= no). Exported as ACCELERATE_MIXED_PRECISION / "
        "CPUACCEL_MIXED_PRECISION.",
    ),
    "max_restarts": click.option(
        "--max-restarts",
        type=click.IntRange(0, MAX_RESTARTS),
        metavar="N",
        help="Restart a failed job up to N times, from its newest checkpoint.  [default: 0]",
    ),
}


def _declarations() -> list[Callable[[Any], Any]]:
    """cpuaccel's own options (shown), then every alias (hidden: the epilog lists them)."""
    aliases = [
        click.option(spelling, _dest(spelling), type=_alias_type(setting), hidden=True)
        for setting, (_, spellings, _) in ALIASES.items()
        for spelling in spellings
    ]
    return [*OWN_OPTIONS.values(), *aliases]


def launch_options(func: F) -> F:
    """Declare the world-size flags and their aliases; the command receives them merged
    as ``launch_flags`` (values by setting name, and ``flag_names``: the spelling typed).
    With a ``script`` argument, an option-looking SCRIPT is refused first."""

    @functools.wraps(func)
    def command(**kwargs: Any) -> Any:
        script = kwargs.get("script")
        if script is not None:
            refuse_option_as_script(script)
        return func(launch_flags=merge(kwargs), **kwargs)

    for decorator in reversed(_declarations()):
        command = decorator(command)
    return command  # type: ignore[return-value]


def merge(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Pop this module's options from click's keyword arguments: each setting's value and
    the spelling it was given with; two spellings with different values are an error."""
    merged: dict[str, Any] = {}
    names: dict[str, str] = {}
    for setting, (own, spellings, convert) in ALIASES.items():
        given: list[tuple[str, Any, Any]] = []  # (spelling, as typed, value)
        if own is not None and kwargs.get(setting) is not None:
            typed = kwargs[setting]
            own_value = convert(own, typed) if setting == "nodes" else typed
            given.append((own, typed, own_value))
        kwargs.pop(setting, None)
        for spelling in spellings:
            raw = kwargs.pop(_dest(spelling))
            if raw is not None:
                given.append((spelling, raw, convert(spelling, raw)))
        for spelling, typed, value in given[1:]:
            if _normal(value) != _normal(given[0][2]):
                raise UsageError(
                    f"{given[0][0]} {given[0][1]} and {spelling} {typed} set the same "
                    "thing differently",
                    hint=f"give {own or given[0][0]} once",
                )
        value = given[0][2] if given else None
        merged[setting] = None if value == _DEFAULT else value
        if given:
            names[setting] = given[0][0]
    merged["min_nodes"] = None
    if isinstance(merged["nodes"], tuple):  # MIN:MAX: MAX nodes taken, MIN the floor
        merged["min_nodes"], merged["nodes"] = merged["nodes"]
        names["min_nodes"] = names["nodes"]
    if merged["mixed_precision"] is not None:  # fp32 is written "no", as Accelerate reads it
        merged["mixed_precision"] = _normal(merged["mixed_precision"])
    merged["flag_names"] = names
    return merged


def _normal(value: Any) -> Any:
    word = str(value).lower()
    return "no" if word == "fp32" else word


# ---------------------------------------------------------------- an option as SCRIPT

# Options of accelerate launch, torchrun and mpirun that run does not take, with what to
# type instead. Anything not here gets the general answer.
SPELLINGS: dict[str, str] = {
    "-n": "-n is mpirun's total: --num_processes N (N ranks in all) or --ppn N per node",
    "-np": "-np is mpirun's total: --num_processes N (N ranks in all) or --ppn N per node",
    "--config_file": "the config file is --config FILE (Accelerate's default_config.yaml works)",
    "--config-file": "the config file is --config FILE (Accelerate's default_config.yaml works)",
    "--hostfile": "hosts come from -i FILE (an Ansible inventory or an MPI hostfile)",
    "--num_cpu_threads_per_process": "threads per rank: --env OMP_NUM_THREADS=N",
    "--machine_rank": "cpuaccel starts every machine's ranks from here: leave it out",
    "--node_rank": "cpuaccel starts every machine's ranks from here: leave it out",
    "--node-rank": "cpuaccel starts every machine's ranks from here: leave it out",
    "--standalone": "one machine is --nodes 1 (or -l HOST): leave --standalone out",
    "--cpu": "cpuaccel always trains on CPUs: leave it out",
    "--use_cpu": "cpuaccel always trains on CPUs: leave it out",
    "--multi_gpu": "cpuaccel trains on CPUs: leave it out",
}


def refuse_option_as_script(script: str) -> None:
    """SCRIPT starting with '-' is an option run does not know, typed before the script."""
    if not script.startswith("-") or script == "-":
        return
    option = script.split("=", 1)[0]
    instead = SPELLINGS.get(option)
    if instead is None and option.startswith("--"):
        # -x and --x_y / --x-y are the same option to accelerate: so are they here.
        instead = SPELLINGS.get(option.replace("-", "_").replace("__", "--", 1))
    hint = instead or "see cpuaccel run --help; options for the script go after SCRIPT"
    if not instead:
        hint += f" (a script named {script} is ./{script})"
    raise UsageError(f"{option}: no such option of cpuaccel run", hint=hint)


def launcher_and_env_options(launcher_help: str, env_help: str) -> Callable[[F], F]:
    """``--launcher`` and ``--env``, declared once for ``run`` and ``config show`` (which
    shows what run would settle), each verb with its own help wording. No click
    defaults: None means "not given", so the project file or the inventory may set them
    (config/effective.py)."""

    def apply(func: F) -> F:
        func = click.option(
            "--env", "env_items", multiple=True, metavar="KEY=VALUE|NAME", help=env_help
        )(func)
        return click.option(
            "--launcher",
            type=click.Choice(["auto", "impi", "mpich", "openmpi", "slurm"]),
            help=launcher_help,
        )(func)

    return apply
