"""The Python API takes the CLI's words: every spelling ``cpuaccel run`` accepts for a
setting is a keyword of ``cpuaccel.launch`` (``nproc_per_node=`` as ``--nproc_per_node``),
an unknown keyword gets a did-you-mean, a list is the script and its arguments (as
subprocess takes it), and an error names the API's keywords (``inventory=``), not the
CLI's flags (``-i``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import cpuaccel
from cpuaccel.api.keywords import flags_of_keywords, setting_keywords
from cpuaccel.api.launching import settle
from cpuaccel.api.target import HostKeywords
from cpuaccel.cli.run import run_command
from cpuaccel.config.settings import RUN, TABLE
from cpuaccel.errors import CpuaccelError, UsageError

SHOWN = "import json, os, sys\nprint(json.dumps(sys.argv[1:]), flush=True)\n"


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project folder with no inventory or project file: the hosts are this machine."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CPUACCEL_INVENTORY", raising=False)
    (tmp_path / "shown.py").write_text(SHOWN)
    return tmp_path


def _cli_spellings() -> dict[str, str]:
    """Each long option `cpuaccel run` takes for a setting (its own, and the hidden
    Accelerate and torchrun spellings), as a keyword, to the setting's name."""
    owner = {
        spelled.split("/")[0]: entry.name
        for entry in TABLE
        if entry.flag is not None
        for spelled in (*entry.flag.decls, *entry.flag.aliases)
    }
    found = {}
    for param in run_command.params:
        for opt in param.opts:
            if opt.startswith("--") and opt in owner:
                found[opt[2:].replace("-", "_")] = owner[opt]
    return found


# A value each spelling of a setting takes, and the setting it settles (ppn, nodes...).
VALUES = {
    "nproc_per_node": ("ppn", 2, 2),
    "nnodes": ("nodes", 1, 1),
    "num_machines": ("nodes", "1", 1),
    "master_addr": ("head", "localhost", "localhost"),
    "main_process_ip": ("head", "localhost", "localhost"),
    "main_process_port": ("master_port", 29613, 29613),
}


def test_every_spelling_the_cli_takes_for_a_setting_is_a_keyword(here: Path) -> None:
    settings = {entry.name for entry in setting_keywords(RUN)}
    spellings = {w: name for w, name in _cli_spellings().items() if name in settings}
    assert set(VALUES) <= set(spellings) and len(spellings) > len(settings) // 2
    for word in spellings:  # each is taken (None: as a flag not given)
        flags_of_keywords(RUN, {word: None})
    for word, (name, value, want) in VALUES.items():
        assert spellings[word] == name, word
        _, settled, _ = settle(HostKeywords(), {word: value})
        assert getattr(settled, name).value == want, word


def test_the_torchrun_spelling_takes_its_words(here: Path) -> None:
    _, settings, _ = settle(HostKeywords(), {"nproc_per_node": "auto"})
    _, default, _ = settle(HostKeywords(), {})
    assert settings.ppn.value == default.ppn.value


def test_an_unknown_keyword_gets_a_did_you_mean(here: Path) -> None:
    with pytest.raises(UsageError) as raised:
        cpuaccel.launch("shown.py", nproc_per_nod=2)
    assert raised.value.message == "nproc_per_nod=: no such setting"
    assert (raised.value.hint or "").startswith("did you mean nproc_per_node=?")


def test_a_setting_given_twice_by_two_spellings_is_refused(here: Path) -> None:
    with pytest.raises(UsageError, match="ppn= and nproc_per_node= are the same setting"):
        cpuaccel.launch("shown.py", ppn=1, nproc_per_node=2)


def test_a_list_is_the_script_and_its_arguments(here: Path) -> None:
    run = cpuaccel.launch(["shown.py", "3", "a b"], nodes=1, ppn=1)
    assert run.wait().ok
    assert [line.text for line in run.logs()] == [json.dumps(["3", "a b"])]
    with pytest.raises(UsageError, match="give the arguments once"):
        cpuaccel.launch(["shown.py", "3"], "4")
    with pytest.raises(UsageError, match=r"script=\[\]: no script"):
        cpuaccel.launch([])
    with pytest.raises(UsageError, match="script=3: expected a path"):
        cpuaccel.launch(3)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("keywords", "named"),
    [
        ({"inventory": "nosuch.yaml"}, "inventory='FILE'"),
        ({"inventory": "."}, "inventory='PATH'"),
        ({"user": "a b"}, "user='ubuntu'"),
        ({"private_key": "/no/such/key"}, "private_key='/no/such/key'"),
    ],
)
def test_an_error_names_the_keywords_not_the_flags(
    here: Path, keywords: dict[str, str], named: str
) -> None:
    with pytest.raises(CpuaccelError) as raised:
        cpuaccel.launch("shown.py", **keywords)
    said = str(raised.value)
    assert named in said, said
    for flag in (" -i ", "-u/--user", "--private-key", " -u "):
        assert flag not in f" {said} ", said


def test_a_config_file_given_as_the_script_names_the_keywords(here: Path) -> None:
    (here / "hosts.yaml").write_text("all: {}\n")
    with pytest.raises(UsageError) as raised:
        cpuaccel.launch("hosts.yaml")
    assert raised.value.hint == (
        "an inventory goes in inventory='hosts.yaml', a cpuaccel.yaml or Accelerate "
        "config in config='hosts.yaml'"
    )


@pytest.mark.parametrize(
    ("call", "word", "meant"),
    [
        (lambda: cpuaccel.check(limt="node1"), "limt", "limit"),
        (lambda: cpuaccel.sync(privat_key="k"), "privat_key", "private_key"),
        (lambda: cpuaccel.provision(become_usr="root"), "become_usr", "become_user"),
        (lambda: cpuaccel.sync(exlude="*.log"), "exlude", "exclude"),
    ],
)
def test_a_misspelt_keyword_of_check_sync_or_provision_gets_a_did_you_mean(
    here: Path, call: Any, word: str, meant: str
) -> None:
    """The host keywords are one set (HostOptions) that every call takes beside its own;
    a word that is neither is refused before anything is read or contacted."""
    with pytest.raises(UsageError) as raised:
        call()
    assert raised.value.message == f"{word}=: no such keyword"
    assert raised.value.hint is not None
    assert raised.value.hint.startswith(f"did you mean {meant}=? the keywords are: inventory, ")
