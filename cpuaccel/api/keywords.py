"""Settings given as flags or keywords, checked as the settings table says."""

from __future__ import annotations

import math
import os
import shlex
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import click

from cpuaccel.config.kinds import UNSET_WORD, Duration, OneOf, Switch, WholeNumber
from cpuaccel.config.settings import TABLE, Entry
from cpuaccel.errors import UsageError
from cpuaccel.inventory import variables
from cpuaccel.inventory.variables import env_name_problem
from cpuaccel.rank_settings import CHOICES, value_problem


class Seconds(click.FloatRange):
    """A number of seconds in a range, never NaN or infinite: click's FloatRange lets
    ``nan`` through (no comparison with it is true), and a NaN bound never passes."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        return number


class FlagValues(dict[str, Any]):
    """The flags mapping ``config.effective.resolve`` reads: each setting's value by name
    (None: not given), ``flag_names`` (the spelling each was typed with), and ``env`` and
    ``secret_env`` from --env. ``typed`` holds each given flag's value as click read it,
    before any conversion, for a verb that hands it on (submit)."""

    def __init__(self) -> None:
        super().__init__()
        self.typed: dict[str, Any] = {}


class EnvFlags(dict[str, str]):
    """``--env``'s plain variables; ``secret`` holds those passed by name whose name looks
    like a credential (their values must never be printed)."""

    def __init__(self) -> None:
        super().__init__()
        self.secret: dict[str, str] = {}


def parse_env(items: tuple[str, ...], environ: Mapping[str, str] | None = None) -> EnvFlags:
    """``--env KEY=VALUE`` items (of run, submit, tune and config show) as a mapping;
    ``--env NAME`` passes the controller's value of NAME, as ``mpirun -x NAME`` does,
    through secret.env when NAME looks like a credential's (whose value is never given
    here: ``variables.secret_value_problem``)."""
    here = os.environ if environ is None else environ
    env = EnvFlags()
    for item in items:
        key, sep, value = item.partition("=")
        if env_name_problem(key) is not None:
            raise UsageError(
                f"--env {item!r}: expected KEY=VALUE or NAME, KEY a variable name",
                hint="e.g. --env FI_PROVIDER=tcp, or --env HF_TOKEN (its value here)",
            )
        secret = variables.secret_value_problem(key)
        if sep and secret is not None:  # the value is not shown: it is the secret
            raise UsageError(f"--env {key}=...: {secret}", hint=variables.secret_value_hint(key))
        problem = value_problem(key, value if sep else here.get(key, ""))
        if problem is not None:
            example = CHOICES[key][0][0]
            raise UsageError(f"--env {key}: {problem}", hint=f"e.g. --env {key}={example}")
        if sep:
            env[key] = value
            continue
        if key not in here:
            raise UsageError(
                f"--env {key}: {key} is not set here, so there is no value to pass",
                hint=f"export {key} before running cpuaccel, or write --env {key}=VALUE",
            )
        if secret is not None:
            env.secret[key] = here[key]
            env.pop(key, None)
        else:
            env[key] = here[key]
    return env


def click_type(entry: Entry, verb: str) -> Any:
    """The click type of the entry's kind (None: the text as typed): the one check of a
    flag's and a keyword's value."""
    kind = entry.kind
    if isinstance(kind, WholeNumber):
        return click.IntRange(kind.low, kind.high)
    if isinstance(kind, Duration):
        return Seconds(kind.low, kind.high)
    if isinstance(kind, OneOf):
        worded = entry.flag.per_verb.get(verb) if entry.flag else None
        choices = worded.choices if worded is not None and worded.choices else kind.choices
        return click.Choice(choices, case_sensitive=False)
    return None


def normal_choice(entry: Entry, value: Any) -> Any:
    if isinstance(entry.kind, OneOf):
        return entry.kind.normal(value)
    return str(value).lower()


# ---------------------------------------------------------------- settings as keywords
# ``cpuaccel.launch(..., ppn=2, env={"A": "1"})``: each keyword is a setting of the table
# (config/settings.py), under its name. One that run takes as a flag is checked by that
# flag's own check (the same click type, the same message naming the flag, the same
# fix), and recorded as given by that flag, so that every later message (and `config
# show`'s "where") reads as the CLI's. One that only the inventory sets (``python``,
# ``workdir``, ``backend``...) is given as its variable, as ``-e cpuaccel_python=...``
# would be, and checked where -e's are. ``hosts`` and ``host_env`` (each host's own
# cpuaccel_env) are derived, and ``slurm`` is ``cpuaccel submit``'s: none is a keyword.
# ``inventory`` and ``limit`` are the host keywords' own (api/target.py).
NOT_KEYWORDS = frozenset({"hosts", "host_env", "slurm", "inventory", "limit"})
# Taken as flags though run has none: sync's --exclude, and --nodes MIN:MAX's floor.
_AS_FLAGS = frozenset({"exclude", "min_nodes"})
_RUN_HELP = "see 'cpuaccel run --help'"


def setting_keywords(verb: str) -> list[Entry]:
    """The table's entries a call of ``verb`` takes as keywords."""

    def taken(entry: Entry) -> bool:
        return entry.takes(verb) or bool(entry.variables) or entry.name in _AS_FLAGS

    return [entry for entry in TABLE if entry.name not in NOT_KEYWORDS and taken(entry)]


def no_such(word: str, known: Sequence[str], what: str, listed: Sequence[str]) -> UsageError:
    """The error for an unknown keyword ``word=``: the closest of ``known`` as a
    did-you-mean, then the ``listed`` ones."""
    import difflib

    close = difflib.get_close_matches(word, known, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]}=? " if close else ""
    return UsageError(
        f"{word}=: no such {what}", hint=f"{hint}the {what}s are: {', '.join(listed)}"
    )


def flags_of_keywords(verb: str, given: Mapping[str, Any]) -> tuple[FlagValues, dict[str, Any]]:
    """The flags mapping ``config.effective.resolve`` reads, and the inventory variables
    (as -e sets them), of ``given`` keywords; UsageError for an unknown keyword or a bad
    value, with the CLI's message for the flag."""
    entries = {e.name: e for e in setting_keywords(verb)}
    aliases = keyword_aliases(entries.values())
    unknown = [name for name in given if name not in entries and name not in aliases]
    if unknown:
        raise no_such(unknown[0], [*entries, *aliases], "setting", list(entries))
    given = _canonical(given, aliases)
    flags = FlagValues()
    names: dict[str, str] = {}
    extra: dict[str, Any] = {}
    for entry in entries.values():  # a flag not given is None, as click leaves it
        if entry.takes(verb):
            flags[entry.name] = None
    for name, value in given.items():
        entry = entries[name]
        if value is None:
            continue
        if entry.takes(verb) or name in _AS_FLAGS:
            flags[name], spelling = _flag_value(entry, verb, value)
            names[name] = spelling
        else:
            extra[entry.variables[0]] = value
    if isinstance(flags.get("nodes"), tuple):  # nodes=(MIN, MAX) or "MIN:MAX"
        if flags.get("min_nodes") is not None:
            raise UsageError(
                "nodes=MIN:MAX and min_nodes= together", hint="give the floor once: nodes='2:4'"
            )
        flags["min_nodes"], flags["nodes"] = flags["nodes"]
        names["min_nodes"] = names["nodes"]
    if "env" in flags:
        env = flags["env"] if isinstance(flags["env"], EnvFlags) else EnvFlags()
        flags["env"], flags["secret_env"] = env, env.secret
    flags["flag_names"] = names
    return flags, extra


def keyword_aliases(entries: Iterable[Entry]) -> dict[str, str]:
    """Each other spelling the CLI takes for a setting's flag (``--nproc_per_node``,
    ``--nnodes``, ``--master-port``...), as a keyword (``nproc_per_node``), to the
    setting's name."""
    names = {entry.name for entry in entries}
    aliases: dict[str, str] = {}
    for entry in entries:
        flag = entry.flag
        for spelled in (*flag.decls, *flag.aliases) if flag is not None else ():
            if not spelled.startswith("--"):
                continue
            word = spelled[2:].split("/")[0].replace("-", "_")
            if word.isidentifier() and word not in names:
                aliases.setdefault(word, entry.name)
    return aliases


def _canonical(given: Mapping[str, Any], aliases: Mapping[str, str]) -> dict[str, Any]:
    """``given`` under the settings' own names; one given twice is refused."""
    named: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for word, value in given.items():
        name = aliases.get(word, word)
        if name in named:
            raise UsageError(
                f"{spelled[name]}= and {word}= are the same setting",
                hint=f"give it once, as {name}=",
            )
        named[name], spelled[name] = value, word
    return named


def _flag_value(entry: Entry, verb: str, value: Any) -> tuple[Any, str]:
    """A keyword's value as its flag would have it, and the flag's spelling."""
    flag = entry.flag
    spelling = flag.spelling if flag is not None else f"--{entry.name.replace('_', '-')}"
    if entry.name == "env":
        return parse_env(_env_words(value)), spelling
    if entry.name in ("exclude", "launcher_args") or (flag is not None and flag.multiple):
        words = [value] if isinstance(value, str) else value
        if not isinstance(words, (list, tuple)) or not all(isinstance(w, str) for w in words):
            raise UsageError(
                f"{entry.name}={value!r}: expected a string or a list of strings",
                hint=_RUN_HELP,
            )
        if entry.name == "launcher_args":
            return entry.kind.parse_text(spelling, shlex.join(words)), spelling
        return tuple(words), spelling
    if isinstance(entry.kind, Switch):
        if not isinstance(value, bool):
            raise UsageError(f"{entry.name}={value!r}: expected True or False", hint=_RUN_HELP)
        return value, spelling
    if entry.name == "min_nodes":
        return entry.kind.check(value), "--nodes"
    if entry.name == "nodes" and isinstance(value, (tuple, list)):
        value = ":".join(str(v) for v in value)
    takes_text = flag is not None and (
        flag.takes_text or (not flag.decls and flag.aliases_take_text)
    )
    if takes_text or (isinstance(value, str) and entry.name in ("nodes", "ppn")):
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise UsageError(f"{spelling} {value!r}: expected a number or text", hint=_RUN_HELP)
        parsed = entry.kind.parse_text(spelling, str(value))
        return (None if parsed == UNSET_WORD else parsed), spelling
    kind = click_type(entry, verb)
    if kind is None:
        if not isinstance(value, str):
            raise UsageError(f"{spelling} {value!r}: expected a string", hint=_RUN_HELP)
        return value, spelling
    if isinstance(value, bool) or (isinstance(value, str) and not isinstance(kind, click.Choice)):
        raise UsageError(
            f"Invalid value for '{spelling}': {value!r} is not a {kind.name}", hint=_RUN_HELP
        )
    option = click.Option([spelling], type=kind)
    try:
        converted = kind.convert(value, option, None)
    except click.BadParameter as exc:
        raise UsageError(exc.format_message(), hint=_RUN_HELP) from None
    if isinstance(entry.kind, OneOf):
        converted = normal_choice(entry, converted)
    return converted, spelling


def _env_words(value: Any) -> tuple[str, ...]:
    """env= as --env's words: a mapping's items as KEY=VALUE, a list of KEY=VALUE or NAME."""
    if isinstance(value, Mapping):
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            raise UsageError(
                "env=: expected names and values that are strings", hint="e.g. env={'A': '1'}"
            )
        return tuple(f"{k}={v}" for k, v in value.items())
    if isinstance(value, str) or not all(isinstance(w, str) for w in value):
        raise UsageError(
            "env=: expected a mapping of names to values, or a list of NAME / KEY=VALUE",
            hint="e.g. env={'OMP_NUM_THREADS': '4'}, or env=['HF_TOKEN'] to pass it by name",
        )
    return tuple(value)


def check_switches(**given: object) -> None:
    """Each keyword that must be True or False, checked: UsageError naming the first
    that is not."""
    for name, value in given.items():
        if not isinstance(value, bool):
            raise UsageError(f"{name}={value!r}: expected True or False", hint=f"e.g. {name}=True")
