"""Help a newcomer reads: the shared host options once, run's on two screens, whole
verb summaries."""

from __future__ import annotations

import pytest

from cpuaccel.errors import EXIT_USAGE
from testsupport.command import cpuaccel, inherited_env

ENV = inherited_env(COLUMNS="80")
HOST_ROW = "-i -c -l -e -f -T --no-host-key-checking -u --private-key --list-hosts -v"


@pytest.mark.parametrize("verb", ["check", "provision", "sync", "run", "tune", "stop"])
def test_each_verb_names_the_host_options_in_one_row(verb: str) -> None:
    shown = cpuaccel(verb, "--help", env=ENV)
    assert shown.returncode == 0
    assert f"  {HOST_ROW}\n" in shown.stdout
    assert "`cpuaccel\n" in shown.stdout or "`cpuaccel help hosts`" in shown.stdout
    assert "Ansible inventory (YAML or INI" not in shown.stdout
    assert "--forks" not in shown.stdout and "--key-file" not in shown.stdout


def test_help_hosts_shows_them_in_full_once() -> None:
    shown = cpuaccel("help", "hosts", env=ENV)
    assert shown.returncode == 0, shown.stderr
    for row in (
        "  -i, --inventory FILE ",
        "  -c, --config FILE ",
        "  -l, --limit PATTERN ",
        "  -e, --extra-vars KEY=VALUE ",
        "  -f, --forks INTEGER RANGE ",
        "  -T, --connect-timeout SECONDS ",
        "  --no-host-key-checking ",
        "  -u, --user USER ",
        "  --private-key, --key-file FILE ",
        "  --list-hosts ",
        "  -v, --verbose ",
    ):
        assert shown.stdout.count(row) == 1, row
    assert "-h, --help" not in shown.stdout


def test_help_of_a_verb_is_its_help_and_an_unknown_topic_is_refused() -> None:
    assert cpuaccel("help", "ps", env=ENV).stdout == cpuaccel("ps", "--help", env=ENV).stdout
    bad = cpuaccel("help", "nope", env=ENV)
    assert bad.returncode == EXIT_USAGE
    lines = bad.stderr.splitlines()
    assert lines[0] == "error: cpuaccel help nope: no such topic"
    assert lines[1].startswith("  fix: give hosts, or a verb: config, check, provision")


def test_run_help_fits_on_two_screens() -> None:
    shown = cpuaccel("run", "--help", env=ENV)
    assert shown.returncode == 0
    assert len(shown.stdout.splitlines()) <= 96, len(shown.stdout.splitlines())


def test_verb_summaries_are_whole_sentences() -> None:
    shown = cpuaccel("--help", env=ENV).stdout
    commands = shown.split("Commands:\n")[1].split("\n\n")[0]
    assert "..." not in commands
    summaries = " ".join(commands.split())
    verbs = ("config", "check", "run", "report", "ps", "logs", "fetch", "tune", "bench", "help")
    for verb in verbs:
        assert f" {verb} " in f" {summaries}", verb
    # each summary ends a sentence before the next verb's name
    rows = [line for line in commands.splitlines() if line.startswith("  ") and line[2] != " "]
    assert len(rows) == 15
    ends = commands.replace("\n             ", " ").splitlines()
    assert all(line.rstrip().endswith(".") for line in ends), ends
