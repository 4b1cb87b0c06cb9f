"""The settings table (config/settings.py) is the one declaration of each run setting:
the options of run, submit, tune and config show, the project file's keys and checks,
LaunchSettings' fields, config show's rows and docs/run.md's table all follow it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from cpuaccel.cli.config import show_command
from cpuaccel.cli.main import cli
from cpuaccel.cli.options import EPILOG, setting_options
from cpuaccel.cli.run import run_command
from cpuaccel.cli.submit import submit_command
from cpuaccel.cli.tune import REFUSED, tune_command
from cpuaccel.config import project, settings_doc
from cpuaccel.config.settings import (
    ALIAS_VERBS,
    RUN,
    SHOW,
    SUBMIT,
    TABLE,
    TUNE,
    LaunchSettings,
    for_verb,
)

ROOT = Path(__file__).resolve().parents[3]
COMMANDS = {RUN: run_command, SUBMIT: submit_command, TUNE: tune_command, SHOW: show_command}


def test_docs_run_md_holds_the_table_the_settings_give() -> None:
    text = (ROOT / "docs" / "run.md").read_text()
    assert settings_doc.BEGIN in text and settings_doc.END in text
    assert text == settings_doc.replaced(text), (
        "docs/run.md's settings table differs from cpuaccel/config/settings.py's TABLE; "
        f"rewrite it with: {settings_doc.COMMAND}"
    )


def test_launch_settings_has_a_field_for_each_entry_and_no_other() -> None:
    fields = [f.name for f in dataclasses.fields(LaunchSettings) if f.name != "chosen"]
    entries = [entry.name for entry in TABLE if entry.field]
    assert sorted(fields) == sorted(entries)
    built = LaunchSettings()
    for entry in TABLE:
        if entry.field:
            assert getattr(built, entry.name) == entry.default_setting(), entry.name


def test_names_keys_and_spellings_are_each_declared_once() -> None:
    names = [entry.name for entry in TABLE]
    keys = [entry.key for entry in TABLE if entry.key]
    spellings = [
        spelling
        for entry in TABLE
        if entry.flag
        for decl in entry.flag.decls
        for spelling in (*decl.split("/"), *entry.flag.aliases)
    ]
    for listed in (names, keys, spellings):
        assert len(listed) == len(set(listed)), listed


def test_the_project_files_keys_and_checks_are_the_tables() -> None:
    keyed = {entry.key: entry for entry in TABLE if entry.key}
    assert list(project.KEYS) == list(keyed) == list(project.CHECKS)
    for key, entry in keyed.items():
        assert project.KEYS[key] == entry.help
        assert project.CHECKS[key] == entry.kind.check


def _declared(command: click.Command) -> tuple[list[tuple[str, ...]], set[str]]:
    shown = [
        tuple(p.opts + p.secondary_opts) for p in command.params if isinstance(p, click.Option)
    ]
    hidden = {o for p in command.params if isinstance(p, click.Option) and p.hidden for o in p.opts}
    return shown, hidden


@pytest.mark.parametrize("verb", [RUN, SUBMIT, TUNE, SHOW])
def test_each_verb_takes_the_options_the_table_gives_it(verb: str) -> None:
    shown, hidden = _declared(COMMANDS[verb])
    options = {opt for opts in shown for opt in opts}
    for entry in for_verb(verb):
        assert entry.flag is not None
        for decl in entry.flag.decls:
            assert set(decl.split("/")) <= options, (verb, decl)
        aliases = set(entry.flag.aliases)
        assert aliases <= hidden if verb in ALIAS_VERBS else not aliases & options, verb
    # and none of the others (submit's --nodes and --ppn are Slurm's request, its own)
    for entry in TABLE:
        own = verb == SUBMIT and entry.name in ("nodes", "ppn")
        if not entry.takes(verb) and entry.flag is not None and not own:
            for decl in entry.flag.decls:
                assert not set(decl.split("/")) & options, (verb, decl)


def test_help_is_the_tables_wording_for_each_verb() -> None:
    for verb, command in COMMANDS.items():
        params = {o: p for p in command.params if isinstance(p, click.Option) for o in p.opts}
        for entry in for_verb(verb):
            if entry.flag is None or not entry.flag.decls:
                continue
            param = params[entry.flag.decls[0].split("/")[0]]
            worded = entry.flag.per_verb.get(verb)
            expected = worded.help if worded else entry.flag.help
            assert param.help is not None and param.help.startswith(expected), (verb, entry.name)
            assert param.hidden == (verb == TUNE and entry.name in REFUSED)


def test_run_takes_its_settings_as_one_mapping() -> None:
    """run_command: the flags mapping, the host options' target, and what is not a
    setting (the script, --dry-run, --json, --detach, --dashboard)."""
    assert run_command.callback is not None
    wrapped = run_command.callback
    while hasattr(wrapped, "__wrapped__"):
        wrapped = wrapped.__wrapped__
    assert list(wrapped.__code__.co_varnames[: wrapped.__code__.co_argcount]) == [
        "target", "flags", "dry_run", "as_json", "detach", "dashboard", "script", "script_args",
    ]  # fmt: skip


def test_the_aliases_epilog_names_every_alias_line() -> None:
    for entry in TABLE:
        if entry.flag is not None and entry.flag.aliases:
            assert entry.flag.aliases_help is not None, entry.name
            assert entry.flag.aliases_help[0] in EPILOG
    assert run_command.epilog is not None and EPILOG in run_command.epilog
    assert show_command.epilog == EPILOG


def test_config_show_prints_the_tables_shown_settings_in_its_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # no Accelerate config of this machine's
    monkeypatch.delenv("CPUACCEL_INVENTORY", raising=False)
    args = ["config", "show", "--json", "-i", "localhost,", "-l", "localhost"]
    done = CliRunner().invoke(cli, args)
    assert done.exit_code == 0, done.output
    rows = list(json.loads(done.stdout))
    shown = [e.name for e in TABLE if e.shown]
    assert rows == ["config", *shown]
    assert list(LaunchSettings().shown()) == [e.name for e in TABLE if e.shown and e.field]


def test_submit_names_each_option_it_hands_on() -> None:
    epilog = " ".join((submit_command.epilog or "").split())
    for entry in for_verb(SUBMIT):
        assert entry.flag is not None
        assert f"{entry.flag.decls[0]}," in epilog or f"{entry.flag.decls[0]} (" in epilog


def test_a_verb_the_table_does_not_know_declares_nothing() -> None:
    @setting_options("nothing")
    def command(flags: dict[str, Any]) -> None:  # pragma: no cover - never invoked
        pass

    assert not getattr(command, "__click_params__", [])
