"""A Slurm partition's nodes, as Slurm's controller knows them (``-i slurm:PARTITION``).

The nodes come from ONE ``scontrol show nodes --oneliner`` call (a second,
``scontrol show partitions --oneliner``, only to find the default partition or to list
the partitions when the one asked for does not exist). scontrol's output is trusted no
more than a file the user wrote: a node's name and NodeAddr reach ssh argvs, so each is
checked as a host name (a name with ';' or a leading '-' is refused, naming the node),
the CPU count must be a number and a reason is kept to one printable line.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from cpuaccel.errors import InventoryError, UsageError
from cpuaccel.inventory.slurm_source import PREFIX
from cpuaccel.inventory.variables import host_name_problem
from cpuaccel.slurm import commands

NODES_ARGV = ("scontrol", "show", "nodes", "--oneliner")
PARTITIONS_ARGV = ("scontrol", "show", "partitions", "--oneliner")
# Slurm's partition names in practice; never a leading '-' (it would read as an option
# of sinfo or sbatch) and nothing a shell or a terminal would interpret.
PARTITION_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,63}")
# A field starts at a space (or the line's start) with a capitalised key and '=':
# "CfgTRES=cpu=2,mem=1M" is one field, "OS=Linux 6.1 #1 SMP" keeps its spaces.
_KEY = re.compile(r"(?:^|(?<= ))([A-Z][A-Za-z_]*)=")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
MAX_REASON = 200  # characters of a reason shown; an admin's note, not a log
# The state words (base state and "+FLAG"s) that mean a node cannot take work: such a
# node is named as a problem with its reason and never contacted.
UNAVAILABLE = frozenset(
    {
        "DOWN",
        "DRAIN",
        "FAIL",
        "FAILING",
        "NOT_RESPONDING",
        "FUTURE",
        "UNKNOWN",
        "POWERED_DOWN",
        "POWERING_DOWN",
        "POWER_DOWN",
        "REBOOT_ISSUED",
        "INVALID_REG",
    }
)
BUSY = frozenset({"ALLOCATED", "MIXED", "COMPLETING"})


@dataclass(frozen=True)
class SlurmNode:
    """One node of a partition, its values checked."""

    name: str
    address: str  # NodeAddr: where ssh connects (ansible_host)
    state: str  # scontrol's State, e.g. "IDLE", "IDLE+DRAIN", "DOWN+NOT_RESPONDING"
    cpus: int
    reason: str | None  # why an admin (or Slurm) took it out of service


def state_words(state: str) -> list[str]:
    """``"IDLE+DRAIN"`` to ``["IDLE", "DRAIN"]``."""
    return [word for word in state.upper().split("+") if word]


def unavailable(state: str) -> bool:
    """True when Slurm's state says the node takes no work (down, drained, not responding)."""
    return any(word in UNAVAILABLE for word in state_words(state))


def describe(state: str) -> str:
    """sinfo's word for a state: IDLE+DRAIN is "drained", MIXED+DRAIN "draining"."""
    words = state_words(state)
    if "DRAIN" in words and words[0] not in BUSY:
        word = "drained"
    elif "DRAIN" in words:
        word = "draining"
    else:
        word = (words[0] if words else "unknown").lower()
    if "NOT_RESPONDING" in words:
        word += ", not responding"
    return word


def fields(line: str) -> dict[str, str]:
    """The ``Key=value`` fields of one ``--oneliner`` line. The first of a key wins, so
    that a Reason written last ("maint State=IDLE") cannot pass for the node's state."""
    found: dict[str, str] = {}
    starts = list(_KEY.finditer(line))
    for here, after in zip(starts, [*starts[1:], None], strict=True):
        end = after.start() if after is not None else len(line)
        found.setdefault(here.group(1), line[here.end() : end].strip())
    return found


def records(text: str, key: str) -> list[dict[str, str]]:
    """Every line of scontrol's output that starts with ``key=`` (NodeName, PartitionName)."""
    return [fields(line) for line in text.splitlines() if line.startswith(f"{key}=")]


def partition_problem(name: str) -> str | None:
    """Why ``name`` cannot be a partition's name, or None."""
    if PARTITION_NAME.fullmatch(name):
        return None
    lead = " and must not start with '-'" if name.startswith("-") else ""
    return f"{name!r} is not a partition name: use letters, digits, '_', '.', '+' and '-'{lead}"


def check_partition(spec: str) -> str:
    """The partition of ``slurm:PARTITION`` ("" for the default one), checked."""
    name = spec[len(PREFIX) :] if spec.startswith(PREFIX) else spec
    problem = partition_problem(name) if name else None
    if problem is not None:
        raise UsageError(
            f"{spec}: {problem}", hint="write -i slurm:PARTITION (sinfo lists them), or slurm:"
        )
    return name


def node_of(values: Mapping[str, str], origin: str) -> SlurmNode:
    """A node's checked values; a value that could reach a command line is refused."""
    name = values.get("NodeName", "")

    def refuse(what: str) -> InventoryError:
        return InventoryError(
            f"{origin}: node {name[:80]!r}: {what}",
            hint="ask the Slurm admin to fix the node's definition in slurm.conf, or pass "
            "an inventory file with -i",
        )

    problem = host_name_problem(name)
    if problem is not None:
        raise refuse(f"NodeName {problem}")
    address = values.get("NodeAddr") or name
    problem = host_name_problem(address)
    if problem is not None:
        raise refuse(f"NodeAddr {problem}")
    cpus = values.get("CPUTot", "")
    if not cpus.isdigit() or len(cpus) > 7:
        raise refuse(f"CPUTot {cpus[:20]!r} is not a number of CPUs")
    state = values.get("State", "")
    if not re.fullmatch(r"[A-Z_]+(?:\+[A-Z_]+)*[*~#!%$@^-]?", state):
        raise refuse(f"State {state[:40]!r} is not a Slurm node state")
    reason = _CONTROL.sub(" ", values.get("Reason", "")).strip()[:MAX_REASON]
    return SlurmNode(name, address, state.rstrip("*~#!%$@^-"), int(cpus), reason or None)


@dataclass(frozen=True)
class PartitionNodes:
    """What ``slurm:PARTITION`` stands for: the partition's name and its nodes."""

    partition: str
    nodes: list[SlurmNode]


def read_partition(spec: str, env: Mapping[str, str] | None = None) -> PartitionNodes:
    """The nodes of ``slurm:PARTITION`` (``slurm:``: the default partition), in Slurm's
    order. Raises UsageError for an unknown partition (listing them), InventoryError for a
    node whose values cannot be used, SlurmError (exit 69) when scontrol fails."""
    wanted = check_partition(spec)
    nodes = records(commands.run(NODES_ARGV, env=env), "NodeName")
    partitions: list[dict[str, str]] | None = None
    if not wanted:
        partitions = records(commands.run(PARTITIONS_ARGV, env=env), "PartitionName")
        default = [p["PartitionName"] for p in partitions if p.get("Default") == "YES"]
        if not default:
            raise UsageError(
                f"{spec}: Slurm has no default partition",
                hint=f"name one: {_choices(partitions)}",
            )
        wanted = default[0]
        if partition_problem(wanted) is not None:
            raise UsageError(
                f"{spec}: Slurm's default partition: {partition_problem(wanted)}",
                hint=f"name one: {_choices(partitions)}",
            )
    members = [n for n in nodes if wanted in n.get("Partitions", "").split(",")]
    if not members:
        if partitions is None:
            partitions = records(commands.run(PARTITIONS_ARGV, env=env), "PartitionName")
        known = wanted in (p.get("PartitionName") for p in partitions)
        raise UsageError(
            f"{spec}: Slurm's partition {wanted!r} has no nodes"
            if known
            else f"{spec}: Slurm has no partition {wanted!r}",
            hint=f"give one of {_choices(partitions)}",
        )
    origin = f"{PREFIX}{wanted} (scontrol show nodes)"
    return PartitionNodes(wanted, [node_of(values, origin) for values in members])


def _choices(partitions: list[dict[str, str]]) -> str:
    """``-i slurm:debug (default), -i slurm:big``: the partitions scontrol listed whose
    names can be used (a hostile one is left out, not printed)."""
    names = [
        f"-i slurm:{p['PartitionName']}" + (" (default)" if p.get("Default") == "YES" else "")
        for p in partitions
        if partition_problem(p.get("PartitionName", "")) is None
    ]
    return ", ".join(names) if names else "(scontrol lists no partition)"
