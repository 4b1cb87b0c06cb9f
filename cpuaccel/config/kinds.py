"""The kinds of value a setting takes, each with its one check.

A kind's ``check`` turns a value as a project file, ``-e`` or an inventory wrote it into
the setting's value, or raises ValueError with the complaint; the caller adds where the
value was written. A flag of the kind is declared from the same bounds and choices
(``cli/options.py`` builds the click option from it), so that a flag and a file cannot
take different values. A kind whose flag takes text (``--nodes 2:4``, an alias's
``--nproc_per_node auto``) turns that text with ``parse_text``, naming the spelling typed.
"""

from __future__ import annotations

import itertools
import math
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cpuaccel.errors import UsageError
from cpuaccel.inventory import variables

# torchrun's "auto" and "cpu" for --nproc_per_node: what cpuaccel does without --ppn.
# Kept apart from None until the spellings of one setting are compared, so that
# `--ppn 4 --nproc-per-node auto` is a contradiction, not one of them silently lost.
UNSET_WORD = "default"


class Kind:
    """A setting's kind: how a written value becomes the setting's value."""

    def check(self, value: Any) -> Any:
        raise NotImplementedError

    def parse_text(self, spelling: str, text: Any) -> Any:
        """A flag's text as the setting's value; UsageError naming ``spelling``."""
        return text

    def show(self, value: Any) -> str:
        """A value as help and docs print it (a default)."""
        if isinstance(value, float):
            return f"{value:g}"
        return str(value)


@dataclass(frozen=True)
class WholeNumber(Kind):
    """A whole number from ``low`` to ``high`` (no upper bound when None)."""

    low: int
    high: int | None = None

    def check(self, value: Any) -> Any:
        return variables.whole(self.low, self.high)(value)


@dataclass(frozen=True)
class RanksPerNode(WholeNumber):
    """--ppn's number; its torchrun spellings also take ``auto`` and ``cpu`` (the
    default: ranks = sockets), and say that ``gpu`` is not for cpuaccel."""

    def parse_text(self, spelling: str, text: Any) -> Any:
        word = str(text).strip().lower()
        if word in ("auto", "cpu"):
            return UNSET_WORD
        if word == "gpu":
            raise UsageError(
                f"{spelling} gpu: cpuaccel runs its ranks on CPUs",
                hint=f"give a number of ranks per node ({spelling} 2), or leave it out "
                "(sockets per node)",
            )
        return whole_flag(spelling, str(text))


@dataclass(frozen=True)
class NodeCount(Kind):
    """N hosts, or torchrun's MIN:MAX: MAX are taken, and a restart may go on with as
    few as MIN when nodes are lost. A file's "MIN:MAX" is kept as written (resolve
    splits it); N:N is just N."""

    def check(self, value: Any) -> Any:
        if isinstance(value, str) and ":" in value:
            low, high = value.split(":", 1)
            if not (low.strip().isdigit() and high.strip().isdigit()):
                raise ValueError(f"must be N or MIN:MAX (whole numbers), got {value!r}")
            first, last = int(low), int(high)
            if not 1 <= first <= last:
                raise ValueError(f"must be MIN:MAX with 1 <= MIN <= MAX, got {value!r}")
            return last if first == last else f"{first}:{last}"
        return variables.whole(1)(value)

    def parse_text(self, spelling: str, text: Any) -> Any:
        """N, or (MIN, MAX)."""
        low, sep, high = str(text).partition(":")
        if not sep:
            return whole_flag(spelling, str(text))
        try:
            first, last = whole_flag(spelling, low), whole_flag(spelling, high)
        except UsageError:
            raise UsageError(
                f"{spelling} {text}: expected MIN:MAX, whole numbers of 1 or more",
                hint=f"e.g. {spelling} 2:3 (at least 2 nodes, at most 3)",
            ) from None
        if first > last:
            raise UsageError(
                f"{spelling} {text}: MIN is above MAX",
                hint=f"give MIN:MAX with MIN <= MAX, e.g. {spelling} {last}:{first}",
            )
        return first if first == last else (first, last)


def whole_flag(spelling: str, text: str) -> int:
    digits = text.strip()
    if not (digits.isascii() and digits.isdigit()) or int(digits) < 1:
        raise UsageError(
            f"{spelling} {text}: expected a whole number of 1 or more",
            hint=f"e.g. {spelling} 2",
        )
    return int(digits)


@dataclass(frozen=True)
class Duration(Kind):
    """A number of seconds from ``low`` to ``high`` (no upper bound when None), never
    NaN or infinite."""

    low: float
    high: float | None = None

    def check(self, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"must be a number of seconds, got {value!r}")
        if self.high is not None and not self.low <= value <= self.high:  # NaN too
            raise ValueError(f"must be {self.low:g} to {self.high:g} seconds, got {value}")
        if not value >= self.low:
            raise ValueError(f"must be at least {self.low:g} s, got {value}")
        if not math.isfinite(value):
            raise ValueError(f"must be a finite number of seconds, got {value}")
        return float(value)


@dataclass(frozen=True)
class OneOf(Kind):
    """One of ``choices``, in any case; ``same`` maps a word to the one it means (fp32
    is written "no", as Accelerate reads it)."""

    choices: tuple[str, ...]
    same: Mapping[str, str] = field(default_factory=dict)

    def check(self, value: Any) -> Any:
        word = variables.choice(self.choices, fold=True)(value)
        return self.same.get(word, word)

    def normal(self, value: Any) -> Any:
        """A flag's choice as the setting's value."""
        word = str(value).lower()
        return self.same.get(word, word)


@dataclass(frozen=True)
class PlainText(Kind):
    """A path or a name on one line (an inventory variable's plain value)."""

    def check(self, value: Any) -> Any:
        return variables.text(value)


@dataclass(frozen=True)
class Folder(Kind):
    """A folder on the nodes: absolute or below ~/, never climbing with '..'."""

    def check(self, value: Any) -> Any:
        return variables.folder(value)


@dataclass(frozen=True)
class Network(Kind):
    """The network the ranks talk over: a CIDR (``10.1.0.0/16``) or an interface name."""

    def check(self, value: Any) -> Any:
        return variables.network(value)

    def parse_text(self, spelling: str, text: Any) -> Any:
        try:
            return self.check(text)
        except ValueError as exc:
            raise UsageError(f"{spelling} {exc}", hint=f"give {variables.NETWORK_WORDS}") from None


@dataclass(frozen=True)
class NonEmptyText(Kind):
    """A project file's name or path: a string with something in it."""

    def check(self, value: Any) -> Any:
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"must be a non-empty string, got {value!r}")
        return value


@dataclass(frozen=True)
class EnvVars(Kind):
    """``NAME: value`` lines for the ranks' environment (a name a shell accepts): the
    plain one holds no credential, the ``secret`` one (secret.env) may."""

    secret: bool = False

    def check(self, value: Any) -> Any:
        if self.secret:
            return variables.secret_env_mapping(value)
        return variables.env_mapping(value)


@dataclass(frozen=True)
class HostEnvVars(Kind):
    """Each host's own ``NAME: value`` lines, by host name (config/effective.py settles
    them from every chosen host's cpuaccel_env)."""

    def check(self, value: Any) -> Any:
        if not isinstance(value, Mapping):
            raise ValueError(f"must be a mapping of host: {{NAME: value}}, got {value!r}")
        return {str(host): variables.env_mapping(lines) for host, lines in value.items()}


@dataclass(frozen=True)
class Patterns(Kind):
    """Sync's gitignore patterns: a list (or one pattern)."""

    def check(self, value: Any) -> Any:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise ValueError("must be a list of patterns, e.g. [data/, '*.bin']")
        from cpuaccel.projectsync.ignore import (
            pattern_error,  # pathspec: only for a file that has some
        )

        for pattern in value:
            said = pattern_error(pattern)
            if said is not None:
                raise ValueError(f"holds {pattern!r}, not a gitignore pattern ({said})")
        return list(value)


@dataclass(frozen=True)
class MpirunWords(Kind):
    """Extra words for mpirun: a text split as a shell would (or a file's list of
    words), none of them one that cpuaccel sets itself (config/kinds.py)."""

    def check(self, value: Any) -> Any:
        return split(value)

    def parse_text(self, spelling: str, text: Any) -> Any:
        try:
            return split(text)
        except SecretWord as exc:  # the text holds the value: not echoed
            raise UsageError(f"{spelling}: {exc}", hint=exc.hint) from None
        except OwnedWord as exc:
            raise UsageError(
                f"{spelling} {text!r}: {exc}",
                hint=f"leave it out of {spelling}; cpuaccel sets it from {exc.flag}",
            ) from None
        except ValueError as exc:
            raise UsageError(
                f"{spelling} {text!r}: {exc}",
                hint=f"close the quote, e.g. {spelling} '-genv I_MPI_DEBUG 5'",
            ) from None


@dataclass(frozen=True)
class Switch(Kind):
    """On or off: a flag without a value (a file's true/false, yes/no)."""

    def check(self, value: Any) -> Any:
        return variables.boolean(value)

    def show(self, value: Any) -> str:
        return "on" if value else "off"


@dataclass(frozen=True)
class SlurmBlock(Kind):
    """cpuaccel submit's defaults, checked by slurm/batch.check_block: loaded only for a
    project file with a ``slurm:`` block, off the start-up of every other command."""

    def check(self, value: Any) -> Any:
        from cpuaccel.slurm import batch

        return batch.check_block(value)


@dataclass(frozen=True)
class Derived(Kind):
    """Settled from other settings (the chosen hosts): never written anywhere."""

    def check(self, value: Any) -> Any:
        raise ValueError("is settled by cpuaccel, not written")


# ---------------------------------------------------------------- --launcher-args
# ``--launcher-args`` / the project file's ``launcher_args``: extra words for mpirun.
#
# As DeepSpeed's ``--launcher_args``: the text is split as a POSIX shell would
# (``shlex.split``) on the controller, and every word reaches mpirun as one argv word of
# its own (rendered through the one ``quote`` filter), never re-joined into a shell
# string. Words that would replace what cpuaccel decides itself (the hosts, the number of
# ranks, ranks per node) are refused with the cpuaccel flag that sets it, since mpirun
# would take the last of two contradicting values, or refuse them, far from where the
# user typed them.
#
# mpirun's options (hydra's and Open MPI's spellings) for what cpuaccel owns -> the
# cpuaccel spelling.
_HOSTS = "-i INVENTORY (with --limit / --nodes)"
_WORLD = "--nodes and --ppn (ranks = nodes x ppn)"
OWNED: dict[str, str] = {
    "-n": _WORLD,
    "-np": _WORLD,
    "--np": _WORLD,
    "--n": _WORLD,
    "-c": _WORLD,
    "-ppn": "--ppn",
    "-perhost": "--ppn",
    "-npernode": "--ppn",
    "--npernode": "--ppn",
    "-N": "--ppn",
    "--map-by": "--ppn",
    "-f": _HOSTS,
    "-hostfile": _HOSTS,
    "--hostfile": _HOSTS,
    "-machinefile": _HOSTS,
    "--machinefile": _HOSTS,
    "-host": _HOSTS,
    "--host": _HOSTS,
    "-hosts": _HOSTS,
    "-H": _HOSTS,
}


class OwnedWord(ValueError):
    """A word for what cpuaccel decides itself; ``flag`` is the cpuaccel spelling."""

    def __init__(self, word: str, flag: str) -> None:
        super().__init__(f"{word!r} is set by cpuaccel: use {flag} instead")
        self.flag = flag


class SecretWord(ValueError):
    """A credential's value given to mpirun (``-genv API_KEY x``, ``-x API_KEY=x``): it
    would be in launch.sh and the run's records on every node."""

    def __init__(self, name: str) -> None:
        super().__init__(f"{variables.secret_value_problem(name)} (an mpirun -genv/-x value)")
        self.hint = variables.secret_value_hint(name)


# mpirun options that set a variable in the ranks: Intel MPI's and MPICH's take NAME VALUE
# as two words, Open MPI's -x one NAME=VALUE word (a bare NAME passes the controller's).
_ENV_PAIRS = ("-genv", "-env")
_ENV_ASSIGN = ("-x",)


def _secret_set(words: list[str]) -> str | None:
    """The name of a credential ``words`` give a value to, if any."""
    for word, following in itertools.pairwise(words):
        sets = word in _ENV_PAIRS or (word in _ENV_ASSIGN and "=" in following)
        name = following.split("=", 1)[0] if sets else ""
        if name and variables.secret_value_problem(name) is not None:
            return name
    return None


def split(value: Any) -> tuple[str, ...]:
    """The words of a ``--launcher-args`` text (or a project file's list of words);
    ValueError saying what is wrong."""
    if isinstance(value, str):
        try:
            words = shlex.split(value)
        except ValueError as exc:  # "No closing quotation", "No escaped character"
            raise ValueError(f"cannot be split into words as a shell would: {exc}") from None
    elif isinstance(value, list) and all(isinstance(w, str) for w in value):
        words = list(value)
    else:
        raise ValueError(f"must be a string of mpirun options, got {value!r}")
    for word in words:
        owned = OWNED.get(word.split("=", 1)[0])
        if owned is not None:
            raise OwnedWord(word, owned)
    secret = _secret_set(words)
    if secret is not None:
        raise SecretWord(secret)
    return tuple(words)
