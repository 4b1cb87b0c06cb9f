"""The endings of a run are documented from their one home in the code: the tables of
docs/cli.md and docs/api.md are node/endings.py's, and the words, states and exit codes
the supervisor uses are that module's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cpuaccel.cli.run import EPILOG
from cpuaccel.node import endings, supervisor

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"<!-- endings: [^\n]*-->\n(.*?)<!-- /endings -->", re.DOTALL)


@pytest.mark.parametrize("doc", ["docs/cli.md", "docs/api.md"])
def test_the_docs_table_is_the_endings_list(doc: str) -> None:
    found = BLOCK.findall((ROOT / doc).read_text())
    assert found == [endings.markdown()], (
        f"{doc}: the endings table differs from cpuaccel/node/endings.py; paste "
        "`python -c 'from cpuaccel.node.endings import markdown; print(markdown())'`"
    )


def test_the_supervisor_maps_reasons_through_the_list() -> None:
    assert supervisor.STATES is endings.STATES and supervisor.RETRIED is endings.RETRIED
    codes = {e.word: e.exit_code for e in endings.ENDINGS}
    assert (
        codes["interrupted"],
        codes["terminated"],
    ) == (supervisor.EXIT_INTERRUPTED, supervisor.EXIT_TERMINATED)
    assert (codes["timeout"], codes["lost"]) == (supervisor.EXIT_TIMEOUT, supervisor.EXIT_LOST)


def test_the_cli_help_names_every_fixed_exit_code() -> None:
    said = " ".join(EPILOG.split())
    for e in endings.ENDINGS:
        if e.exit_code is not None:
            assert re.search(rf"\b{e.exit_code}\b", said), (e.word, e.exit_code)
