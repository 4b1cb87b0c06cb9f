"""Find what would make a distributed job hang or misbehave, across hosts' facts.

Mixed versions and names that do not resolve are the classic silent hangs of
multi-node training (field notes): they are errors here, found before a job starts.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from cpuaccel.executor import HostResult, Status
from cpuaccel.facts.gather import Facts

ERROR = "error"
WARNING = "warning"
NOTE = "note"  # worth knowing; never changes the exit code
MAX_CLOCK_SKEW = 2.0  # seconds


@dataclass(frozen=True)
class Problem:
    severity: str
    host: str | None
    message: str
    hint: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def mpi_flavour(facts: Facts) -> str | None:
    launchers = facts.get("mpi", {}).get("launchers") or []
    return str(launchers[0]["flavour"]) if launchers else None


def _version(facts: Facts, package: str) -> str | None:
    value = facts.get("packages", {}).get(package)
    return str(value) if value is not None else None


# What must be identical on every node, and how bad a difference is. Python, torch,
# cpuaccel and the MPI flavour hang or crash a job when mixed.
DRIFT_CHECKS: tuple[tuple[str, str, Callable[[Facts], str | None]], ...] = (
    ("Python", ERROR, lambda f: f.get("python", {}).get("version")),
    ("torch", ERROR, lambda f: _version(f, "torch")),
    ("cpuaccel", ERROR, lambda f: _version(f, "cpuaccel")),
    ("MPI flavour", ERROR, mpi_flavour),
    ("impi-rt", WARNING, lambda f: _version(f, "impi_rt")),
    ("mpi4py", WARNING, lambda f: _version(f, "mpi4py")),
    ("accelerate", WARNING, lambda f: _version(f, "accelerate")),
    ("intel_extension_for_pytorch", WARNING, lambda f: _version(f, "intel_extension_for_pytorch")),
    ("oneccl_bindings_for_pytorch", WARNING, lambda f: _version(f, "oneccl_bindings_for_pytorch")),
)


def drift(facts_by_host: dict[str, Facts]) -> list[Problem]:
    """One problem per host that differs from the majority, naming both versions."""
    problems: list[Problem] = []
    for label, severity, read in DRIFT_CHECKS:
        by_value: dict[str | None, list[str]] = defaultdict(list)
        for name, facts in facts_by_host.items():
            by_value[read(facts)].append(name)
        if len(by_value) < 2:
            continue
        # The majority is the reference; ties go to the value of the first host listed.
        order = list(facts_by_host)
        reference = max(by_value, key=lambda v: (len(by_value[v]), -order.index(by_value[v][0])))
        ref_hosts = ", ".join(by_value[reference])
        for value, hosts in by_value.items():
            if value == reference:
                continue
            for host in hosts:
                problems.append(
                    Problem(
                        severity,
                        host,
                        f"{label} {value or 'absent'} here, but {reference or 'absent'} on "
                        f"{ref_hosts}",
                        hint="install the same version on every node (cpuaccel provision), or "
                        "point cpuaccel_python at the same environment",
                    )
                )
    return problems


def clock_skew(facts_by_host: dict[str, Facts]) -> list[Problem]:
    problems = []
    for name, facts in facts_by_host.items():
        skew = facts.get("clock_skew")
        if isinstance(skew, (int, float)) and abs(skew) > MAX_CLOCK_SKEW:
            problems.append(
                Problem(
                    WARNING,
                    name,
                    f"clock is {skew:+.1f} s off the controller's",
                    hint="run NTP (chrony or systemd-timesyncd) on every node; skewed clocks "
                    "confuse timeouts and logs",
                )
            )
    return problems


NATIVE_BF16 = ("amx_bf16", "avx512_bf16")


def native_bf16(facts: Facts) -> str | None:
    """The first native-bf16 flag the node's CPU has, or None (bf16 would be emulated)."""
    isa = (facts.get("cpu") or {}).get("isa") or {}
    return next((flag for flag in NATIVE_BF16 if isa.get(flag)), None)


def bf16_support(facts_by_host: dict[str, Facts]) -> list[Problem]:
    """A job runs at the pace of its slowest rank: bf16 hardware on some nodes only."""
    have = {name: native_bf16(facts) is not None for name, facts in facts_by_host.items()}
    if all(have.values()) or not any(have.values()):
        return []
    return [
        Problem(
            WARNING,
            name,
            "no AMX-BF16 or AVX512-BF16: bf16 runs slowly here while other nodes have it",
            hint="use fp32, or leave this node out with --limit",
        )
        for name, ok in have.items()
        if not ok
    ]


def same_account(results: Sequence[HostResult[Facts]]) -> list[Problem]:
    """Inventory names that reach one machine as one user: the same address, port and
    user, or the same kernel (boot id) and login name in the facts. A note, not an
    error (namespaces and test setups do it on purpose): their ranks share the cores,
    and what is synced to one is the other's."""
    groups: dict[tuple[str, ...], list[str]] = defaultdict(list)
    for r in results:
        host = r.host
        if not host.is_local:
            groups[("ssh", host.address, str(host.port), str(host.user))].append(host.name)
        facts = r.value if r.ok else None
        if facts and facts.get("boot_id") and facts.get("user"):
            groups[("boot", str(facts["boot_id"]), str(facts["user"]))].append(host.name)
    seen: set[tuple[str, ...]] = set()
    notes: list[Problem] = []
    for key, names in groups.items():
        if len(names) < 2 or tuple(names) in seen:
            continue
        seen.add(tuple(names))
        how = (
            f"address {key[1]}" if key[0] == "ssh" else "kernel (boot id)"
        ) + f" and user {key[-1] if key[-1] != 'None' else '(ssh default)'}"
        notes.append(
            Problem(
                NOTE,
                None,
                f"{', '.join(names)} are one machine and one user (the same {how})",
                hint="fine for a test setup; otherwise list the machine once, as its ranks "
                "share its cores and its files",
            )
        )
    return notes


def unreachable(results: Sequence[HostResult[Any]]) -> list[Problem]:
    problems = []
    for r in results:
        if r.status is Status.OK:
            continue
        severity = ERROR
        problems.append(Problem(severity, r.host.name, r.error or r.status.value, r.hint))
    return problems


def find_problems(results: Sequence[HostResult[Facts]]) -> list[Problem]:
    """All problems across hosts: unreachable first, then drift, clocks, bf16. (The
    nodes' names need not resolve: a job uses the addresses cpuaccel.network.choice
    chooses.)"""
    facts_by_host = {r.host.name: r.value for r in results if r.ok and r.value is not None}
    problems = unreachable(results)
    problems += drift(facts_by_host)
    problems += clock_skew(facts_by_host)
    problems += bf16_support(facts_by_host)
    return problems


__all__ = ["ERROR", "NOTE", "WARNING", "Problem", "find_problems", "same_account"]
