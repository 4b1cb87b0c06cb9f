"""Settings given as flags or keywords, checked as the settings table says."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

import click

from cpuaccel.config.kinds import Duration, OneOf, WholeNumber
from cpuaccel.config.settings import Entry
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
