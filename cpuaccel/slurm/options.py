"""What ``cpuaccel submit`` hands to ``sbatch``, checked before anything is written.

Each value ends up on a ``#SBATCH`` line of the batch script, which sbatch reads with
its own rules (not a shell's): a newline would start a line of its own, an unquoted
``#`` starts a comment, and a leading ``-`` makes a value an option. So a partition or
account is one printable word not beginning with ``-``, ``--time`` is one of Slurm's
own forms, and ``--sbatch-arg`` may not set what cpuaccel sets itself. Every check
raises ValueError with the reason; the flag's or the file's caller adds where.
"""

from __future__ import annotations

import re
from typing import Any

# Slurm's --time forms (sbatch(1)): MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS.
_TIME = re.compile(
    r"\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d{1,2}|\d+-\d{1,2}:\d{1,2}|\d+-\d{1,2}:\d{1,2}:\d{1,2}"
)
TIME_FORMS = "MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (e.g. 2:00:00)"
_UNLIMITED = ("UNLIMITED", "INFINITE")

# sbatch options that cpuaccel's own script sets (or that would break `submit`), long
# spelling -> what to do instead. Short spellings map to these below.
OWNED: dict[str, str] = {
    "--nodes": "use submit --nodes",
    "--ntasks": "use submit --nodes and --ppn",
    "--ntasks-per-node": "use submit --ppn",
    "--output": "the batch output goes to runs/<id>/slurm-<job>.out",
    "--error": "the batch output goes to runs/<id>/slurm-<job>.out",
    "--chdir": "the job runs from the project folder (where submit is run)",
    "--job-name": "the job is named cpuaccel-<run id>, so that squeue shows the run",
    "--partition": "use submit -p/--partition",
    "--time": "use submit --time",
    "--account": "use submit --account",
    "--parsable": "submit reads the job id itself",
    "--wrap": "the batch script is cpuaccel's (templates/sbatch.sh.j2)",
    "--array": "a submitted run is one job",
    "--wait": "submit returns once the job is queued; follow it with cpuaccel logs -f",
}
_SHORT = {
    "-N": "--nodes",
    "-n": "--ntasks",
    "-o": "--output",
    "-e": "--error",
    "-D": "--chdir",
    "-J": "--job-name",
    "-p": "--partition",
    "-t": "--time",
    "-A": "--account",
    "-a": "--array",
    "-W": "--wait",
}


def check_time(value: Any) -> str:
    """A Slurm time limit, as written (``2:00:00``, ``1-12``, ``30``, ``UNLIMITED``)."""
    text = value if isinstance(value, str) else str(value) if isinstance(value, int) else None
    if text is None or isinstance(value, bool):
        raise ValueError(f"must be a time limit, {TIME_FORMS}; got {value!r}")
    if text.upper() in _UNLIMITED:
        return text.upper()
    if not _TIME.fullmatch(text):
        raise ValueError(f"{text!r} is not a Slurm time limit: use {TIME_FORMS}")
    return text


def check_name(value: Any, what: str) -> str:
    """A partition or account name: one printable word, not beginning with ``-``."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a name, got {value!r}")
    if value.startswith("-"):
        raise ValueError(f"{what} {value!r} begins with '-', which sbatch takes as an option")
    bad = next((c for c in value if not c.isprintable() or c.isspace()), None)
    if bad is not None:
        raise ValueError(f"{what} {value!r} holds {bad!r}; a Slurm {what} is one word")
    return value


def owned_option(word: str) -> str | None:
    """The long name of the cpuaccel-owned sbatch option ``word`` spells, if any."""
    if word.startswith("--"):
        name = word.split("=", 1)[0]
        matches = [o for o in OWNED if o.startswith(name) and len(name) > 3]
        # sbatch takes unambiguous prefixes (--out for --output): so does this check.
        return name if name in OWNED else matches[0] if len(matches) == 1 else None
    if word.startswith("-") and len(word) >= 2:
        return _SHORT.get(word[:2])
    return None


def check_sbatch_arg(value: Any) -> str:
    """One ``--sbatch-arg``: a single sbatch option word (``--mem=4G``,
    ``--exclusive``, ``--constraint=skylake``), not one that cpuaccel sets."""
    if not isinstance(value, str) or not value.startswith("-"):
        raise ValueError(f"{value!r} is not an sbatch option: give it as --name=value")
    bad = next((c for c in value if not c.isprintable()), None)
    if bad is not None:
        raise ValueError(f"{value!r} holds {bad!r}: an sbatch option is one line")
    owned = owned_option(value)
    if owned is not None:
        raise ValueError(f"{value} is set by cpuaccel submit: {OWNED[owned]}")
    return value


class BlockError(ValueError):
    """A bad value in the ``slurm:`` block: ``key`` names its own line."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


BLOCK_KEYS = {
    "partition": "the partition (like submit -p)",
    "time": "the time limit (like submit --time), e.g. 2:00:00",
    "account": "the account to charge (like submit --account)",
    "sbatch_args": "more sbatch options, a list (like submit --sbatch-arg), e.g. [--mem=8G]",
    "templates": "a folder with your own copy of sbatch.sh.j2, relative to this file",
}


def check_block(value: Any) -> dict[str, Any]:
    """cpuaccel.yaml's ``slurm:`` mapping, each value checked as its flag is."""
    if not isinstance(value, dict):
        raise ValueError("must be a mapping, e.g. {partition: cpu, time: '2:00:00'}")
    checked: dict[str, Any] = {}
    for key, item in value.items():
        try:
            checked[str(key)] = _check_key(str(key), item)
        except ValueError as exc:
            raise BlockError(str(key), f"{key}: {exc}") from None
    return checked


def _check_key(key: str, item: Any) -> Any:
    if key == "partition" or key == "account":
        return check_name(item, key)
    if key == "time":
        if not isinstance(item, str):
            # YAML 1.1 reads 2:00:00 unquoted as the number 7200 (base 60), and 30 as
            # 30: neither says which of Slurm's forms was meant.
            raise ValueError(f"must be quoted, e.g. time: '2:00:00' (YAML read {item!r})")
        return check_time(item)
    if key == "sbatch_args":
        words = [item] if isinstance(item, str) else item
        if not isinstance(words, list):
            raise ValueError("must be a list of sbatch options, e.g. [--mem=8G, --exclusive]")
        return [check_sbatch_arg(w) for w in words]
    if key == "templates":
        if not isinstance(item, str) or not item.strip():
            raise ValueError(f"must be a folder, got {item!r}")
        return item
    raise ValueError(f"is not a key of slurm: (known: {', '.join(BLOCK_KEYS)})")
